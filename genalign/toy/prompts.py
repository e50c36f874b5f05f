"""Fixed train and held-out prompt sets of the toy world, and scenes sampled for a prompt.

Every caption the grammar can write (:func:`all_prompts`, 608 of them: 400 train, 208 held out) falls in exactly one of
two sets. The held-out set holds the *combinations* a generator trained on the train set has
never been asked for, so held-out accuracy measures compositional generalisation rather than
recall (the split is GenEval's categories, Ghosh et al. 2023, with a compositional hold-out):

- colours / colour attribution: four (colour, shape) pairs (:data:`HELDOUT_COLOUR_SHAPES`) never
  appear in train, alone or in a pair; and one in eight colour-attribution pairs built only of
  seen pairs is held out as a new combination (both word orders together);
- position: four (shape, relation, shape) triples and their converses ("a triangle above a
  circle" and "a circle below a triangle" describe the same scenes);
- two objects: the pair {triangle, diamond} in either order;
- counting: "four triangles" and "three diamonds".

Single-object prompts are atomic (one per shape) and appear in train only, so the held-out set
covers five of the six categories. Both sets are deterministic (no randomness, no hashing that
varies between runs) and sorted by category then caption.
"""

from __future__ import annotations

import copy
import functools
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from genalign.toy.captions import (
    CATEGORIES,
    COUNTS,
    Spec,
    color_attr_spec,
    colors_spec,
    counting_spec,
    position_spec,
    single_object_spec,
    two_object_spec,
    validate_spec,
)
from genalign.toy.scenes import COLOURS, RELATIONS, SHAPES, Scene, as_generator, layout_objects

SPLITS = ("train", "heldout", "all")
HELDOUT_COLOUR_SHAPES: frozenset[tuple[str, str]] = frozenset(
    {("green", "circle"), ("red", "triangle"), ("purple", "square"), ("orange", "diamond")}
)
HELDOUT_RELATIONS: frozenset[tuple[str, str, str]] = frozenset(
    {
        ("triangle", "above", "circle"),
        ("square", "left of", "diamond"),
        ("diamond", "below", "square"),
        ("circle", "right of", "triangle"),
    }
)
HELDOUT_TWO_OBJECTS: frozenset[frozenset[str]] = frozenset({frozenset({"triangle", "diamond"})})
HELDOUT_COUNTS: frozenset[tuple[str, int]] = frozenset({("triangle", 4), ("diamond", 3)})
HELDOUT_PAIR_MODULUS = 8  # one colour-attribution combination in eight (by CRC-32) is held out
CONVERSE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}


@dataclass(frozen=True)
class PromptSpec:
    """A caption, its GenEval category and the spec a verifier checks (see ``captions.py``)."""

    caption: str
    category: str
    spec: Spec

    @classmethod
    def from_spec(cls, spec: Spec) -> PromptSpec:
        validate_spec(spec)
        return cls(caption=spec["prompt"], category=spec["tag"], spec=spec)

    def to_json(self) -> str:
        """One line of GenEval's ``evaluation_metadata.jsonl`` format."""
        return json.dumps(self.spec, sort_keys=True)


# -- the grammar ------------------------------------------------------------------------------------


def all_prompts() -> list[PromptSpec]:
    """Every caption of the grammar, once, sorted by category then caption."""
    return [_copy(p) for p in _grammar()]


def _copy(prompt: PromptSpec) -> PromptSpec:
    return PromptSpec(prompt.caption, prompt.category, copy.deepcopy(prompt.spec))


@functools.cache
def _grammar() -> tuple[PromptSpec, ...]:
    """The enumerated grammar, built once; never hand these (mutable) specs out uncopied."""
    specs: list[Spec] = []
    specs += [single_object_spec(shape) for shape in SHAPES]
    specs += [two_object_spec(a, b) for a in SHAPES for b in SHAPES if a != b]
    specs += [counting_spec(shape, count) for shape in SHAPES for count in COUNTS]
    specs += [colors_spec(colour, shape) for colour in COLOURS for shape in SHAPES]
    specs += [position_spec(a, rel, b) for a in SHAPES for rel in RELATIONS for b in SHAPES if a != b]
    specs += [
        color_attr_spec(colour_a, shape_a, colour_b, shape_b)
        for colour_a in COLOURS
        for shape_a in SHAPES
        for colour_b in COLOURS
        for shape_b in SHAPES
        if colour_a != colour_b and shape_a != shape_b
    ]
    prompts = [PromptSpec.from_spec(spec) for spec in specs]
    return tuple(sorted(prompts, key=lambda p: (CATEGORIES.index(p.category), p.caption)))


def _coloured_pairs(spec: Spec) -> list[tuple[str, str]]:
    return [(c["color"], c["class"]) for c in spec["include"] if "color" in c]


