"""toy-dreamsim: a perceptual similarity metric for the toy world, made the way DreamSim is made.

DreamSim (Fu et al., "DreamSim: Learning New Dimensions of Human Visual Similarity using
Synthetic Data", NeurIPS 2023, arXiv 2306.09344, Sec. 4) fine-tunes pretrained image towers
(CLIP, OpenCLIP, DINO) on human two-alternative forced-choice judgments: for a reference ``x``
and two distortions ``x0, x1``, people say which is closer, and the model's distance
``d(x, y) = 1 - cos(f(x), f(y))`` is trained with the hinge loss of Eq. 3,
``max(0, m - Δd * h)``, ``Δd = d(x, x0) - d(x, x1)``, ``h = ±1`` the judgment, margin 0.05.
RLRF (arXiv 2505.20793, Sec. 3.2) uses DreamSim as its semantic reward ``1 - 2 d``.

On the toy world the judgment is known exactly: two renders show the same thing when they hold
the same objects (shape and colour), wherever the writer put them. So the toy "people" are
scene edits. From a scene of the ``train`` prompt split, each training item renders

* ``ref``: the scene with every object moved and resized a little (``jitter``);
* ``same``: another jitter of the scene (the same objects);
* ``edit1``: one object-level edit (a colour or a shape changed, an object removed or added,
  two colours swapped), jittered;
* ``edit2``: ``edit1`` with a second edit on top, jittered;

and the two triplets ``(ref; same, edit1)`` and ``(ref; edit1, edit2)`` are judged "the first
is closer". Renders are the writer's: the canonical compact SVG on a 32 px canvas through the
reward's renderer (:func:`genalign.rewards.svg.render_local`), exactly as ``svg_fidelity`` sees
RL's targets and samples.

The edits can draw combinations of the held-out prompt set (say, a colour on a shape that only
held-out prompts pair), so unlike toy-clip and toy-vlm this metric has seen such images.

Intentional differences from DreamSim: one tower (toy-clip's image tower, fine-tuned in full: it
is tiny) instead of an ensemble tuned with LoRA; synthetic judgments from scene edits instead of
NIGHTS' human votes. The text tower is saved unchanged and no longer matches the image tower:
use the folder as an image embedder (``svg_fidelity``'s ``embedder: clip``), not as a CLIP score.

    python -m genalign.toy.reward_models.similarity --out assets/models/toy-dreamsim
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from genalign.toy.scenes import (
    COLOURS,
    MARGIN,
    MAX_SIZE,
    MIN_SIZE,
    SHAPES,
    Scene,
    SceneObject,
    _boxes_apart,
    place_object,
)
from genalign.toy.training import folder_megabytes, parameter_count, warmup_cosine, write_card_files

logger = logging.getLogger(__name__)

EDITS = ("colour", "shape", "remove", "add", "swap")
VIEWS = ("ref", "same", "edit1", "edit2")


@dataclass
class SimilarityRecipe:
    """Data and training of ``toy-dreamsim`` (defaults: the shipped model)."""

    seed: int = 0
    base: str = "assets/models/toy-clip"  # the open_clip folder whose image tower is fine-tuned
    scenes: int = 6000  # training scenes (4 renders each) of the train prompt split
    canvas: int = 32
    shift: float = 0.05  # jitter: each object's centre moves by up to this fraction of the canvas
    scale: float = 0.15  # jitter: each object's size changes by up to this fraction
    steps: int = 1500
    batch_size: int = 64  # scenes a step (two triplets each)
    lr: float = 3e-4
    weight_decay: float = 0.0
    warmup: int = 50
    margin: float = 0.05  # DreamSim Eq. 3
    log_every: int = 100


# -- scene edits -----------------------------------------------------------------------------------


def _place(shape: str, colour: str, x: float, y: float, size: float) -> SceneObject:
    low, high = MARGIN + size / 2, 1 - MARGIN - size / 2
    return SceneObject(
        shape, colour, round(min(max(x, low), high), 4), round(min(max(y, low), high), 4), round(size, 4)
    )


def jitter(scene: Scene, rng: np.random.Generator, shift: float, scale: float, attempts: int = 20) -> Scene:
    """The same objects, each moved by up to ``shift`` and resized by up to ``scale`` (a fraction),
    kept inside the canvas and apart from each other; the scene itself when no draw fits."""
    for _ in range(attempts):
        objects = []
        for o in scene.objects:
            size = min(max(o.size * (1 + rng.uniform(-scale, scale)), 0.8 * MIN_SIZE), 0.5)
            x, y = o.x + rng.uniform(-shift, shift), o.y + rng.uniform(-shift, shift)
            objects.append(_place(o.shape, o.colour, x, y, size))
        if all(_boxes_apart(a.box, b.box, 0.0) for i, a in enumerate(objects) for b in objects[i + 1 :]):
            return Scene(tuple(objects))
    return scene


def _free_object(scene: Scene, rng: np.random.Generator, attempts: int = 100) -> SceneObject | None:
    shape, colour = str(rng.choice(SHAPES)), str(rng.choice(COLOURS))
    return place_object(rng, shape, colour, MAX_SIZE[min(len(scene) + 1, 4)], scene.objects, attempts)


def edit_scene(scene: Scene, rng: np.random.Generator) -> tuple[Scene, str]:
    """One object-level edit of ``scene`` that changes its multiset of (shape, colour), and its name
    (one of :data:`EDITS`); edits that cannot apply (remove from one object, add to four, swap
    without two colours) are redrawn."""
    objects = list(scene.objects)
    while True:
        kind = str(rng.choice(EDITS))
        i = int(rng.integers(len(objects)))
        o = objects[i]
        if kind == "colour":
            colour = str(rng.choice([c for c in COLOURS if c != o.colour]))
            objects[i] = SceneObject(o.shape, colour, o.x, o.y, o.size)
        elif kind == "shape":
            shape = str(rng.choice([s for s in SHAPES if s != o.shape]))
            objects[i] = SceneObject(shape, o.colour, o.x, o.y, o.size)
        elif kind == "remove" and len(objects) > 1:
            del objects[i]
        elif kind == "add" and len(objects) < 4:
            added = _free_object(scene, rng)
            if added is None:
                continue
            objects.append(added)
        elif kind == "swap":
            pairs = [(a, b) for a in range(len(objects)) for b in range(a + 1, len(objects))]
            pairs = [(a, b) for a, b in pairs if objects[a].colour != objects[b].colour]
            pairs = [(a, b) for a, b in pairs if objects[a].shape != objects[b].shape]
            if not pairs:
                continue
            a, b = pairs[int(rng.integers(len(pairs)))]
            oa, ob = objects[a], objects[b]
            objects[a] = SceneObject(oa.shape, ob.colour, oa.x, oa.y, oa.size)
            objects[b] = SceneObject(ob.shape, oa.colour, ob.x, ob.y, ob.size)
        else:
            continue
        return Scene(tuple(objects)), kind


def object_multiset(scene: Scene) -> list[tuple[str, str]]:
    """The scene's objects as a sorted list of (shape, colour): what the judgment compares."""
    return sorted((o.shape, o.colour) for o in scene.objects)


