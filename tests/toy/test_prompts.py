"""Prompt sets: the train / held-out split, scenes sampled for prompts, JSONL files."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from genalign.toy.captions import CATEGORIES
from genalign.toy.prompts import (
    HELDOUT_COLOUR_SHAPES,
    HELDOUT_COUNTS,
    HELDOUT_RELATIONS,
    PromptSpec,
    all_prompts,
    export_prompt_sets,
    heldout_prompts,
    read_jsonl,
    sample_scene_for_prompt,
    scene_for_spec,
    train_prompts,
    write_jsonl,
)
from genalign.toy.scenes import render_scene
from genalign.toy.shapes_eval import check_spec


def test_split_is_a_partition_and_deterministic():
    train, heldout = train_prompts(), heldout_prompts()
    captions = [p.caption for p in all_prompts()]
    assert len(captions) == len(set(captions)) == 608
    assert not {p.caption for p in train} & {p.caption for p in heldout}
    assert sorted(p.caption for p in train + heldout) == sorted(captions)
    assert [p.caption for p in train_prompts()] == [p.caption for p in train]
    assert set(Counter(p.category for p in train)) == set(CATEGORIES)
    assert set(Counter(p.category for p in heldout)) == set(CATEGORIES) - {"single_object"}


def test_heldout_combinations_never_appear_in_train():
    for prompt in train_prompts():
        include = prompt.spec["include"]
        for clause in include:
            assert (clause.get("color"), clause["class"]) not in HELDOUT_COLOUR_SHAPES
        if prompt.category == "counting":
            assert (include[0]["class"], include[0]["count"]) not in HELDOUT_COUNTS
        if prompt.category == "position":
            target, subject = include
            triple = (subject["class"], subject["position"][0], target["class"])
            assert triple not in HELDOUT_RELATIONS
        if prompt.category == "two_object":
            assert {c["class"] for c in include} != {"triangle", "diamond"}
    # a colour-attribution combination is held out in both word orders
    heldout = {p.caption for p in heldout_prompts()}
    for prompt in heldout_prompts():
        if prompt.category == "color_attr":
            first, second = prompt.caption.removeprefix("a photo of ").split(" and ")
            assert f"a photo of {second} and {first}" in heldout


def test_captions_match_their_scenes():
    """The ground-truth objects of every sampled scene satisfy the spec of its caption."""
    rng = np.random.default_rng(0)
    for category in CATEGORIES:
        for split in ("train", "heldout", "all"):
            if split == "heldout" and category == "single_object":
                continue
            for _ in range(60):
                scene, caption, spec = sample_scene_for_prompt(category, rng, split=split)
                assert spec["tag"] == category and spec["prompt"] == caption
                check = check_spec(scene.objects, spec)
                assert check.correct, (caption, scene, check.reasons)
                assert len(scene) == sum(c["count"] for c in spec["include"])  # nothing else


def test_train_sampling_never_returns_heldout_captions():
    heldout = {p.caption for p in heldout_prompts()}
    rng = np.random.default_rng(1)
    for category in CATEGORIES:
        for _ in range(40):
            assert sample_scene_for_prompt(category, rng)[1] not in heldout
    with pytest.raises(ValueError, match="single_object"):
        sample_scene_for_prompt("single_object", rng, split="heldout")


def test_scene_sampling_is_seeded():
    a = sample_scene_for_prompt("color_attr", 5)
    b = sample_scene_for_prompt("color_attr", np.random.default_rng(5))
    assert a == b
    prompt = train_prompts()[100]
    assert scene_for_spec(prompt, 3) == scene_for_spec(prompt.spec, 3)
    assert render_scene(scene_for_spec(prompt, 3)).equal(render_scene(scene_for_spec(prompt, 3)))


def test_jsonl_round_trip(tmp_path):
    prompts = heldout_prompts()
    path = write_jsonl(prompts, tmp_path / "heldout.jsonl")
    assert read_jsonl(path) == prompts
    paths = export_prompt_sets(tmp_path / "sets")
    assert read_jsonl(paths["train"]) == train_prompts()
    assert paths["train_captions"].read_text().splitlines() == [p.caption for p in train_prompts()]
    assert PromptSpec.from_spec(prompts[0].spec) == prompts[0]
