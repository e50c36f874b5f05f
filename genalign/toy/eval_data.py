"""Build the small sample data sets shipped under ``assets/eval/`` (reproducible, offline).

- ``assets/eval/preference/pairs.jsonl``: toy-world preference pairs. For a caption of the shape
  grammar (``genalign.toy``), one image is a scene drawn for that caption and the other a scene
  drawn for a different caption of the same category (one pair in four: a second scene of the
  same caption, so ties occur); ShapesEval (which reads the scene back from
  pixels) labels the pair: the image passing more of the caption's checks wins, equal -> tie (0.5).
  Order is randomised; ``split`` marks the first 40% as ``validation`` (PickScore's threshold).
- ``assets/eval/quality/mos.jsonl``: toy scenes degraded by Gaussian blur, Gaussian noise or
  JPEG compression at levels 0-3; ``mos = 5 - level`` (a known degradation level standing in for
  a mean opinion score), ``category`` = the degradation. (Darkening is a fourth kind that
  :mod:`genalign.toy.quality` can rate on request; the shipped set keeps the three.)

Run ``python -m genalign.toy.eval_data [--out assets/eval]``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageEnhance, ImageFilter

logger = logging.getLogger(__name__)

IMAGE_SIZE = 64
PAIRS_PER_CATEGORY = 8
QUALITY_SCENES = 6
# level 1..4 strength; level 0 is the clean image. assets/eval/quality uses levels 0-3; level 4
# (MOS 1, the bottom of Q-Align's five levels) is for genalign.toy.quality's num_levels=5.
DEGRADATIONS = {
    "blur": (0.8, 1.6, 3.0, 5.0),  # Gaussian blur radius in pixels
    "noise": (0.04, 0.1, 0.2, 0.35),  # Gaussian noise std on [0, 1] pixels
    "jpeg": (40, 15, 5, 2),  # JPEG quality
    "darken": (0.8, 0.6, 0.4, 0.25),  # brightness factor (PIL's ImageEnhance.Brightness)
}
# the kinds assets/eval/quality and genalign.toy.quality rate unless told otherwise
RATED_KINDS = ("blur", "jpeg", "noise")
# level 0's strength (unchanged), for levels between 0 and 1
_CLEAN_STRENGTH = {"blur": 0.0, "noise": 0.0, "jpeg": 100, "darken": 1.0}


def _to_pil(image: torch.Tensor) -> Image.Image:
    pixels = (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()  # (H, W, 3)
    return Image.fromarray(pixels)


def degrade(image: Image.Image, kind: str, level: float, rng: np.random.Generator) -> Image.Image:
    """``image`` degraded by ``kind`` at ``level`` (0 = unchanged, 4 = strongest). A level between
    two whole ones interpolates the strength linearly between theirs (level 0's: no blur, no noise,
    JPEG quality 100); whole levels give exactly the tabled strengths."""
    if kind not in DEGRADATIONS:
        raise ValueError(f"unknown degradation {kind!r}; known: {sorted(DEGRADATIONS)}")
    if not 0 <= level <= len(DEGRADATIONS[kind]):
        raise ValueError(f"degradation level must be in [0, {len(DEGRADATIONS[kind])}], got {level}")
    if level == 0:
        return image.copy()
    anchors = (_CLEAN_STRENGTH[kind], *DEGRADATIONS[kind])
    strength = float(np.interp(level, range(len(anchors)), anchors))
    if kind == "blur":
        return image.filter(ImageFilter.GaussianBlur(radius=strength))
    if kind == "darken":
        return ImageEnhance.Brightness(image).enhance(strength)
    if kind == "noise":
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        noisy = np.clip(pixels + rng.normal(0.0, strength, pixels.shape), 0, 1)
        return Image.fromarray((noisy * 255).round().astype(np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=int(round(strength)))
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def build_preference_pairs(
    out_dir: Path, seed: int = 0, pairs_per_category: int = PAIRS_PER_CATEGORY
) -> Path:
    """Toy-world pairs labelled by ShapesEval; returns the JSONL path."""
    from genalign.toy.prompts import prompts_for, scene_for_spec
    from genalign.toy.scenes import render_scenes
    from genalign.toy.shapes_eval import check_spec, detect_objects

    rng = np.random.default_rng(seed)
    image_dir = out_dir / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    prompts = prompts_for("train")
    by_category: dict[str, list] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    rows = []
    for category in sorted(by_category):
        pool = by_category[category]
        for k in range(pairs_per_category):
            prompt = pool[int(rng.integers(len(pool)))]
            others = [p for p in pool if p.caption != prompt.caption]
            # One pair in four shows two scenes of the caption itself (usually a ShapesEval tie).
            other = prompt if k % 4 == 3 else others[int(rng.integers(len(others)))]
            scenes = [scene_for_spec(prompt, rng), scene_for_spec(other, rng)]
            images = render_scenes(scenes, size=IMAGE_SIZE)  # (2, 3, H, W)
            checks = [check_spec(detect_objects(image), prompt.spec) for image in images]
            swap = bool(rng.integers(2))
            order = [1, 0] if swap else [0, 1]
            names = []
            for slot, index in enumerate(order):
                name = f"images/{category}_{k:02d}_{slot}.png"
                _to_pil(images[index]).save(out_dir / name, optimize=True)
                names.append(name)
            fraction = [checks[index].fraction for index in order]
            label = 0.5 if fraction[0] == fraction[1] else float(fraction[1] > fraction[0])
            rows.append(
                {
                    "prompt": prompt.caption,
                    "image_0": names[0],
                    "image_1": names[1],
                    "label": label,
                    "category": category,
                }
            )
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]
    n_validation = int(0.4 * len(rows))
    for index, row in enumerate(rows):
        row["split"] = "validation" if index < n_validation else "test"
    path = out_dir / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def build_quality_set(out_dir: Path, seed: int = 0, n_scenes: int = QUALITY_SCENES) -> Path:
    """Toy scenes at known degradation levels, ``mos = 5 - level``; returns the JSONL path."""
    from genalign.toy.prompts import prompts_for, scene_for_spec
    from genalign.toy.scenes import render_scenes

    rng = np.random.default_rng(seed + 1)
    image_dir = out_dir / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    prompts = prompts_for("train")
    chosen = [prompts[int(i)] for i in rng.choice(len(prompts), size=n_scenes, replace=False)]
    clean = render_scenes([scene_for_spec(p, rng) for p in chosen], size=IMAGE_SIZE)
    rows = []
    for scene_index, (prompt, image) in enumerate(zip(chosen, clean)):
        base = _to_pil(image)
        for kind in RATED_KINDS:
            for level in range(4):
                name = f"images/scene{scene_index}_{kind}{level}.png"
                degrade(base, kind, level, rng).save(out_dir / name, optimize=True)
                rows.append(
                    {"image": name, "mos": float(5 - level), "prompt": prompt.caption, "category": kind}
                )
    path = out_dir / "mos.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="assets/eval", help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    pairs = build_preference_pairs(out / "preference", args.seed)
    quality = build_quality_set(out / "quality", args.seed)
    print(f"wrote {pairs} and {quality}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
