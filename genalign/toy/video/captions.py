"""Captions of the toy video world, their specs, and a caption parser.

Four categories, each object an (optional) colour, a shape and a motion phrase
(:data:`MOTION_PHRASES`: "moving left", "moving right", "rising", "falling", "standing still"):

===============  ==========================================================  =====================
category (tag)   caption                                                     what moves
===============  ==========================================================  =====================
single_motion    a red circle moving right                                   the object (or
                                                                             "standing still")
one_moving       a red circle moving right and a blue square standing still  the first object only
relation_motion  a blue square above a green triangle, falling               the first-named object
                                                                             (the subject)
motion_binding   a red circle moving left and a blue square rising           both, in different
                                                                             directions
===============  ==========================================================  =====================

A spec is the image world's GenEval-style dict (``genalign.toy.captions``) with a ``motion`` key
on the clauses whose motion the caption states::

    {"tag": "relation_motion", "prompt": "a blue square above a green triangle, falling",
     "include": [{"class": "triangle", "count": 1, "color": "green"},
                 {"class": "square", "count": 1, "color": "blue",
                  "position": ["above", 0], "motion": "down"}]}

In ``relation_motion`` the trailing motion belongs to the subject (the clause with the
position, named first); the caption says nothing of the target's motion, so its clause has none
and any motion of it passes (the sampler draws it static). Video specs have no ``exclude``
clauses and every count is 1. :func:`parse_video_caption` reads any caption of this grammar (and
"moving up" / "moving down" / "static" / "still" for the motion phrases, a trailing period, any
case) back into its spec.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from genalign.toy.captions import CaptionParseError, Spec, positioned_clause, with_article
from genalign.toy.scenes import COLOURS, RELATIONS, SHAPES
from genalign.toy.video.scenes import DIRECTIONS, MOTIONS

VIDEO_CATEGORIES: tuple[str, ...] = ("single_motion", "one_moving", "relation_motion", "motion_binding")
MOTION_PHRASES: dict[str, str] = {
    "static": "standing still",
    "left": "moving left",
    "right": "moving right",
    "up": "rising",
    "down": "falling",
}
# phrases the parser also accepts
_MOTION_WORDS: dict[str, str] = {phrase: motion for motion, phrase in MOTION_PHRASES.items()} | {
    "moving up": "up",
    "moving down": "down",
    "static": "static",
    "still": "static",
    "not moving": "static",
}
_RELATION_WORDS = {"to the left of": "left of", "to the right of": "right of"} | {r: r for r in RELATIONS}


# -- writing ------------------------------------------------------------------------------------


def _noun_phrase(clause: dict[str, Any]) -> str:
    return with_article(" ".join(w for w in (clause.get("color"), clause["class"]) if w))


def _with_motion(clause: dict[str, Any]) -> str:
    phrase = _noun_phrase(clause)
    return f"{phrase} {MOTION_PHRASES[clause['motion']]}" if "motion" in clause else phrase


def video_caption_for_spec(spec: Spec) -> str:
    """The template caption of a video spec (module docstring)."""
    positioned = positioned_clause(spec)
    if positioned:
        subject, relation, target = positioned
        text = f"{_noun_phrase(subject)} {relation} {_noun_phrase(target)}"
        return f"{text}, {MOTION_PHRASES[subject['motion']]}" if "motion" in subject else text
    return " and ".join(_with_motion(c) for c in spec["include"])


def _clause(colour: str, shape: str, motion: str | None = None) -> dict[str, Any]:
    clause: dict[str, Any] = {"class": shape, "count": 1, "color": colour}
    if motion is not None:
        clause["motion"] = motion
    return clause


def make_video_spec(tag: str, include: Sequence[dict[str, Any]]) -> Spec:
    """Assemble and validate a video spec; its ``prompt`` is :func:`video_caption_for_spec`'s."""
    spec: Spec = {"tag": tag, "include": [dict(c) for c in include]}
    spec["prompt"] = video_caption_for_spec(spec)
    validate_video_spec(spec)
    return spec


