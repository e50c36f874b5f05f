"""Captions of the toy world in GenEval's six categories, their specs, and a caption parser.

GenEval (Ghosh et al. 2023, "GenEval: An Object-Focused Framework for Evaluating Text-to-Image
Alignment", ``prompts/create_prompts.py``) writes every prompt from a template and stores beside
it the *spec* its evaluator checks. We use the same categories, templates and spec format, with
the toy world's shapes and colours in place of COCO classes:

================  ==========================================  ===================================
category (tag)    caption                                     spec ``include`` / ``exclude``
================  ==========================================  ===================================
single_object     a photo of a circle                         circle x1
two_object        a photo of a circle and a triangle          circle x1, triangle x1
counting          a photo of three squares                    square x3; exclude square x4
colors            a photo of a blue circle                    circle x1 blue
position          a photo of a circle left of a square        square x1, circle x1 left of #0
color_attr        a photo of a red circle and a blue square   circle x1 red, square x1 blue
================  ==========================================  ===================================

A spec is a JSON-ready dict in GenEval's ``evaluation_metadata.jsonl`` format (hence the US
spelling of its keys)::

    {"tag": "position", "prompt": "a photo of a circle left of a square",
     "include": [{"class": "square", "count": 1},
                 {"class": "circle", "count": 1, "position": ["left of", 0]}]}

``include`` clauses must all hold: at least ``count`` objects of ``class`` (of ``color`` if
given; ``position = [relation, i]`` relates them to the objects matched by clause ``i``).
``exclude`` clauses fail the image when ``count`` or more such objects are present (counting
uses ``n + 1``, making the count exact). :func:`parse_caption` reads any caption of this grammar
(and a few natural variants) back into its spec, so a reward can score plain prompts.
"""

from __future__ import annotations

import abc
import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from genalign.toy.scenes import COLOURS, RELATIONS, SHAPES

CATEGORIES: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
NUMBERS: tuple[str, ...] = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
)
COUNTS: tuple[int, ...] = (2, 3, 4)  # GenEval's counting prompts ask for 2-4 objects
PREFIX = "a photo of "

Spec = dict[str, Any]


class CaptionParseError(ValueError):
    """The caption is not in the toy-world grammar."""


# -- writing ------------------------------------------------------------------------------------


def with_article(phrase: str) -> str:
    """``"orange circle"`` -> ``"an orange circle"``."""
    return f"an {phrase}" if phrase[0] in "aeiou" else f"a {phrase}"


def plural(shape: str) -> str:
    return f"{shape}es" if shape.endswith("s") else f"{shape}s"


def _noun_phrase(clause: dict[str, Any]) -> str:
    words = " ".join(w for w in (clause.get("color"), clause["class"]) if w)
    if clause["count"] == 1:
        return with_article(words)
    colour = f"{clause['color']} " if clause.get("color") else ""
    return f"{NUMBERS[clause['count']]} {colour}{plural(clause['class'])}"


def positioned_clause(spec: Spec) -> tuple[dict[str, Any], str, dict[str, Any]] | None:
    """``(subject, relation, target)``: the spec's first clause with a ``position``, its relation
    and the clause it is placed against; None when no clause is positioned."""
    include = spec["include"]
    for clause in include:
        if "position" in clause:
            relation, target = clause["position"]
            return clause, relation, include[target]
    return None


def caption_for_spec(spec: Spec) -> str:
    """The GenEval-template caption of a spec (``"a photo of ..."``)."""
    positioned = positioned_clause(spec)
    if positioned:
        subject, relation, target = positioned
        return f"{PREFIX}{_noun_phrase(subject)} {relation} {_noun_phrase(target)}"
    return PREFIX + " and ".join(_noun_phrase(c) for c in spec["include"])


def make_spec(tag: str, include: Sequence[dict[str, Any]], exclude: Sequence[dict[str, Any]] = ()) -> Spec:
    """Assemble and validate a spec; its ``prompt`` is written by :func:`caption_for_spec`."""
    spec: Spec = {"tag": tag, "include": [dict(c) for c in include]}
    if exclude:
        spec["exclude"] = [dict(c) for c in exclude]
    spec["prompt"] = caption_for_spec(spec)
    validate_spec(spec)
    return spec


