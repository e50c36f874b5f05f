"""Toy-world data for RLRF's SVG tasks: scenes as (image or caption, ground-truth SVG) pairs.

Every toy scene is drawn from SVG (:meth:`genalign.toy.scenes.Scene.to_svg`), so the toy world
is a ready image-to-SVG and text-to-SVG benchmark with exact ground truth (RLRF, Rodriguez et
al. 2025, arXiv 2505.20793; issue #25). :func:`toy_svg_pool` returns a
:class:`~genalign.trainers.prompt_pool.PromptPool` for a recipe's ``prompts.source``:

* ``image_to_svg``: the prompt is a fixed instruction; ``images`` holds each scene's render;
* ``text_to_svg``: the prompt is the scene's caption (GenEval-style, so it may leave colours or
  places open); ``images`` still holds the render (the reward's target);

with ``reference_svgs`` and ``completions`` (the SFT targets) both the scene's SVG and
``images`` its render by the reward's own renderer (:func:`genalign.rewards.svg.render_local`),
so a perfect SVG scores exactly 1. ``svg_style="compact"`` (default) writes the scene in few
tokens for the tiny models: a bare ``<svg viewBox="0 0 C C">`` root (the renderer composites on
white, so no background rectangle), integer pixel coordinates on a ``canvas`` grid;
``svg_style="canonical"`` is the compact document with its elements in one canonical order (left
to right by centre, then top to bottom): toy objects never overlap, so the order does not change
the render, and a writer trained on it need not guess which of the scene's random draw orders the
reference used; ``svg_style="scene"`` writes :meth:`Scene.to_svg` verbatim. Scenes come from a
prompt split (``train`` by default; ``heldout`` keeps the held-out combinations unseen; every
category the split has), one category after another, from one seeded generator: the pool is a
pure function of its arguments.

    python -m genalign.toy.svg_tasks --task image_to_svg --count 256 --out runs/toy/svg_train
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from genalign.toy.captions import CATEGORIES
from genalign.toy.prompts import prompts_for, sample_scene_for_prompt
from genalign.toy.scenes import PALETTE, Scene, SceneObject, hex_colour, polygon_corners
from genalign.trainers.prompt_pool import PromptPool

__all__ = [
    "DEFAULT_INSTRUCTION",
    "compact_svg",
    "scene_svg",
    "toy_svg_examples",
    "toy_svg_pool",
    "toy_svg_records",
]

DEFAULT_INSTRUCTION = "Write the SVG code of this image."
SVG_STYLES = ("compact", "canonical", "scene")


def _compact_element(obj: SceneObject, canvas: int) -> str:
    x, y, half = obj.x * canvas, obj.y * canvas, obj.size * canvas / 2
    fill = hex_colour(PALETTE[obj.colour])
    if obj.shape == "circle":
        return f'<circle cx="{round(x)}" cy="{round(y)}" r="{max(1, round(half))}" fill="{fill}"/>'
    if obj.shape == "square":
        side = max(1, round(2 * half))
        return f'<rect x="{round(x - half)}" y="{round(y - half)}" width="{side}" height="{side}" fill="{fill}"/>'
    points = " ".join(f"{round(px)},{round(py)}" for px, py in polygon_corners(obj.shape, x, y, half))
    return f'<polygon points="{points}" fill="{fill}"/>'


def compact_svg(scene: Scene, canvas: int = 32, canonical: bool = False) -> str:
    """The scene as a short SVG: ``<svg viewBox="0 0 C C">`` and one element per object with
    integer coordinates on a ``canvas`` grid (no background: renders composite on white).
    ``canonical``: elements left to right by centre, then top to bottom (the scene's own draw
    order otherwise; toy objects never overlap, so both render the same)."""
    objects = sorted(scene.objects, key=lambda o: (o.x, o.y)) if canonical else scene.objects
    body = "".join(_compact_element(obj, canvas) for obj in objects)
    return f'<svg viewBox="0 0 {canvas} {canvas}">{body}</svg>'


def scene_svg(scene: Scene, canvas: int = 32, svg_style: str = "compact") -> str:
    """``scene`` written in ``svg_style`` (module docstring)."""
    if svg_style not in SVG_STYLES:
        raise ValueError(f"svg_style must be one of {SVG_STYLES}, got {svg_style!r}")
    if svg_style == "scene":
        return scene.to_svg(canvas)
    return compact_svg(scene, canvas, canonical=svg_style == "canonical")


def toy_svg_examples(
    count: int, seed: int = 0, split: str = "train", canvas: int = 32, svg_style: str = "compact"
) -> list[tuple[str, str, Scene, dict]]:
    """``count`` ``(caption, svg, scene, spec)`` of ``split``, its categories in turn; ``spec`` is
    what ShapesEval checks (module docstring)."""
    if svg_style not in SVG_STYLES:
        raise ValueError(f"svg_style must be one of {SVG_STYLES}, got {svg_style!r}")
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    rng = np.random.default_rng(seed)
    categories = [c for c in CATEGORIES if prompts_for(split, c)]
    examples = []
    for i in range(count):
        scene, caption, spec = sample_scene_for_prompt(categories[i % len(categories)], rng, split=split)
        examples.append((caption, scene_svg(scene, canvas, svg_style), scene, spec))
    return examples


def toy_svg_records(
    count: int, seed: int = 0, split: str = "train", canvas: int = 32, svg_style: str = "compact"
) -> list[tuple[str, str, Scene]]:
    """``count`` ``(caption, svg, scene)`` triples, categories in turn (module docstring)."""
    return [example[:3] for example in toy_svg_examples(count, seed, split, canvas, svg_style)]


def toy_svg_pool(
    task: str = "image_to_svg",
    count: int = 64,
    seed: int = 0,
    split: str = "train",
    canvas: int = 32,
    svg_style: str = "compact",
    instruction: str = DEFAULT_INSTRUCTION,
    backend: str = "cairosvg",
    specs: bool = False,
) -> PromptPool:
    """A prompt pool of toy scenes for ``task`` (``image_to_svg`` or ``text_to_svg``) with
    metadata ``images`` ``[count, 3, canvas, canvas]``, ``reference_svgs`` and ``completions``;
    ``specs``: also each scene's ShapesEval spec (the oracle reward ``toy_svg_verifier`` reads it)."""
    from genalign.rewards.svg import render_local

    if task not in ("image_to_svg", "text_to_svg"):
        raise ValueError(f"task must be 'image_to_svg' or 'text_to_svg', got {task!r}")
    examples = toy_svg_examples(count, seed, split, canvas, svg_style)
    records = [example[:3] for example in examples]
    images = []
    for _, svg, _ in records:
        result = render_local(svg, canvas, canvas, backend=backend)
        if not result.ok:
            raise RuntimeError(f"a toy scene's SVG failed to render ({result.error}): {svg}")
        images.append(result.image)
    svgs = [svg for _, svg, _ in records]
    prompts = [instruction] * count if task == "image_to_svg" else [caption for caption, _, _ in records]
    columns = {"images": torch.stack(images), "reference_svgs": svgs, "completions": svgs}
    if specs:
        columns["specs"] = [example[3] for example in examples]
    return PromptPool(prompts, columns)


def write_records(pool: PromptPool, folder: str | Path) -> Path:
    """Write ``pool`` as ``records.jsonl`` with one PNG per image (``prompts.records`` reads it)."""
    from PIL import Image

    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for i, prompt in enumerate(pool):
        name = f"images/{i:05d}.png"
        pixels = (pool.metadata["images"][i].permute(1, 2, 0) * 255).round().byte().numpy()
        Image.fromarray(pixels).save(folder / name)
        lines.append(json.dumps({"prompt": prompt, "image": name, "svg": pool.metadata["reference_svgs"][i]}))
    path = folder / "records.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="image_to_svg", choices=["image_to_svg", "text_to_svg"])
    parser.add_argument("--count", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="train")
    parser.add_argument("--canvas", type=int, default=32)
    parser.add_argument("--svg-style", default="compact", choices=list(SVG_STYLES))
    parser.add_argument("--out", required=True, help="folder for records.jsonl and images/")
    args = parser.parse_args(argv)
    pool = toy_svg_pool(args.task, args.count, args.seed, args.split, args.canvas, args.svg_style)
    print(write_records(pool, args.out))


if __name__ == "__main__":
    main()
