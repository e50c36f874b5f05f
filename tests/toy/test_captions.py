"""Captions: GenEval templates, specs and the caption parser."""

from __future__ import annotations

import pytest

from genalign.toy.captions import (
    CaptionParseError,
    caption_for_spec,
    color_attr_spec,
    colors_spec,
    counting_spec,
    parse_caption,
    position_spec,
    single_object_spec,
    two_object_spec,
    validate_spec,
)
from genalign.toy.prompts import all_prompts


def test_templates_match_geneval():
    assert single_object_spec("circle")["prompt"] == "a photo of a circle"
    assert two_object_spec("circle", "triangle")["prompt"] == "a photo of a circle and a triangle"
    assert counting_spec("square", 3)["prompt"] == "a photo of three squares"
    assert colors_spec("orange", "circle")["prompt"] == "a photo of an orange circle"
    assert position_spec("circle", "left of", "square")["prompt"] == "a photo of a circle left of a square"
    spec = color_attr_spec("red", "circle", "blue", "square")
    assert spec["prompt"] == "a photo of a red circle and a blue square"


def test_specs_use_geneval_metadata_format():
    assert counting_spec("square", 3) == {
        "tag": "counting",
        "include": [{"class": "square", "count": 3}],
        "exclude": [{"class": "square", "count": 4}],
        "prompt": "a photo of three squares",
    }
    # "A left of B": B is listed first and A's clause points at it
    assert position_spec("circle", "left of", "square")["include"] == [
        {"class": "square", "count": 1},
        {"class": "circle", "count": 1, "position": ["left of", 0]},
    ]


def test_parser_inverts_every_caption_of_the_grammar():
    for prompt in all_prompts():
        assert parse_caption(prompt.caption) == prompt.spec
        assert caption_for_spec(prompt.spec) == prompt.caption


@pytest.mark.parametrize(
    ("caption", "tag", "include"),
    [
        ("A Red Circle.", "colors", [{"class": "circle", "count": 1, "color": "red"}]),
        ("3 squares", "counting", [{"class": "square", "count": 3}]),
        ("an image of a diamond", "single_object", [{"class": "diamond", "count": 1}]),
        (
            "a triangle to the right of a blue circle",
            "position",
            [
                {"class": "circle", "count": 1, "color": "blue"},
                {"class": "triangle", "count": 1, "position": ["right of", 0]},
            ],
        ),
        (
            "a red circle and a square",
            "color_attr",
            [{"class": "circle", "count": 1, "color": "red"}, {"class": "square", "count": 1}],
        ),
    ],
)
def test_parser_variants(caption, tag, include):
    spec = parse_caption(caption)
    assert spec["tag"] == tag and spec["include"] == include and spec["prompt"] == caption


def test_counting_with_colour_excludes_that_colour():
    spec = parse_caption("two green triangles")
    assert spec["exclude"] == [{"class": "triangle", "color": "green", "count": 3}]


@pytest.mark.parametrize(
    "caption",
    [
        "a photo of a cat",
        "a pink circle",
        "a circle near a square",
        "circle",
        "zero circles",
        "a big red circle",
        "",
    ],
)
def test_parser_rejects_text_outside_the_grammar(caption):
    with pytest.raises(CaptionParseError):
        parse_caption(caption)


def test_validate_spec_names_the_problem():
    with pytest.raises(ValueError, match="unknown shape"):
        validate_spec({"tag": "single_object", "include": [{"class": "cat", "count": 1}]})
    with pytest.raises(ValueError, match="tag"):
        validate_spec({"tag": "size", "include": [{"class": "circle", "count": 1}]})
    with pytest.raises(ValueError, match="before it"):
        validate_spec(
            {"tag": "position", "include": [{"class": "circle", "count": 1, "position": ["above", 0]}]}
        )