def single_object_spec(shape: str) -> Spec:
    return make_spec("single_object", [{"class": shape, "count": 1}])


def two_object_spec(shape_a: str, shape_b: str) -> Spec:
    return make_spec("two_object", [{"class": shape_a, "count": 1}, {"class": shape_b, "count": 1}])


def counting_spec(shape: str, count: int) -> Spec:
    return make_spec("counting", [{"class": shape, "count": count}], [{"class": shape, "count": count + 1}])


def colors_spec(colour: str, shape: str) -> Spec:
    return make_spec("colors", [{"class": shape, "count": 1, "color": colour}])


def position_spec(shape_a: str, relation: str, shape_b: str) -> Spec:
    """ "A <relation> B": GenEval lists B first and points A's clause at it."""
    return make_spec(
        "position",
        [{"class": shape_b, "count": 1}, {"class": shape_a, "count": 1, "position": [relation, 0]}],
    )


def color_attr_spec(colour_a: str, shape_a: str, colour_b: str, shape_b: str) -> Spec:
    return make_spec(
        "color_attr",
        [
            {"class": shape_a, "count": 1, "color": colour_a},
            {"class": shape_b, "count": 1, "color": colour_b},
        ],
    )


def validate_spec(spec: Spec) -> None:
    """Raise ``ValueError`` naming the problem when a spec uses unknown words or bad indices."""
    if spec.get("tag") not in CATEGORIES:
        raise ValueError(f"spec tag must be one of {CATEGORIES}, got {spec.get('tag')!r}")
    include = spec.get("include")
    if not include:
        raise ValueError(f"spec {spec.get('prompt')!r} has no include clauses")
    for index, clause in enumerate([*include, *spec.get("exclude", [])]):
        if clause.get("class") not in SHAPES:
            raise ValueError(f"clause {clause} names unknown shape {clause.get('class')!r}; shapes: {SHAPES}")
        if not isinstance(clause.get("count"), int) or clause["count"] < 1:
            raise ValueError(f"clause {clause} needs a positive integer count")
        if clause.get("color") is not None and clause["color"] not in COLOURS:
            raise ValueError(f"clause {clause} names unknown colour {clause['color']!r}; colours: {COLOURS}")
        if "position" in clause:
            relation, target = clause["position"]
            if relation not in RELATIONS:
                raise ValueError(f"clause {clause} has unknown relation {relation!r}; relations: {RELATIONS}")
            if not (isinstance(target, int) and 0 <= target < min(index, len(include))):
                raise ValueError(f"clause {clause} points at clause {target}, which must come before it")


def validate_selection(
    split: str, splits: Sequence[str], category: str | None, categories: Sequence[str]
) -> None:
    """Raise ``ValueError`` unless ``split`` is one of ``splits`` and ``category`` (None: every
    category) one of ``categories``: a prompt selection's arguments, in either toy world."""
    if split not in splits:
        raise ValueError(f"split must be one of {splits}, got {split!r}")
    if category is not None and category not in categories:
        raise ValueError(f"category must be one of {categories}, got {category!r}")


_Captioned = TypeVar("_Captioned", bound="CaptionedSpec")


@dataclass(frozen=True)
class CaptionedSpec(abc.ABC):
    """A caption, its category and the spec a verifier checks: the common form of
    :class:`~genalign.toy.prompts.PromptSpec` (images) and
    :class:`~genalign.toy.video.prompts.VideoPromptSpec` (videos), which name the validator of their
    grammar (:meth:`validate`)."""

    caption: str
    category: str
    spec: Spec

    @staticmethod
    @abc.abstractmethod
    def validate(spec: Spec) -> None:
        """Raise if ``spec`` is outside this grammar (each subclass names its validator)."""

    @classmethod
    def from_spec(cls: type[_Captioned], spec: Spec) -> _Captioned:
        cls.validate(spec)
        return cls(caption=spec["prompt"], category=spec["tag"], spec=spec)

    def deep_copy(self: _Captioned) -> _Captioned:
        """A copy whose spec can be changed without touching this one's."""
        return type(self)(self.caption, self.category, copy.deepcopy(self.spec))