def triplet_views(scene: Scene, rng: np.random.Generator, shift: float, scale: float) -> dict[str, Scene]:
    """The four views of one training item (module docstring): ``ref``, ``same``, ``edit1``, ``edit2``."""
    edit1, _ = edit_scene(scene, rng)
    edit2, _ = edit_scene(edit1, rng)
    while object_multiset(edit2) == object_multiset(scene):  # the second edit undid the first
        edit2, _ = edit_scene(edit1, rng)
    views = {"ref": scene, "same": scene, "edit1": edit1, "edit2": edit2}
    return {name: jitter(view, rng, shift, scale) for name, view in views.items()}


def render_view_items(
    count: int, seed: int, split: str = "train", canvas: int = 32, shift: float = 0.05, scale: float = 0.15
) -> tuple[dict[str, torch.Tensor], list[dict[str, list[tuple[str, str]]]]]:
    """:func:`render_views`' renders and, per item, each view's :func:`object_multiset`."""
    from genalign.rewards.svg import render_local
    from genalign.toy.svg_tasks import scene_svg, toy_svg_records

    rng = np.random.default_rng(seed + 1)
    renders: dict[str, list[torch.Tensor]] = {name: [] for name in VIEWS}
    multisets = []
    for _, _, scene in toy_svg_records(count, seed=seed, split=split, canvas=canvas):
        views = triplet_views(scene, rng, shift, scale)
        multisets.append({name: object_multiset(view) for name, view in views.items()})
        for name, view in views.items():
            result = render_local(scene_svg(view, canvas, "canonical"), canvas, canvas)
            if not result.ok:
                raise RuntimeError(f"a toy scene failed to render ({result.error})")
            renders[name].append(result.image)
    return {name: torch.stack(images) for name, images in renders.items()}, multisets