def single_motion_spec(colour: str, shape: str, motion: str) -> Spec:
    return make_video_spec("single_motion", [_clause(colour, shape, motion)])


def one_moving_spec(colour_a: str, shape_a: str, direction: str, colour_b: str, shape_b: str) -> Spec:
    """``a <colour_a> <shape_a> <direction> and a <colour_b> <shape_b> standing still``."""
    return make_video_spec(
        "one_moving", [_clause(colour_a, shape_a, direction), _clause(colour_b, shape_b, "static")]
    )


def relation_motion_spec(
    colour_a: str, shape_a: str, relation: str, colour_b: str, shape_b: str, direction: str
) -> Spec:
    """``a <colour_a> <shape_a> <relation> a <colour_b> <shape_b>, <direction>``: A moves."""
    subject = _clause(colour_a, shape_a, direction) | {"position": [relation, 0]}
    return make_video_spec("relation_motion", [_clause(colour_b, shape_b), subject])


def motion_binding_spec(
    colour_a: str, shape_a: str, direction_a: str, colour_b: str, shape_b: str, direction_b: str
) -> Spec:
    return make_video_spec(
        "motion_binding", [_clause(colour_a, shape_a, direction_a), _clause(colour_b, shape_b, direction_b)]
    )


# -- validation ---------------------------------------------------------------------------------


def _check_clause(clause: Any, index: int, prompt: Any) -> None:
    if not isinstance(clause, dict):
        raise ValueError(f"spec {prompt!r}: clause {index} is not a dict: {clause!r}")
    if clause.get("class") not in SHAPES:
        raise ValueError(f"clause {clause} names unknown shape {clause.get('class')!r}; shapes: {SHAPES}")
    if clause.get("count") != 1:
        raise ValueError(f"clause {clause} has count {clause.get('count')!r}; video clauses count 1")
    if clause.get("color") is not None and clause["color"] not in COLOURS:
        raise ValueError(f"clause {clause} names unknown colour {clause['color']!r}; colours: {COLOURS}")
    if "motion" in clause and clause["motion"] not in MOTIONS:
        raise ValueError(f"clause {clause} has unknown motion {clause['motion']!r}; motions: {MOTIONS}")
    if "position" in clause:
        position = clause["position"]
        if not (isinstance(position, (list, tuple)) and len(position) == 2):
            raise ValueError(f"clause {clause} needs position = [relation, clause index], got {position!r}")
        relation, target = position
        if relation not in RELATIONS:
            raise ValueError(f"clause {clause} has unknown relation {relation!r}; relations: {RELATIONS}")
        if not (isinstance(target, int) and 0 <= target < index):
            raise ValueError(f"clause {clause} points at clause {target!r}, which must come before it")
    unknown = set(clause) - {"class", "count", "color", "motion", "position"}
    if unknown:
        raise ValueError(f"clause {clause} has unknown keys {sorted(unknown)}")


def _category_error(spec: Spec) -> str | None:
    """What breaks the spec's category's form, or None."""
    tag, include = spec["tag"], spec["include"]
    motions = [c.get("motion") for c in include]
    positioned = ["position" in c for c in include]
    if tag == "single_motion":
        return None if len(include) == 1 and motions[0] is not None else "needs one clause with a motion"
    if len(include) != 2:
        return f"needs two clauses, got {len(include)}"
    if tag == "relation_motion":
        ok = positioned == [False, True] and motions[0] is None and motions[1] in DIRECTIONS
        return None if ok else "needs a target clause and a moving subject clause with a position"
    if any(positioned):
        return "has no positions"
    if tag == "one_moving":
        return (
            None
            if motions[0] in DIRECTIONS and motions[1] == "static"
            else "needs a mover then a static object"
        )
    ok = all(m in DIRECTIONS for m in motions) and motions[0] != motions[1]
    return None if ok else "needs two objects moving in different directions"


