"""How well does the toy video verifier read ground-truth videos, and how rarely does it pass wrong ones?

For ``--per-category`` videos of each category of the toy video world (``genalign.toy.video``),
sampled for ``train`` prompts (or ``--split``) and rendered with skia, the verifier's accuracy
against the video's own spec ("correct") and how often it passes the same video against a wrong
spec ("wrongly passed": the opposite or another direction, a static object asked to move, the
wrong object moving, swapped colour-motion binding, the converse relation, another colour), per
condition: 48 px clean, 32 and 64 px clean, 48 px with Gaussian blur (sigma 1 px) or Gaussian
noise (std 0.05). ``docs/astrolabe.md`` ("The toy video world") reports the numbers::

    python benchmarks/toy_video_verifier.py --per-category 500
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy import ndimage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from genalign.toy.scenes import COLOURS  # noqa: E402
from genalign.toy.video import (  # noqa: E402
    VIDEO_CATEGORIES,
    check_video_spec,
    detect_video,
    render_videos,
    sample_video_for_prompt,
    validate_video_spec,
)

OPPOSITE = {"left": "right", "right": "left", "up": "down", "down": "up", "static": "right"}
CONVERSE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
CONDITIONS = {
    "48 px": (48, None),
    "32 px": (32, None),
    "64 px": (64, None),
    "48 px, blur 1 px": (48, "blur"),
    "48 px, noise 0.05": (48, "noise"),
}


def wrong_specs(spec: dict) -> list[dict]:
    """Specs the video does *not* satisfy: every change of one fact the caption states."""
    out = []
    include = spec["include"]
    for index, clause in enumerate(include):
        if "motion" in clause:
            wrong = copy.deepcopy(spec)
            wrong["include"][index]["motion"] = OPPOSITE[clause["motion"]]
            out.append(wrong)
        if "color" in clause:
            wrong = copy.deepcopy(spec)
            wrong["include"][index]["color"] = next(
                c for c in COLOURS if c not in {x.get("color") for x in include}
            )
            out.append(wrong)
        if "position" in clause:
            wrong = copy.deepcopy(spec)
            wrong["include"][index]["position"][0] = CONVERSE[clause["position"][0]]
            out.append(wrong)
    if spec["tag"] in ("one_moving", "motion_binding"):  # the other object moves / swapped binding
        wrong = copy.deepcopy(spec)
        first, second = wrong["include"]
        first["motion"], second["motion"] = second["motion"], first["motion"]
        out.append(wrong)
    for wrong in out:
        validate_video_spec(wrong, form=False)
    return out


def corrupt(videos: torch.Tensor, kind: str | None, seed: int) -> torch.Tensor:
    if kind is None:
        return videos
    if kind == "blur":
        array = ndimage.gaussian_filter(videos.numpy(), sigma=(0, 0, 0, 1, 1))
        return torch.from_numpy(array)
    generator = torch.Generator().manual_seed(seed)
    return (videos + 0.05 * torch.randn(videos.shape, generator=generator)).clamp(0, 1)


def measure(per_category: int, split: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    scenes, specs = [], []
    for category in VIDEO_CATEGORIES:
        for _ in range(per_category):
            scene, _, spec = sample_video_for_prompt(category, rng, split)
            scenes.append(scene)
            specs.append(spec)
    print(f"split {split}, {per_category} videos per category, {scenes[0].num_frames} frames, seed {seed}\n")
    print("| condition | " + " | ".join(VIDEO_CATEGORIES) + " | wrongly passed | s / video |")
    print("|---|" + "---|" * (len(VIDEO_CATEGORIES) + 2))
    for name, (size, kind) in CONDITIONS.items():
        start = time.perf_counter()
        videos = corrupt(render_videos(scenes, size), kind, seed)
        correct = {category: [] for category in VIDEO_CATEGORIES}
        wrong_passed = []
        for video, spec in zip(videos, specs):
            tracks = detect_video(video)
            correct[spec["tag"]].append(check_video_spec(tracks, spec, len(video)).correct)
            wrong_passed += [check_video_spec(tracks, w, len(video)).correct for w in wrong_specs(spec)]
        seconds = (time.perf_counter() - start) / len(scenes)
        cells = " | ".join(f"{100 * np.mean(correct[c]):.1f}%" for c in VIDEO_CATEGORIES)
        print(
            f"| {name} | {cells} | {100 * np.mean(wrong_passed):.2f}% of {len(wrong_passed)} | {seconds:.3f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, default=500)
    parser.add_argument("--split", default="train")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    measure(args.per_category, args.split, args.seed)


if __name__ == "__main__":
    main()