def render_views(
    count: int, seed: int, split: str = "train", canvas: int = 32, shift: float = 0.05, scale: float = 0.15
) -> dict[str, torch.Tensor]:
    """``{view: [count, 3, canvas, canvas]}`` renders of ``count`` items (scenes of ``split``)."""
    return render_view_items(count, seed, split, canvas, shift, scale)[0]


# -- the metric and its loss -------------------------------------------------------------------------


def distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """DreamSim's ``1 - cos`` between rows of two feature matrices ``[B, D]`` -> ``[B]``."""
    return 1.0 - F.cosine_similarity(a, b, dim=-1)


def hinge_2afc_loss(d_near: torch.Tensor, d_far: torch.Tensor, margin: float = 0.05) -> torch.Tensor:
    """DreamSim Eq. 3 with the judgment "near is closer": ``mean(max(0, m - (d_far - d_near)))``."""
    return F.relu(margin - (d_far - d_near)).mean()


def two_afc_accuracy(
    encode: Callable[[torch.Tensor], torch.Tensor], views: dict[str, torch.Tensor]
) -> dict[str, float]:
    """Share of items where the metric agrees with the judgment, for ``same < edit1`` and
    ``edit1 < edit2`` (ties count half)."""
    with torch.no_grad():
        f = {name: encode(views[name]) for name in VIEWS}
    out = {}
    for key, near, far in (("same_vs_edit1", "same", "edit1"), ("edit1_vs_edit2", "edit1", "edit2")):
        d_near, d_far = distance(f["ref"], f[near]), distance(f["ref"], f[far])
        out[key] = float(((d_near < d_far).float() + 0.5 * (d_near == d_far).float()).mean())
    return out


def load_tower(folder: str | Path) -> Any:
    """The open_clip model of ``folder`` as an :class:`OpenCLIPEmbedder` (frozen)."""
    from genalign.rewards.clip_models import OpenCLIPEmbedder

    return OpenCLIPEmbedder(f"local-dir:{Path(folder)}")


