"""toy-scene-judge: a learned "same objects?" judge for the toy world's SVG writers (issue #25).

:class:`genalign.rewards.svg.judge.PairJudge` (a siamese CNN) trained on the scene edits of
toy-dreamsim (:mod:`genalign.toy.reward_models.similarity`): for a scene of the ``train`` prompt
split, ``ref`` and ``same`` are two jitters of its objects (label 1), ``edit1`` changes one object
(a colour, a shape, one removed or added, two colours swapped; label 0 against both), ``edit2``
a second edit on top (label 0). No detector and no verifier is involved: the labels are the edits.
Binary cross-entropy; the pair losses are weighted so that positives and negatives weigh the same.

``target="f1"`` (the recipe field) trains the same model on a graded answer instead: the F1 of the
two object multisets, ``2 |A ∩ B| / (|A| + |B|)`` (1 for the same objects, 0.5 when one of two
objects differs), as a soft target over five pairs per item (ref-same, ref-edit1, same-edit1,
ref-edit2, edit1-edit2). Its ``p`` is then partial credit per object, the learned form of the toy
oracle's F1 version (docs/language.md 5.5).

The decision it learns is the one the toy oracle's ``scene`` mode pays for (the render holds the
target's objects), which is what a reward with the oracle's shape needs (docs/language.md 5.6).

    python -m genalign.toy.reward_models.scene_judge --out runs/toy-scene-judge [--views FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from genalign.rewards.svg.judge import PairJudge
from genalign.toy.reward_models.similarity import VIEWS, render_view_items, render_views
from genalign.toy.training import parameter_count, warmup_cosine

logger = logging.getLogger(__name__)

EVAL_SPLITS = {"rl_train": 303, "rl_heldout": 404, "unseen_combinations": 505}


@dataclass
class JudgeRecipe:
    """Data and training of ``toy-scene-judge``."""

    seed: int = 0  # initialisation and batches
    data_seed: int = 101  # the training scenes and their edits
    scenes: int = 16000  # training items (4 renders each) of the train prompt split
    canvas: int = 32
    shift: float = 0.15  # jitter, as toy-dreamsim's ds2 (docs/language.md 5.6)
    scale: float = 0.25
    width: int = 32
    embed: int = 128
    hidden: int = 256
    steps: int = 2500
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 1e-4
    warmup: int = 50
    flip: bool = True  # mirror each image left-right at random (the objects' multiset is unchanged)
    target: str = "same"  # "same" (P(same objects)) or "f1" (the multisets' F1, module docstring)
    log_every: int = 100

    def __post_init__(self) -> None:
        if self.target not in ("same", "f1"):
            raise ValueError(f"JudgeRecipe.target must be 'same' or 'f1', got {self.target!r}")


def _as_float(views: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: (v.float() / 255.0 if v.dtype == torch.uint8 else v.float()) for k, v in views.items()}


def _flip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    mask = torch.rand(images.shape[0], generator=generator) < 0.5
    return torch.where(mask[:, None, None, None], images.flip(-1), images)


F1_PAIRS = (("ref", "same"), ("ref", "edit1"), ("same", "edit1"), ("ref", "edit2"), ("edit1", "edit2"))


def multiset_f1(a: Sequence[Any], b: Sequence[Any]) -> float:
    """``2 |A ∩ B| / (|A| + |B|)`` of two multisets given as lists."""
    rest, common = list(b), 0
    for item in a:
        if item in rest:
            rest.remove(item)
            common += 1
    return 2.0 * common / max(len(a) + len(b), 1)


def render_views_f1(
    count: int, seed: int, split: str = "train", canvas: int = 32, shift: float = 0.15, scale: float = 0.25
) -> dict[str, torch.Tensor]:
    """:func:`render_views`' items plus ``"f1"`` ``[count, 5]``: the multiset F1 of each pair
    of :data:`F1_PAIRS`, from the scenes themselves."""
    views, multisets = render_view_items(count, seed, split, canvas, shift, scale)
    f1 = [[multiset_f1(sets[a], sets[b]) for a, b in F1_PAIRS] for sets in multisets]
    return {**views, "f1": torch.tensor(f1)}


def f1_pair_loss(judge: PairJudge, views: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """``target="f1"``: soft binary cross-entropy of the five pairs' logits against their F1."""
    n = views["ref"].shape[0]
    embedded = dict(zip(VIEWS, judge.embed(torch.cat([views[k] for k in VIEWS])).split(n), strict=True))
    logits = torch.stack([judge.compare(embedded[a], embedded[b]) for a, b in F1_PAIRS], dim=1)  # (n, 5)
    targets = views["f1"].float()
    loss = F.binary_cross_entropy_with_logits(logits, targets)
    error = (torch.sigmoid(logits) - targets).abs()
    return loss, {"acc_same": (error[:, 0] < 0.25).float().mean().item(), "f1_mae": error.mean().item()}


