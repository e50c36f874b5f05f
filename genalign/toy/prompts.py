"""Fixed prompt sets of the toy world, and scenes sampled for a prompt.

Two splits of the grammar serve two purposes. The *pretraining* split (``train`` / ``heldout``)
decides what the toy generators were trained on; the *RL* sets (``rl_train`` / ``rl_heldout``,
below) divide the pretraining prompts for RL, as GenEval-style RL papers train and test on
different prompts from the same templates and vocabulary (DESIGN.md "The offline world").


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

The held-out set is also called ``unseen_combinations``: RL cannot create what the generator never
drew, so it is a compositional-generalisation probe, reported but never a target.

**RL sets.** ``rl_train`` and ``rl_heldout`` (:func:`rl_train_prompts`, :func:`rl_heldout_prompts`)
are disjoint and together are exactly the train split, so both lie inside the generator's
pretraining distribution. Captions that describe the same scenes (:func:`scene_key`: "a triangle
above a circle" and "a circle below a triangle"; "a circle and a square" and "a square and a
circle"; a colour-attribution pair in both word orders) always fall in the same set, so a held-out
prompt is never a re-worded train prompt. Per category the scene groups are ranked by the CRC-32
of their key and the first ``min(groups // 2, RL_HELDOUT_MAX_GROUPS)`` go to ``rl_heldout``
(about half of every small category, and 24 groups of the large colour-attribution category):

================  =====  ========  ==========  ===============================================
category          train  rl_train  rl_heldout  note
================  =====  ========  ==========  ===============================================
single_object         4         2           2  one prompt per shape: 2 / 2
two_object           10         6           4  5 unordered pairs: 3 / 2
counting             10         5           5
colors               24        12          12
position             40        20          20  20 converse pairs: 10 / 10
color_attr          312       264          48  156 word-order pairs: 132 / 24
================  =====  ========  ==========  ===============================================

Only colour attribution has the 40+ held-out prompts an evaluation would like: the train split
holds just 40 position prompts (20 scenes), so ``rl_heldout`` gets half of them.
:func:`balanced_prompts` repeats or thins a set to the same number of lines per category, for
RL prompt files such as ``configs/toy/rl_train_prompts.txt`` (:func:`rl_train_prompt_file`).
"""

from __future__ import annotations

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
    CaptionedSpec,
    Spec,
    color_attr_spec,
    colors_spec,
    counting_spec,
    position_spec,
    single_object_spec,
    two_object_spec,
    validate_selection,
    validate_spec,
)
from genalign.toy.scenes import COLOURS, RELATIONS, SHAPES, Scene, as_generator, layout_objects

SPLITS = ("train", "heldout", "all", "rl_train", "rl_heldout", "unseen_combinations")
RL_HELDOUT_MAX_GROUPS = 24  # at most this many scene groups of a category go to rl_heldout
RL_TRAIN_PROMPT_FILE = Path(__file__).resolve().parents[2] / "configs" / "toy" / "rl_train_prompts.txt"
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
class PromptSpec(CaptionedSpec):
    """A caption, its GenEval category and the spec a verifier checks (see ``captions.py``)."""

    validate = staticmethod(validate_spec)

    def to_json(self) -> str:
        """One line of GenEval's ``evaluation_metadata.jsonl`` format."""
        return json.dumps(self.spec, sort_keys=True)


# -- the grammar ------------------------------------------------------------------------------------


def all_prompts() -> list[PromptSpec]:
    """Every caption of the grammar, once, sorted by category then caption."""
    return [p.deep_copy() for p in _grammar()]


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


def unseen_combination_prompts() -> list[PromptSpec]:
    """The compositional-generalisation probe: the same prompts as :func:`heldout_prompts`."""
    return prompts_for("unseen_combinations")


def rl_train_prompts() -> list[PromptSpec]:
    """RL training prompts: the part of the pretraining split not in :func:`rl_heldout_prompts`."""
    return prompts_for("rl_train")


def rl_heldout_prompts() -> list[PromptSpec]:
    """RL held-out prompts: pretraining-split scenes never trained on by RL (module docstring)."""
    return prompts_for("rl_heldout")


def scene_key(prompt: PromptSpec) -> str:
    """A key shared by exactly the captions that describe the same scenes.

    A position caption and its converse ("a triangle above a circle", "a circle below a triangle")
    share the canonical (smaller) triple; captions listing the same objects in another order
    ("a red circle and a blue square", "a blue square and a red circle") share their sorted
    clauses; every other caption is its own group.
    """
    include = prompt.spec["include"]
    if prompt.category == "position":
        target, subject = include
        relation = subject["position"][0]
        triple = (subject["class"], relation, target["class"])
        converse = (target["class"], CONVERSE[relation], subject["class"])
        return "position:" + "|".join(min(triple, converse))
    clauses = sorted(f"{c['count']} {c.get('color', '')} {c['class']}" for c in include)
    return f"{prompt.category}:" + "|".join(clauses)


