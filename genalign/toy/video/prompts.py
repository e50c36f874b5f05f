"""Prompt sets of the toy video world, and video scenes sampled for a prompt.

The grammar (:func:`all_video_prompts`, ``genalign.toy.video.captions``) is enumerated over the
seven colours, four shapes, four relations and the motions:

- ``single_motion``: every (colour, shape, motion), motions including "standing still" (140);
- ``one_moving``: a mover and a static object of another colour and shape, the mover named first
  (2016);
- ``relation_motion``: subject and target of different colours and shapes, any relation, the
  subject moving in any direction (8064);
- ``motion_binding``: two objects of different colours moving in different directions, in both
  word orders (8064).

**Pretraining split.** ``unseen_combinations`` (also ``heldout``) holds every caption with an
object whose (colour, shape, motion) is one of :data:`HELDOUT_MOVERS` -- four triples, one per
direction and per shape, never drawn in train in any category -- and, of the two-object
categories, one scene group in eight (CRC-32 of :func:`video_scene_key`): new combinations of
seen parts. ``train`` is the rest, the generator's pretraining prompts.

**RL sets.** ``rl_heldout`` and ``rl_train`` are disjoint subsets of ``train``, balanced:
exactly :data:`RL_HELDOUT_PER_CATEGORY` and :data:`RL_TRAIN_PER_CATEGORY` captions of every
category. Per category the train split's scene groups are ranked by CRC-32 of their key and
taken in that order, whole, while they fit: first into ``rl_heldout``, then into ``rl_train``. A
scene group is the captions that describe the same videos (a ``motion_binding`` pair in both word
orders), so an RL-held-out prompt is never a re-worded RL-train prompt. Train prompts in neither
RL set are pretraining data only. Everything is deterministic (no randomness, no run-dependent
hashing) and sorted by category then caption.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np

from genalign.toy.captions import CaptionedSpec, Spec, validate_selection
from genalign.toy.scenes import COLOURS, RELATIONS, SHAPES, as_generator
from genalign.toy.video.captions import (
    VIDEO_CATEGORIES,
    motion_binding_spec,
    one_moving_spec,
    relation_motion_spec,
    single_motion_spec,
    validate_video_spec,
)
from genalign.toy.video.scenes import DIRECTIONS, MOTIONS, NUM_FRAMES, VideoScene, layout_moving_objects

VIDEO_SPLITS = ("train", "heldout", "unseen_combinations", "rl_train", "rl_heldout", "all")
HELDOUT_MOVERS: frozenset[tuple[str, str, str]] = frozenset(
    {
        ("green", "circle", "left"),
        ("red", "triangle", "up"),
        ("purple", "square", "right"),
        ("orange", "diamond", "down"),
    }
)
HELDOUT_PAIR_MODULUS = 8  # one two-object scene group in eight (by CRC-32) is held out
RL_HELDOUT_PER_CATEGORY = 40
RL_TRAIN_PER_CATEGORY = 80


@dataclass(frozen=True)
class VideoPromptSpec(CaptionedSpec):
    """A caption, its category and the spec the video verifier checks."""

    validate = staticmethod(validate_video_spec)


@functools.cache
def _grammar() -> tuple[VideoPromptSpec, ...]:
    pairs = [(c, s) for c in COLOURS for s in SHAPES]
    specs = [single_motion_spec(c, s, m) for c, s in pairs for m in MOTIONS]
    specs += [
        one_moving_spec(ca, sa, d, cb, sb)
        for ca, sa in pairs
        for d in DIRECTIONS
        for cb, sb in pairs
        if ca != cb and sa != sb
    ]
    specs += [
        relation_motion_spec(ca, sa, rel, cb, sb, d)
        for ca, sa in pairs
        for rel in RELATIONS
        for cb, sb in pairs
        if ca != cb and sa != sb
        for d in DIRECTIONS
    ]
    specs += [
        motion_binding_spec(ca, sa, da, cb, sb, db)
        for ca, sa in pairs
        for da in DIRECTIONS
        for cb, sb in pairs
        for db in DIRECTIONS
        if ca != cb and da != db
    ]
    prompts = [VideoPromptSpec.from_spec(spec) for spec in specs]
    return tuple(sorted(prompts, key=lambda p: (VIDEO_CATEGORIES.index(p.category), p.caption)))


def all_video_prompts() -> list[VideoPromptSpec]:
    """Every caption of the grammar, once, sorted by category then caption."""
    return [p.deep_copy() for p in _grammar()]


def video_scene_key(prompt: VideoPromptSpec) -> str:
    """A key shared by exactly the captions that describe the same videos: the category and the
    sorted clauses (so a ``motion_binding`` caption and its word-order twin share it)."""
    include = prompt.spec["include"]
    clauses = sorted(
        f"{c.get('color', '')} {c['class']} {c.get('motion', '')} {c.get('position', '')}" for c in include
    )
    return f"{prompt.category}:" + "|".join(clauses)


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def is_video_heldout(prompt: VideoPromptSpec) -> bool:
    """True when the prompt is in ``unseen_combinations`` (module docstring)."""
    include = prompt.spec["include"]
    if any((c.get("color"), c["class"], c.get("motion")) in HELDOUT_MOVERS for c in include):
        return True
    if prompt.category == "single_motion":
        return False
    return _crc(video_scene_key(prompt)) % HELDOUT_PAIR_MODULUS == 0


@functools.cache
def _rl_keys() -> dict[str, frozenset[str]]:
    """Scene keys of ``rl_heldout`` and ``rl_train``, filled per category in CRC-32 order."""
    groups: dict[str, dict[str, int]] = {}
    for prompt in _grammar():
        if not is_video_heldout(prompt):
            category = groups.setdefault(prompt.category, {})
            key = video_scene_key(prompt)
            category[key] = category.get(key, 0) + 1
    chosen: dict[str, set[str]] = {"rl_heldout": set(), "rl_train": set()}
    for sizes in groups.values():
        ranked = iter(sorted(sizes, key=lambda key: (_crc(key), key)))
        for split, quota in (("rl_heldout", RL_HELDOUT_PER_CATEGORY), ("rl_train", RL_TRAIN_PER_CATEGORY)):
            filled = 0
            while filled < quota:
                key = next(ranked, None)
                if key is None:
                    raise RuntimeError(f"the train split has too few prompts for {split}'s quota {quota}")
                if filled + sizes[key] <= quota:
                    chosen[split].add(key)
                    filled += sizes[key]
    return {split: frozenset(keys) for split, keys in chosen.items()}


def _in_split(prompt: VideoPromptSpec, split: str) -> bool:
    if split == "all":
        return True
    if split in ("heldout", "unseen_combinations"):
        return is_video_heldout(prompt)
    if is_video_heldout(prompt):
        return False
    return split == "train" or video_scene_key(prompt) in _rl_keys()[split]


@functools.cache
def _split(split: str, category: str | None) -> tuple[VideoPromptSpec, ...]:
    validate_selection(split, VIDEO_SPLITS, category, VIDEO_CATEGORIES)
    return tuple(
        p for p in _grammar() if (category is None or p.category == category) and _in_split(p, split)
    )


def video_prompts_for(split: str = "train", category: str | None = None) -> list[VideoPromptSpec]:
    """The prompts of a split (:data:`VIDEO_SPLITS`), optionally of one category."""
    return [p.deep_copy() for p in _split(split, category)]


# -- scenes for prompts -----------------------------------------------------------------------------


def video_scene_for_spec(
    spec: Spec | VideoPromptSpec, rng: int | np.random.Generator | None, num_frames: int = NUM_FRAMES
) -> VideoScene:
    """A random video that satisfies ``spec`` and holds nothing else: one object per clause, in
    its colour (else a random one) and motion (else static), with the relation held on every
    frame (``scenes.layout_moving_objects``)."""
    spec = spec.spec if isinstance(spec, VideoPromptSpec) else spec
    validate_video_spec(spec)
    rng = as_generator(rng)
    items, relation = [], None
    for index, clause in enumerate(spec["include"]):
        colour = clause.get("color") or str(rng.choice(COLOURS))
        items.append((clause["class"], colour, clause.get("motion", "static")))
        if "position" in clause:
            relation = (index, clause["position"][0], clause["position"][1])
    return layout_moving_objects(rng, items, relation, num_frames)


def sample_video_for_prompt(
    category: str, rng: int | np.random.Generator | None, split: str = "train", num_frames: int = NUM_FRAMES
) -> tuple[VideoScene, str, Spec]:
    """A random prompt of ``category`` from ``split`` and a video scene for it:
    ``(scene, caption, spec)``."""
    rng = as_generator(rng)
    prompts = _split(split, category)
    if not prompts:
        raise ValueError(f"split {split!r} has no {category!r} prompts")
    prompt = prompts[int(rng.integers(len(prompts)))].deep_copy()
    return video_scene_for_spec(prompt.spec, rng, num_frames), prompt.caption, prompt.spec