def pair_loss(judge: PairJudge, views: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """The judge's loss on one batch of views (module docstring) and its pair accuracies."""
    if "f1" in views:
        return f1_pair_loss(judge, views)
    n = views["ref"].shape[0]
    ref, same, edit1, edit2 = judge.embed(torch.cat([views[k] for k in VIEWS])).split(n)
    a = torch.cat([ref, ref, same, ref])
    b = torch.cat([same, edit1, edit1, edit2])
    labels = torch.cat([torch.ones(n), torch.zeros(3 * n)])
    weights = torch.cat([torch.full((n,), 1.0), torch.full((3 * n,), 1.0 / 3.0)])
    logits = judge.compare(a, b)
    loss = (F.binary_cross_entropy_with_logits(logits, labels, reduction="none") * weights).sum() / (2 * n)
    right = ((logits > 0).float() == labels).float()
    return loss, {
        "acc_same": right[:n].mean().item(),
        "acc_edit1": right[n : 3 * n].mean().item(),
        "acc_edit2": right[3 * n :].mean().item(),
    }


def train_judge(recipe: JudgeRecipe, views: dict[str, torch.Tensor] | None = None) -> tuple[PairJudge, list]:
    """Train a judge; ``views`` (``{view: [N, 3, H, W]}``, uint8 or [0, 1]) skips rendering."""
    torch.manual_seed(recipe.seed)
    if views is None:
        render = render_views_f1 if recipe.target == "f1" else render_views
        views = render(recipe.scenes, recipe.data_seed, "train", recipe.canvas, recipe.shift, recipe.scale)
    if recipe.target == "f1" and "f1" not in views:
        raise ValueError("JudgeRecipe.target='f1' needs views with an 'f1' entry (render_views_f1)")
    f1 = views["f1"] if recipe.target == "f1" else None
    views = _as_float({k: views[k] for k in VIEWS})
    count = views["ref"].shape[0]
    judge = PairJudge(recipe.width, recipe.embed, recipe.hidden)
    # what loading and evaluation need to know of its data, saved with the weights
    judge.config.update(
        image_size=recipe.canvas, shift=recipe.shift, scale=recipe.scale, target=recipe.target
    )
    optimizer = torch.optim.AdamW(judge.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, step / max(recipe.steps, 1), recipe.warmup)
    )
    generator = torch.Generator().manual_seed(recipe.seed)
    history: list[dict[str, float]] = []
    started = time.time()
    for step in range(recipe.steps):
        index = torch.randint(count, (recipe.batch_size,), generator=generator)
        batch = {k: v[index] for k, v in views.items()}
        if recipe.flip:
            batch = {k: _flip(v, generator) for k, v in batch.items()}
        if f1 is not None:
            batch["f1"] = f1[index]
        loss, accuracy = pair_loss(judge, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        history.append({"step": step, "loss": loss.item(), **accuracy})
        if recipe.log_every and (step + 1) % recipe.log_every == 0:
            recent = history[-recipe.log_every :]
            second = "acc_edit1" if "acc_edit1" in recent[0] else "f1_mae"
            logger.info(
                "step %d loss %.4f same %.3f %s %.3f (%.0f s)",
                step + 1,
                float(np.mean([h["loss"] for h in recent])),
                float(np.mean([h["acc_same"] for h in recent])),
                second,
                float(np.mean([h[second] for h in recent])),
                time.time() - started,
            )
    return judge.eval(), history


@torch.no_grad()
def evaluate_judge(
    judge: PairJudge, items: int = 512, splits: dict[str, int] | None = None
) -> dict[str, Any]:
    """Accuracy on fresh items of each split: same pairs called same, one-edit and two-edit pairs
    called different, with the jitter the judge was trained with; and the mean absolute error of
    ``p`` against the pairs' multiset F1 (what a ``target="f1"`` judge predicts)."""
    shift, scale = float(judge.config.get("shift", 0.15)), float(judge.config.get("scale", 0.25))
    out: dict[str, Any] = {}
    for split, seed in (splits or EVAL_SPLITS).items():
        views = render_views_f1(items, seed, split, int(judge.config.get("image_size", 32)), shift, scale)
        predicted = torch.stack([judge.probability(views[a], views[b]) for a, b in F1_PAIRS], dim=1)
        p_same, p_edit1, p_edit2 = predicted[:, 0], predicted[:, 1], predicted[:, 3]  # ref against each
        out[split] = {
            "same": round(float((p_same > 0.5).float().mean()), 4),
            "edit1": round(float((p_edit1 < 0.5).float().mean()), 4),
            "edit2": round(float((p_edit2 < 0.5).float().mean()), 4),
            "auc_same_vs_edit1": round(float((p_same[:, None] > p_edit1[None, :]).float().mean()), 4),
            "f1_mae": round(float((predicted - views["f1"]).abs().mean()), 4),
        }
    return out


def save_judge(judge: PairJudge, recipe: JudgeRecipe, folder: str | Path, scores: dict | None = None) -> Path:
    folder = judge.save(folder)
    card = {"recipe": asdict(recipe), "parameters": parameter_count(judge), "scores": scores or {}}
    (folder / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    lines = [
        "# toy-scene-judge",
        "",
        "P(two 32 px renders hold the same objects): `genalign.rewards.svg.judge.PairJudge`, trained by",
        "`python -m genalign.toy.reward_models.scene_judge` on toy-dreamsim's scene edits (no verifier).",
        "Used as `svg_fidelity`'s `judge` term (docs/language.md section 5.10).",
        "",
        f"Parameters: {parameter_count(judge):,}. Recipe: `{json.dumps(asdict(recipe))}`.",
        "",
        "| split | same called same | one edit called different | two edits | AUC same vs one edit | F1 error |",
        "|---|---|---|---|---|---|",
    ]
    for split, row in (scores or {}).items():
        lines.append(
            f"| {split} | {row['same']:.3f} | {row['edit1']:.3f} | {row['edit2']:.3f} "
            f"| {row['auc_same_vs_edit1']:.3f} | {row['f1_mae']:.3f} |"
        )
    (folder / "README.md").write_text("\n".join(lines) + "\n")
    return folder


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m genalign.toy.reward_models.scene_judge", description=__doc__
    )
    parser.add_argument("--out", required=True, help="folder for the judge (config, weights, card)")
    parser.add_argument("--views", help="a torch file of pre-rendered views {ref, same, edit1, edit2}")
    parser.add_argument("--eval-items", type=int, default=512)
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="a JudgeRecipe field"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    types = {f.name: f.type for f in fields(JudgeRecipe)}
    values: dict[str, Any] = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in types:
            parser.error(f"--set {item}: unknown field {name!r}; fields are {sorted(types)}")
        convert = {"int": int, "float": float, "bool": lambda v: v.lower() in ("1", "true", "yes")}
        try:
            values[name] = convert.get(str(types[name]), str)(value)
        except ValueError:
            parser.error(f"--set {item}: {value!r} is not a valid {types[name]}")
    try:
        recipe = JudgeRecipe(**values)
    except ValueError as error:  # the recipe's own checks, before any rendering
        parser.error(f"--set: {error}")
    if args.views and not Path(args.views).is_file():
        parser.error(f"--views {args.views}: no such file")
    views = torch.load(args.views) if args.views else None
    judge, _ = train_judge(recipe, views)
    scores = evaluate_judge(judge, args.eval_items) if args.eval_items else {}
    print(json.dumps(scores, indent=2))
    save_judge(judge, recipe, args.out, scores)


if __name__ == "__main__":
    main()