@functools.cache
def _rl_heldout_keys() -> frozenset[str]:
    """Scene keys of ``rl_heldout``: per category, the first ``min(groups // 2,
    RL_HELDOUT_MAX_GROUPS)`` of the train split's scene groups ranked by CRC-32 of the key."""
    keys: dict[str, set[str]] = {}
    for prompt in _split("train", None):
        keys.setdefault(prompt.category, set()).add(scene_key(prompt))
    chosen: set[str] = set()
    for groups in keys.values():
        ranked = sorted(groups, key=lambda key: (zlib.crc32(key.encode()), key))
        chosen.update(ranked[: min(len(ranked) // 2, RL_HELDOUT_MAX_GROUPS)])
    return frozenset(chosen)


def _in_split(prompt: PromptSpec, split: str) -> bool:
    if split == "all":
        return True
    if split in ("heldout", "unseen_combinations"):
        return is_heldout(prompt)
    if is_heldout(prompt):  # train, rl_train and rl_heldout lie inside the pretraining split
        return False
    if split == "train":
        return True
    return (scene_key(prompt) in _rl_heldout_keys()) == (split == "rl_heldout")


@functools.cache
def _split(split: str, category: str | None) -> tuple[PromptSpec, ...]:
    validate_selection(split, SPLITS, category, CATEGORIES)
    return tuple(
        p for p in _grammar() if _in_split(p, split) and (category is None or p.category == category)
    )


def prompts_for(split: str = "train", category: str | None = None) -> list[PromptSpec]:
    """The prompts of a split, optionally of one category.

    ``split``: ``"train"`` / ``"heldout"`` (the generators' pretraining split; ``"heldout"`` is
    also called ``"unseen_combinations"``), ``"rl_train"`` / ``"rl_heldout"`` (the RL sets, a
    partition of ``"train"``) or ``"all"``.
    """
    return [p.deep_copy() for p in _split(split, category)]


# -- balanced prompt files --------------------------------------------------------------------------


def balanced_prompts(split: str = "rl_train", per_category: int = 40) -> list[str]:
    """``per_category`` captions of every category of ``split``, so RL sees each category as often.

    A category with fewer prompts repeats them in turn (each ``per_category // n`` or one more
    times); one with more keeps ``per_category`` prompts evenly spaced in caption order. Sorted by
    category then caption; deterministic.
    """
    if per_category <= 0:
        raise ValueError(f"per_category must be positive, got {per_category}")
    lines: list[str] = []
    for category in CATEGORIES:
        captions = [p.caption for p in _split(split, category)]
        if not captions:
            continue
        if len(captions) > per_category:
            stride = len(captions) / per_category
            chosen = [captions[int(i * stride)] for i in range(per_category)]
        else:
            chosen = [captions[i % len(captions)] for i in range(per_category)]
        lines += sorted(chosen)
    return lines


def rl_train_prompt_file(per_category: int = 40) -> str:
    """The text of ``configs/toy/rl_train_prompts.txt``: a header comment, then
    :func:`balanced_prompts` of ``rl_train``, one caption a line."""
    header = (
        "# The toy world's RL-train prompts (genalign.toy.prompts.rl_train_prompts()), balanced by GenEval\n"
        f"# category: {per_category} lines per category (small categories repeated, large ones thinned evenly)\n"
        "# by genalign.toy.prompts.balanced_prompts('rl_train', "
        f"{per_category}). Written by write_rl_train_prompt_file();\n"
        "# do not edit by hand. RL-held-out and unseen-combination prompts are never trained on.\n"
    )
    return header + "".join(caption + "\n" for caption in balanced_prompts("rl_train", per_category))


def write_rl_train_prompt_file(path: str | Path = RL_TRAIN_PROMPT_FILE, per_category: int = 40) -> Path:
    """Write :func:`rl_train_prompt_file` to ``path`` (default: the shipped recipe file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rl_train_prompt_file(per_category), encoding="utf-8")
    return path


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
    prompt = prompts[int(rng.integers(len(prompts)))].deep_copy()
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


EXPORTED_SPLITS = ("train", "heldout", "rl_train", "rl_heldout", "unseen_combinations")


def export_prompt_sets(directory: str | Path) -> dict[str, Path]:
    """Write ``{split}.jsonl`` (specs) and ``{split}.txt`` (one caption a line, GenEval's
    ``generation_prompts.txt``) under ``directory`` for every split of :data:`EXPORTED_SPLITS`;
    returns ``{split: jsonl path, f"{split}_captions": txt path}``."""
    directory = Path(directory)
    paths: dict[str, Path] = {}
    for split in EXPORTED_SPLITS:
        prompts = prompts_for(split)
        paths[split] = write_jsonl(prompts, directory / f"{split}.jsonl")
        captions = directory / f"{split}.txt"
        captions.write_text("".join(p.caption + "\n" for p in prompts), encoding="utf-8")
        paths[f"{split}_captions"] = captions
    return paths