def is_heldout(prompt: PromptSpec) -> bool:
    """True when the prompt belongs to the held-out set (see the module docstring)."""
    spec, category = prompt.spec, prompt.category
    include = spec["include"]
    if any(pair in HELDOUT_COLOUR_SHAPES for pair in _coloured_pairs(spec)):
        return True
    if category == "color_attr":
        key = "|".join(sorted(f"{colour} {shape}" for colour, shape in _coloured_pairs(spec)))
        return zlib.crc32(key.encode()) % HELDOUT_PAIR_MODULUS == 0
    if category == "position":
        target, subject = include
        relation = subject["position"][0]
        triple = (subject["class"], relation, target["class"])
        converse = (target["class"], CONVERSE[relation], subject["class"])
        return triple in HELDOUT_RELATIONS or converse in HELDOUT_RELATIONS
    if category == "two_object":
        return frozenset(c["class"] for c in include) in HELDOUT_TWO_OBJECTS
    if category == "counting":
        return (include[0]["class"], include[0]["count"]) in HELDOUT_COUNTS
    return False


def train_prompts() -> list[PromptSpec]:
    """The training prompts: every prompt of the grammar not held out."""
    return prompts_for("train")


def heldout_prompts() -> list[PromptSpec]:
    """The held-out prompts: combinations never seen in :func:`train_prompts`."""
    return prompts_for("heldout")


@functools.cache
def _split(split: str, category: str | None) -> tuple[PromptSpec, ...]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if category is not None and category not in CATEGORIES:
        raise ValueError(f"category must be one of {CATEGORIES}, got {category!r}")
    wanted = {"train": False, "heldout": True}.get(split)
    return tuple(
        p
        for p in _grammar()
        if (wanted is None or is_heldout(p) == wanted) and (category is None or p.category == category)
    )


def prompts_for(split: str = "train", category: str | None = None) -> list[PromptSpec]:
    """The prompts of a split (``"train"``, ``"heldout"`` or ``"all"``), optionally of one category."""
    return [_copy(p) for p in _split(split, category)]


# -- scenes for prompts -----------------------------------------------------------------------------


def scene_for_spec(spec: Spec | PromptSpec, rng: int | np.random.Generator | None) -> Scene:
    """A random scene that satisfies ``spec`` and holds nothing else.

    Each include clause contributes ``count`` objects of its shape, in its colour or else a
    uniformly random one; sizes and positions are random (``scenes.layout_objects``), and a
    position clause is laid out with a margin stricter than GenEval's test.
    """
    spec = spec.spec if isinstance(spec, PromptSpec) else spec
    validate_spec(spec)
    rng = as_generator(rng)
    items: list[tuple[str, str]] = []
    first_item: list[int] = []  # index of each clause's first object
    relation = None
    for clause in spec["include"]:
        first_item.append(len(items))
        for _ in range(clause["count"]):
            colour = clause.get("color") or str(rng.choice(COLOURS))
            items.append((clause["class"], colour))
        if "position" in clause:
            name, target = clause["position"]
            relation = (first_item[-1], name, first_item[target])
    return layout_objects(rng, items, relation)


def sample_scene_for_prompt(
    task: str, rng: int | np.random.Generator | None, split: str = "train"
) -> tuple[Scene, str, Spec]:
    """A random prompt of category ``task`` from ``split`` and a scene for it.

    Returns ``(scene, caption, spec)``; ``spec`` (GenEval metadata: tag, include, exclude,
    prompt) is what ``shapes_eval`` checks. Training data should come from ``split="train"``
    (the default) so the held-out combinations stay unseen.
    """
    rng = as_generator(rng)
    prompts = _split(split, task)
    if not prompts:
        raise ValueError(f"split {split!r} has no {task!r} prompts (single_object is train-only)")
    prompt = _copy(prompts[int(rng.integers(len(prompts)))])
    return scene_for_spec(prompt.spec, rng), prompt.caption, prompt.spec


# -- JSONL --------------------------------------------------------------------------------------------


def write_jsonl(prompts: Iterable[PromptSpec], path: str | Path) -> Path:
    """Write one spec per line (GenEval's ``evaluation_metadata.jsonl`` format)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(p.to_json() + "\n" for p in prompts), encoding="utf-8")
    return path


def read_jsonl(path: str | Path) -> list[PromptSpec]:
    """Read specs written by :func:`write_jsonl` (or GenEval-format metadata of this grammar)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [PromptSpec.from_spec(json.loads(line)) for line in lines if line.strip()]


def export_prompt_sets(directory: str | Path) -> dict[str, Path]:
    """Write ``train.jsonl`` and ``heldout.jsonl`` (specs) and ``train.txt`` / ``heldout.txt``
    (one caption a line, GenEval's ``generation_prompts.txt``) under ``directory``."""
    directory = Path(directory)
    paths: dict[str, Path] = {}
    for split, prompts in (("train", train_prompts()), ("heldout", heldout_prompts())):
        paths[split] = write_jsonl(prompts, directory / f"{split}.jsonl")
        captions = directory / f"{split}.txt"
        captions.write_text("".join(p.caption + "\n" for p in prompts), encoding="utf-8")
        paths[f"{split}_captions"] = captions
    return paths