def validate_video_spec(spec: Spec, form: bool = True) -> None:
    """Raise ``ValueError`` naming the value at fault when a spec uses unknown words (an unknown
    motion, shape, colour or relation), bad indices, or (with ``form``) breaks its category's
    form (:func:`_category_error`: e.g. a ``motion_binding`` spec whose objects move alike)."""
    if not isinstance(spec, dict):
        raise ValueError(f"a video spec is a dict, got {type(spec).__name__}")
    if spec.get("tag") not in VIDEO_CATEGORIES:
        raise ValueError(f"video spec tag must be one of {VIDEO_CATEGORIES}, got {spec.get('tag')!r}")
    if spec.get("exclude"):
        raise ValueError(f"video spec {spec.get('prompt')!r} has exclude clauses; video specs have none")
    include = spec.get("include")
    if not include or not isinstance(include, list):
        raise ValueError(f"video spec {spec.get('prompt')!r} has no include clauses")
    for index, clause in enumerate(include):
        _check_clause(clause, index, spec.get("prompt"))
    problem = _category_error(spec) if form else None
    if problem:
        raise ValueError(f"{spec['tag']} spec {spec.get('prompt')!r} {problem}")


# -- parsing ------------------------------------------------------------------------------------

_MOTION_ALTERNATION = "|".join(sorted(map(re.escape, _MOTION_WORDS), key=len, reverse=True))
_RELATION_ALTERNATION = "|".join(sorted(_RELATION_WORDS, key=len, reverse=True))
_RELATION_PATTERN = re.compile(
    rf"^(?P<a>.+?) (?P<rel>{_RELATION_ALTERNATION}) (?P<b>.+?),? (?P<m>{_MOTION_ALTERNATION})$"
)
_MOVING_PATTERN = re.compile(rf"^(?P<np>.+?) (?P<m>{_MOTION_ALTERNATION})$")


def _parse_object(text: str, caption: str) -> dict[str, Any]:
    """``"a red circle"`` -> ``{"class": "circle", "count": 1, "color": "red"}``."""
    words = text.split()
    if not words or words[0] not in ("a", "an", "one"):
        raise CaptionParseError(f"expected 'a [colour] shape' for {text!r} in {caption!r}")
    rest = words[1:]
    colour = rest[0] if len(rest) == 2 else None
    if len(rest) not in (1, 2) or (colour is not None and colour not in COLOURS):
        raise CaptionParseError(f"cannot read {text!r} in {caption!r} as 'a [colour] shape'")
    if rest[-1] not in SHAPES:
        raise CaptionParseError(f"unknown shape {rest[-1]!r} in {caption!r}; shapes: {SHAPES}")
    clause: dict[str, Any] = {"class": rest[-1], "count": 1}
    if colour is not None:
        clause["color"] = colour
    return clause


def _infer_tag(include: list[dict[str, Any]]) -> str:
    if any("position" in c for c in include):
        return "relation_motion"
    if len(include) == 1:
        return "single_motion"
    return "one_moving" if include[-1].get("motion") == "static" else "motion_binding"


def parse_video_caption(caption: str) -> Spec:
    """Read a toy-video caption into its spec (the inverse of :func:`video_caption_for_spec`).

    Raises :class:`genalign.toy.captions.CaptionParseError` naming what it could not read.
    """
    text = " ".join(caption.lower().strip().rstrip(".").split())
    match = _RELATION_PATTERN.match(text)
    if match:
        subject = _parse_object(match["a"], caption)
        subject |= {"position": [_RELATION_WORDS[match["rel"]], 0], "motion": _MOTION_WORDS[match["m"]]}
        include = [_parse_object(match["b"], caption), subject]
    else:
        include = []
        for part in text.split(" and "):
            moving = _MOVING_PATTERN.match(part)
            if moving is None:
                raise CaptionParseError(f"no motion phrase after {part!r} in {caption!r}")
            include.append(_parse_object(moving["np"], caption) | {"motion": _MOTION_WORDS[moving["m"]]})
    spec: Spec = {"tag": _infer_tag(include), "include": include, "prompt": caption}
    try:
        validate_video_spec(spec)
    except ValueError as error:
        raise CaptionParseError(str(error)) from error
    return spec