# -- parsing ------------------------------------------------------------------------------------

_PREFIXES = ("a photo of ", "an image of ", "a picture of ", "a drawing of ")
_RELATION_WORDS = {
    "to the left of": "left of",
    "to the right of": "right of",
    "left of": "left of",
    "right of": "right of",
    "above": "above",
    "below": "below",
}
_RELATION_PATTERN = re.compile(
    r"^(?P<a>.+?) (?P<rel>" + "|".join(sorted(_RELATION_WORDS, key=len, reverse=True)) + r") (?P<b>.+)$"
)
_PLURALS = {plural(shape): shape for shape in SHAPES}


def _parse_noun_phrase(text: str, caption: str) -> dict[str, Any]:
    """``"a red circle"`` / ``"three squares"`` / ``"2 blue diamonds"`` -> an include clause."""
    words = text.split()
    if not words:
        raise CaptionParseError(f"empty noun phrase in {caption!r}")
    head, rest = words[0], words[1:]
    if head in ("a", "an", "one"):
        count = 1
    elif head in NUMBERS:
        count = NUMBERS.index(head)
    elif head.isdigit():
        count = int(head)
    else:
        raise CaptionParseError(f"expected an article or a number before {text!r} in {caption!r}")
    if count < 1:
        raise CaptionParseError(f"count must be at least one in {caption!r}")
    colour = None
    if len(rest) == 2 and rest[0] in COLOURS:
        colour, rest = rest[0], rest[1:]
    if len(rest) != 1:
        raise CaptionParseError(f"cannot read {text!r} in {caption!r} as '[colour] shape'")
    noun = rest[0]
    shape = noun if noun in SHAPES else _PLURALS.get(noun)
    if shape is None:
        raise CaptionParseError(f"unknown shape {noun!r} in {caption!r}; shapes: {SHAPES}")
    clause: dict[str, Any] = {"class": shape, "count": count}
    if colour is not None:
        clause["color"] = colour
    return clause


def parse_caption(caption: str) -> Spec:
    """Read a toy-world caption into its GenEval spec (the inverse of :func:`caption_for_spec`).

    Accepts the GenEval templates with or without the ``"a photo of"`` prefix, any case, a
    trailing period, digits for counts, and "to the left of" for "left of". The tag is inferred:
    a relation makes ``position``; a single numbered plural ``counting``; one coloured object
    ``colors``; one plain object ``single_object``; several objects ``color_attr`` when any has a
    colour, else ``two_object``. Raises :class:`CaptionParseError` on anything else.
    """
    text = " ".join(caption.lower().strip().rstrip(".").split())
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    match = _RELATION_PATTERN.match(text)
    if match:
        target = _parse_noun_phrase(match["b"], caption)
        subject = _parse_noun_phrase(match["a"], caption)
        subject["position"] = [_RELATION_WORDS[match["rel"]], 0]
        include, tag = [target, subject], "position"
    else:
        include = [_parse_noun_phrase(part, caption) for part in text.split(" and ")]
        if len(include) == 1:
            clause = include[0]
            tag = "counting" if clause["count"] > 1 else "colors" if "color" in clause else "single_object"
        else:
            tag = "color_attr" if any("color" in c for c in include) else "two_object"
    # a numbered plural means exactly that many (GenEval's counting rule)
    exclude = [
        {key: value for key, value in c.items() if key in ("class", "color")} | {"count": c["count"] + 1}
        for c in include
        if c["count"] > 1
    ]
    spec: Spec = {"tag": tag, "include": include}
    if exclude:
        spec["exclude"] = exclude
    spec["prompt"] = caption
    try:
        validate_spec(spec)
    except ValueError as error:
        raise CaptionParseError(str(error)) from error
    return spec
