"""The toy world's image-quality data for IQA judges (Q-Hawkeye, issue #27), in memory or on disk.

Scenes of a prompt split (``train``: what toy-vlm was trained on; ``heldout``: captions it never
saw, :mod:`genalign.toy.prompts`) are rendered at 64 px and degraded by blur, noise or JPEG at
levels 0-3 exactly as ``assets/eval/quality/mos.jsonl`` is (:func:`genalign.toy.eval_data.degrade`),
with ``mos = 5 - level`` (``rated_kinds`` adds darkening, the fourth kind of Q-Hawkeye's copies,
and ``num_levels=5`` a level 4, MOS 1); or, with ``levels="continuous"``, at real-valued levels in
[0, 3], so the MOS is a real number as a mean opinion score is. Three uses:

* :func:`toy_quality_pool` is a recipe's prompt source: the judge's pool
  (:func:`~genalign.trainers.quality_pool.quality_pool_of`: images, degraded copies, MOS) and, with
  ``teacher``, a ``completions`` column for a format warm start: ``<think>WORD</think><answer>S</answer>``
  where ``S`` is the teacher's own Q-Align expected rating of the image (two decimals) and ``WORD``
  the level word nearest to it; the default question is Q-Align's (toy-vlm's) and the think opens
  with Q-Align's answer prefix, the context in which toy-vlm learnt to rate. The targets hold no MOS label: the supervised stage teaches the
  answer format and carries over what the teacher already ranks; only the RL stage sees MOS.
* :func:`write_quality_set` writes a split as files for ``genalign eval-reward``: ``mos.jsonl``
  (task ``mos``) and ``pairs.jsonl`` (task ``preference``: each image as ``image_0`` against its
  Q-Hawkeye degraded copy, :func:`~genalign.utils.degradations.degradation_pair`, as ``image_1``,
  ``label`` 0, so skip-ties accuracy is the rate at which a reward scores the original above its
  degraded copy, an exact tie counting a half). Rows of both files carry ``cluster``, the scene
  index: the copies of one scene are not independent, so eval-reward's intervals resample scenes.
* ``python -m genalign.toy.quality --split heldout --scenes 24 --out DIR`` runs the latter.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genalign.toy.eval_data import DEGRADATIONS, RATED_KINDS, _to_pil, degrade
from genalign.trainers.prompt_pool import PromptPool
from genalign.trainers.quality_pool import quality_pool_of
from genalign.utils.degradations import DEGRADATION_KINDS, degradation_pair

__all__ = [
    "TOY_QUESTION",
    "answer_target",
    "judge_answers",
    "quality_renders",
    "toy_quality_pool",
    "write_quality_set",
]

LEVEL_WORDS = {5: "excellent", 4: "good", 3: "fair", 2: "poor", 1: "bad"}  # Q-Align's levels
# toy-vlm's own Q-Align question and answer prefix: its image-to-rating mapping lives after them
TOY_QUESTION = "How would you rate the quality of this image?"
TOY_THINK = "The quality of the image is"
LEVELS = 4  # default: levels 0 (clean) .. 3 of genalign.toy.eval_data.DEGRADATIONS (MOS 5 .. 2)
LEVEL_MODES = ("whole", "continuous")


def quality_renders(
    split: str = "train",
    scenes: int = 24,
    seed: int = 0,
    size: int = 64,
    levels: str = "whole",
    num_levels: int = LEVELS,
    rated_kinds: Sequence[str] = RATED_KINDS,
) -> tuple[torch.Tensor, list[float], list[dict[str, Any]]]:
    """``(images [N, 3, size, size], mos [N], records)``: ``scenes`` scenes of distinct ``split``
    prompts, each degraded by every kind of ``rated_kinds`` at ``num_levels`` levels (N = scenes x
    len(rated_kinds) x num_levels; the default, blur, JPEG and noise, as ``assets/eval/quality``;
    ``darken`` adds the darkening that Q-Hawkeye's degraded copies also use),
    deterministic in ``seed``; ``mos = 5 - level``. ``num_levels`` 4 (the default) spans levels 0-3,
    MOS 5 to 2, as ``assets/eval/quality``; 5 adds level 4, MOS 1, the bottom of Q-Align's scale.
    ``levels``: ``"whole"``, the whole levels (whole-number MOS); ``"continuous"``, one level drawn
    uniformly from each of ``num_levels`` equal parts of [0, num_levels - 1] (``(i + u) * (num_levels
    - 1) / num_levels``, ``u ~ U(0, 1)``, rounded to 0.01), so the MOS is a real number, as the mean
    of many ratings is in KonIQ or SPAQ, and a judge is paid for telling strengths apart within a
    whole level. Records hold ``prompt``, ``category`` (the degradation), ``level``, ``index`` (the
    whole level, or the part) and ``scene``."""
    if levels not in LEVEL_MODES:
        raise ValueError(f"levels must be one of {LEVEL_MODES}, got {levels!r}")
    if num_levels not in (4, 5):
        raise ValueError(f"num_levels must be 4 (levels 0-3) or 5 (levels 0-4), got {num_levels!r}")
    rated_kinds = tuple(rated_kinds)
    if (
        not rated_kinds
        or len(set(rated_kinds)) < len(rated_kinds)
        or not set(rated_kinds) <= set(DEGRADATIONS)
    ):
        raise ValueError(f"rated_kinds must be distinct kinds of {sorted(DEGRADATIONS)}, got {rated_kinds!r}")
    from genalign.toy.prompts import prompts_for, scene_for_spec
    from genalign.toy.scenes import render_scenes

    prompts = prompts_for(split)
    if not 0 < scenes <= len(prompts):
        raise ValueError(f"scenes must be in [1, {len(prompts)}] for split {split!r}, got {scenes}")
    rng = np.random.default_rng(seed)
    chosen = [prompts[int(i)] for i in rng.choice(len(prompts), size=scenes, replace=False)]
    clean = render_scenes([scene_for_spec(p, rng) for p in chosen], size=size)
    images, mos, records = [], [], []
    part = (num_levels - 1) / num_levels  # the width of each continuous level's part of [0, num_levels - 1]
    for scene, (prompt, image) in enumerate(zip(chosen, clean)):
        base = _to_pil(image)
        for kind in rated_kinds:
            for index in range(num_levels):
                level = index if levels == "whole" else round(part * (index + rng.uniform()), 2)
                pixels = np.asarray(degrade(base, kind, level, rng), dtype=np.float32) / 255.0
                images.append(torch.from_numpy(pixels).permute(2, 0, 1).contiguous())
                mos.append(round(5.0 - level, 2))
                records.append(
                    {
                        "prompt": prompt.caption,
                        "category": kind,
                        "level": level,
                        "index": index,
                        "scene": scene,
                    }
                )
    return torch.stack(images), mos, records


def judge_answers(
    images: torch.Tensor,
    teacher: str,
    batch_size: int = 32,
    samples: int = 0,
    answer: str = "expected",
    seed: int = 0,
) -> list[list[str]]:
    """Per image, the warm start's targets ``<think>The quality of the image is WORD</think>
    <answer>S</answer>`` from the VLM ``teacher`` (a folder or hub id) read as a Q-Align judge (the
    ``iqa`` reward): the think is Q-Align's own answer prefix, after which toy-vlm already reads
    quality off the image. ``samples`` 0: one target, ``WORD`` the level nearest to the teacher's
    expected rating E; N > 0: N targets, each ``WORD`` drawn from the teacher's rating-word
    distribution (seeded by ``seed``), so that the targets carry the distribution, not its mode.
    ``answer``: ``"expected"`` writes E with two decimals, ``"word"`` the level of ``WORD``
    (``4.00``)."""
    from genalign.rewards import load_reward

    if answer not in ("expected", "word"):
        raise ValueError(f"answer must be 'expected' or 'word', got {answer!r}")
    options = {"num_samples": samples, "seed": seed} if samples > 0 else {}
    reward = load_reward("iqa", model=teacher, preset="qalign", batch_size=batch_size, **options).eval()
    with torch.no_grad():
        out = reward(images, [""] * len(images))
    expected = out.scores.float().cpu()  # (N,)
    levels = out.details["samples"].cpu() if samples > 0 else expected.round().clamp(1, 5)[:, None]  # (N, K)
    targets = []
    for score, drawn in zip(expected.tolist(), levels.tolist()):
        words = [LEVEL_WORDS[int(level)] for level in drawn]
        values = [score] * len(drawn) if answer == "expected" else [float(level) for level in drawn]
        targets.append([answer_target(w, v) for w, v in zip(words, values)])
    return targets


def answer_target(word: str, value: float) -> str:
    """A warm-start target: ``<think>The quality of the image is WORD</think><answer>V</answer>``
    with ``V`` to two decimals."""
    return f"<think>{TOY_THINK} {word}</think><answer>{value:.2f}</answer>"


def toy_quality_pool(
    split: str = "train",
    scenes: int = 24,
    seed: int = 0,
    prompt: str = TOY_QUESTION,
    degradation_seed: int = 0,
    kinds: Sequence[str] = DEGRADATION_KINDS,
    teacher: str | None = None,
    teacher_samples: int = 0,
    teacher_answer: str = "expected",
    mos_targets: bool = False,
    levels: str = "whole",
    teacher_copies: bool = False,
    num_levels: int = LEVELS,
    rated_kinds: Sequence[str] = RATED_KINDS,
) -> PromptPool:
    """A judge's prompt pool of toy renders (module docstring): :func:`quality_renders` of
    ``(split, scenes, seed)``, every image asked ``prompt``, degraded copies from
    ``degradation_seed``; with ``teacher``, SFT targets in ``completions`` (:func:`judge_answers`
    with ``samples=teacher_samples``, ``answer=teacher_answer``; N > 0 samples repeat each image
    N times, one target each); with ``mos_targets``, one SFT target per image written from its MOS
    label instead (``<think>The quality of the image is WORD</think><answer>M.00</answer>``, ``WORD``
    the MOS level's word): supervised fine-tuning on the labels, the judge's non-RL baseline.
    ``levels``, ``num_levels``, ``rated_kinds``: the degradations and their levels
    (:func:`quality_renders`). With
    ``teacher_copies`` (a warm start only) each render's Q-Hawkeye degraded copy
    (:func:`~genalign.utils.degradations.degradation_pair` with ``degradation_seed + index``, as a
    pool without a teacher pairs each render, and as :func:`write_quality_set` does) joins the
    images with the teacher's targets too, category ``copy``: the copies are what the perception
    loss and the original-above-degraded rate show the judge, and a judge whose warm start never
    saw one may not answer in the format there. They carry no MOS (NaN): not for an RL pool."""
    if mos_targets and teacher is not None:
        raise ValueError("give either teacher (the teacher's ratings as targets) or mos_targets, not both")
    if teacher_copies and teacher is None:
        raise ValueError("teacher_copies needs a teacher: the copies have no MOS, only the teacher's ratings")
    images, mos, records = quality_renders(
        split, scenes, seed, levels=levels, num_levels=num_levels, rated_kinds=rated_kinds
    )
    columns: dict[str, Any] = {"category": [r["category"] for r in records]}
    if teacher_copies:
        copies = [
            degradation_pair(image, degradation_seed + i, tuple(kinds))[0] for i, image in enumerate(images)
        ]
        images = torch.cat([images, torch.stack(copies)])
        mos = mos + [float("nan")] * len(copies)
        columns["category"] += ["copy"] * len(copies)
    if mos_targets:
        columns["completions"] = [answer_target(LEVEL_WORDS[int(round(m))], m) for m in mos]
    if teacher is not None:
        targets = judge_answers(images, teacher, samples=teacher_samples, answer=teacher_answer, seed=seed)
        copies = len(targets[0])
        images = images.repeat_interleave(copies, dim=0)
        mos = [m for m in mos for _ in range(copies)]
        columns = {
            "category": [c for c in columns["category"] for _ in range(copies)],
            "completions": [t for row in targets for t in row],
        }
    return quality_pool_of(images, mos, prompt, degradation_seed, tuple(kinds), **columns)


def _save_png(image: torch.Tensor, path: Path) -> None:
    from PIL import Image

    pixels = (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    Image.fromarray(pixels).save(path, optimize=True)


def write_quality_set(
    out: str | Path, split: str = "heldout", *, seed: int = 1, degradation_seed: int = 0, **renders: Any
) -> tuple[Path, Path]:
    """Write ``images/``, ``mos.jsonl`` and ``pairs.jsonl`` (module docstring) under ``out``;
    returns the two JSONL paths. The images are :func:`quality_renders` of ``split`` and ``seed``
    (held-out scenes by default); ``renders`` are its other keywords (``scenes``, ``size``,
    ``levels``, ``num_levels``, ``rated_kinds``), with its defaults. ``degradation_seed`` seeds the
    copies."""
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    images, mos, records = quality_renders(split=split, seed=seed, **renders)
    mos_rows, pair_rows = [], []
    for index, (image, score, record) in enumerate(zip(images, mos, records)):
        stem = f"images/scene{record['scene']}_{record['category']}{record['index']}"
        _save_png(image, out / f"{stem}.png")
        copy, first, second = degradation_pair(image, degradation_seed + index)
        _save_png(copy, out / f"{stem}_degraded.png")
        row = {
            "image": f"{stem}.png",
            "mos": score,
            "prompt": record["prompt"],
            "category": record["category"],
            "cluster": record["scene"],
        }
        mos_rows.append(row)
        pair_rows.append(
            {
                "prompt": record["prompt"],
                "image_0": f"{stem}.png",
                "image_1": f"{stem}_degraded.png",
                "label": 0.0,
                "category": first,
                "second_degradation": second,
                "cluster": record["scene"],
            }
        )
    paths = out / "mos.jsonl", out / "pairs.jsonl"
    for path, rows in zip(paths, (mos_rows, pair_rows)):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a toy image-quality set for genalign eval-reward.")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--split", default="heldout", choices=["train", "heldout"])
    parser.add_argument("--scenes", type=int, default=24, help="scenes (kinds x num-levels images each)")
    parser.add_argument("--seed", type=int, default=1, help="scene and degradation-level seed")
    parser.add_argument("--degradation-seed", type=int, default=0, help="seed of the degraded copies")
    parser.add_argument(
        "--levels",
        default="whole",
        choices=LEVEL_MODES,
        help="whole-number or real-valued degradation levels (MOS)",
    )
    parser.add_argument(
        "--num-levels", type=int, default=LEVELS, choices=[4, 5], help="4: MOS 5 to 2; 5: down to MOS 1"
    )
    parser.add_argument(
        "--rated-kinds",
        nargs="+",
        default=list(RATED_KINDS),
        choices=sorted(DEGRADATIONS),
        help="the degradations rated at each level (darken: the darkening Q-Hawkeye's copies use too)",
    )
    args = parser.parse_args(argv)
    paths = write_quality_set(
        args.out,
        args.split,
        seed=args.seed,
        degradation_seed=args.degradation_seed,
        scenes=args.scenes,
        levels=args.levels,
        num_levels=args.num_levels,
        rated_kinds=args.rated_kinds,
    )
    print(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