def train_similarity(
    recipe: SimilarityRecipe,
    views: dict[str, torch.Tensor] | None = None,
    log: Callable[[str], None] = logger.info,
) -> tuple[Any, dict[str, Any]]:
    """Fine-tune the base model's image tower on the 2AFC judgments; returns (embedder, record)."""
    start = time.time()
    torch.manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    if views is None:
        views = render_views(recipe.scenes, recipe.seed, "train", recipe.canvas, recipe.shift, recipe.scale)
    log(f"toy-dreamsim: {len(views['ref'])} items rendered ({time.time() - start:.0f}s)")
    embedder = load_tower(recipe.base)
    visual = embedder.model.visual.train().requires_grad_(True)
    optimizer = torch.optim.AdamW(visual.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    losses: list[float] = []
    count = len(views["ref"])
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr * warmup_cosine(step, step / recipe.steps, recipe.warmup)
        index = torch.from_numpy(rng.choice(count, size=min(recipe.batch_size, count), replace=False))
        batch = torch.cat([views[name][index] for name in VIEWS])
        f = embedder.encode_images(batch).chunk(len(VIEWS))
        ref, same, edit1, edit2 = f
        loss = hinge_2afc_loss(distance(ref, same), distance(ref, edit1), recipe.margin)
        loss = loss + hinge_2afc_loss(distance(ref, edit1), distance(ref, edit2), recipe.margin)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(visual.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if recipe.log_every and step % recipe.log_every == 0:
            log(f"toy-dreamsim step {step} loss {losses[-1]:.4f} ({time.time() - start:.0f}s)")
    embedder.model.eval().requires_grad_(False)
    record = {
        "losses": losses,
        "seconds": time.time() - start,
        "parameters": parameter_count(visual),
        "steps": len(losses),
    }
    return embedder, record


def save_similarity(embedder: Any, recipe: SimilarityRecipe, folder: str | Path) -> Path:
    """open_clip's layout (the base's ``open_clip_config.json``, fp16 weights), like toy-clip."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(recipe.base) / "open_clip_config.json", folder / "open_clip_config.json")
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in embedder.model.state_dict().items()}
    save_file(state, str(folder / "open_clip_model.safetensors"))
    return folder


# -- command line and card ---------------------------------------------------------------------------

EVAL_SPLITS = {"rl_train": 11, "rl_heldout": 12, "heldout": 13}  # split -> scene seed of its 2AFC set
EVAL_ITEMS = 512


def evaluate_similarity(
    folders: dict[str, str | Path], items: int = EVAL_ITEMS
) -> dict[str, dict[str, dict[str, float]]]:
    """2AFC accuracy of each metric ``{name: folder}`` on fresh items of each split in
    :data:`EVAL_SPLITS` (rendered once for all of them): ``{name: {split: accuracies}}``."""
    views = {split: render_views(items, seed, split) for split, seed in EVAL_SPLITS.items()}
    out = {}
    for name, folder in folders.items():
        encode = load_tower(folder).encode_images
        out[name] = {split: two_afc_accuracy(encode, split_views) for split, split_views in views.items()}
    return out


def _readme(card: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| {split} | {100 * base['same_vs_edit1']:.1f}% -> {100 * tuned['same_vs_edit1']:.1f}% "
        f"| {100 * base['edit1_vs_edit2']:.1f}% -> {100 * tuned['edit1_vs_edit2']:.1f}% |"
        for split, base, tuned in (
            (s, card["eval"]["base"][s], card["eval"]["tuned"][s]) for s in card["eval"]["tuned"]
        )
    )
    return f"""# toy-dreamsim

toy-clip's image tower fine-tuned as DreamSim is (arXiv 2306.09344, Eq. 3: 2AFC hinge loss on
`1 - cos`, margin {card["recipe"]["margin"]}) on judgments the toy world knows exactly: renders
holding the same objects are closer than renders with one object edited, which are closer than
renders with two (genalign/toy/reward_models/similarity.py). The semantic term of `svg_fidelity`
on the toy world (`embedder: clip`, `embedder_kwargs.model: local-dir:assets/models/toy-dreamsim`).
The text tower is toy-clip's, unchanged, and no longer matches: do not use this folder as a CLIP score.

Command: `{card["command"]}` ({card["training_seconds"]:.0f} s on one CPU thread, {card["parameters"]:,}
trained parameters, {card["size_mb"]} MB).

2AFC accuracy on {card["eval"]["items"]} fresh items per split (toy-clip -> toy-dreamsim):

| split | same objects vs one edit | one edit vs two |
|---|---|---|
{rows}
"""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m genalign.toy.reward_models.similarity", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a recipe field (repeatable)",
    )
    parser.add_argument("--eval-items", type=int, default=EVAL_ITEMS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    recipe = SimilarityRecipe(seed=args.seed)
    command = f"python -m genalign.toy.reward_models.similarity --out {args.out} --seed {args.seed}"
    for item in args.set:
        field, _, value = item.partition("=")
        if field not in asdict(recipe) or field == "seed" or not value:
            parser.error(f"--set {item!r}: expected FIELD=VALUE with FIELD one of {sorted(asdict(recipe))}")
        kind = type(getattr(recipe, field))
        try:
            setattr(recipe, field, kind(value))
        except ValueError:
            parser.error(f"--set {item!r}: {value!r} is not a {kind.__name__}")
        command += f" --set {field}={value}"
    embedder, record = train_similarity(recipe)
    folder = save_similarity(embedder, recipe, args.out)
    card = {
        "name": "toy-dreamsim",
        "command": command,
        "recipe": asdict(recipe),
        "parameters": record["parameters"],
        "training_seconds": round(record["seconds"], 1),
        "final_loss": float(np.mean(record["losses"][-50:])),
        "eval": {
            "items": args.eval_items,
            **evaluate_similarity({"base": recipe.base, "tuned": folder}, args.eval_items),
        },
    }
    card["size_mb"] = folder_megabytes(folder)
    write_card_files(folder, card, _readme(card))
    print(json.dumps(card["eval"], indent=2))


if __name__ == "__main__":
    main()
