"""``python -m genalign.toy.reward_models {toy-clip,toy-vlm} --out DIR``: train (or, with
``--evaluate-only``, re-evaluate), save, evaluate and write the model card."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genalign.toy.reward_models.card import continued_record, write_card
from genalign.toy.reward_models.clip import CLIPRecipe, save_clip, train_clip
from genalign.toy.reward_models.evaluate import MODEL_NAMES, evaluate_reward_model, subset_scores
from genalign.toy.reward_models.vlm_model import VLMRecipe
from genalign.toy.reward_models.vlm_train import save_vlm, train_vlm

# the command-line options that set VLMRecipe fields of the same name
VLM_OPTIONS = (
    "init",
    "lr",
    "vision_init",
    "vision_lr_scale",
    "caption_weight",
    "vision_feature_layer",
    "task_mix",
    "question_weight",
    "scenes_per_prompt",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m genalign.toy.reward_models",
        description="Train a toy-world reward model and write its card.",
    )
    parser.add_argument("model", choices=MODEL_NAMES)
    parser.add_argument("--out", required=True, help="output folder (e.g. assets/models/toy-clip)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="override the recipe's step count")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--max-minutes", type=float, default=None, help="wall-clock budget of the training loop"
    )
    parser.add_argument(
        "--evaluate-only", action="store_true", help="re-evaluate a trained folder and rewrite its card"
    )
    parser.add_argument(
        "--init", help="toy-vlm: a trained toy-vlm folder to continue training from (same options)"
    )
    parser.add_argument("--lr", type=float, help="toy-vlm: the peak learning rate")
    parser.add_argument(
        "--vision-init", help="toy-vlm: a toy-clip folder whose image tower starts the vision tower"
    )
    parser.add_argument(
        "--vision-lr-scale", type=float, help="toy-vlm: the vision tower's lr relative to the rest"
    )
    parser.add_argument(
        "--caption-weight", type=float, help="toy-vlm: weight of the captioning (feature-alignment) loss"
    )
    parser.add_argument(
        "--question-weight",
        type=float,
        help="toy-vlm: weight of the next-token loss on the questions of true yes/no chats",
    )
    parser.add_argument(
        "--scenes-per-prompt",
        type=int,
        help="toy-vlm: random scenes rendered per train prompt (the training bank's size)",
    )
    parser.add_argument(
        "--vision-feature-layer", type=int, help="toy-vlm: the vision layer the projector reads"
    )
    parser.add_argument(
        "--task-mix",
        type=float,
        nargs=3,
        metavar=("YES_NO", "COMPARATIVE", "RATING"),
        help="toy-vlm: the three tasks' shares of a batch",
    )
    return parser


def recorded_command(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The command line as the card records it, and the VLMRecipe options it sets."""
    command = f"python -m genalign.toy.reward_models {args.model} --out {args.out} --seed {args.seed}"
    if args.steps is not None:
        command += f" --steps {args.steps}"
    if args.max_minutes is not None:
        command += f" --max-minutes {args.max_minutes:g}"
    vlm_options = {}
    for name in VLM_OPTIONS:  # in the order the recorded commands list them
        value = getattr(args, name)
        if value is None:
            continue
        vlm_options[name] = tuple(value) if isinstance(value, list) else value
        shown = " ".join(f"{v:g}" for v in value) if isinstance(value, list) else value
        shown = f"{shown:g}" if isinstance(shown, float) else shown
        command += f" --{name.replace('_', '-')} {shown}"
    return command, vlm_options


def train_command(
    args: argparse.Namespace, command: str, vlm_options: dict[str, Any]
) -> tuple[Any, dict[str, Any], str]:
    """Train and save the model; returns (recipe, training record, command record)."""
    out = Path(args.out)
    recipe = (CLIPRecipe if args.model == "toy-clip" else VLMRecipe)(seed=args.seed)
    recipe = replace(recipe, steps=args.steps) if args.steps is not None else recipe
    recipe = replace(recipe, max_minutes=args.max_minutes, **vlm_options)
    if args.model == "toy-clip":
        model, training = train_clip(recipe)
        save_clip(model, recipe, out)
    else:
        model, processor, training = train_vlm(recipe)
        save_vlm(model, processor, out)
    training = {
        "parameters": training["parameters"],
        "seconds": training["seconds"],
        "steps": training["steps"],
        "final_loss": float(np.mean(training["losses"][-50:])),
        "first_loss": float(np.mean(training["losses"][:50])),
    }
    if recipe.init is not None:  # a continued run: its card covers every stage
        previous = json.loads((Path(recipe.init) / "card.json").read_text(encoding="utf-8"))
        command, training = continued_record(previous, command, training)
    # the recipe and training record first, so a failed evaluation can be rerun (--evaluate-only)
    (out / "card.json").write_text(
        json.dumps({"command": command, "recipe": asdict(recipe), "training": training}, indent=2) + "\n",
        encoding="utf-8",
    )
    return recipe, training, command


def recorded_run(args: argparse.Namespace) -> tuple[Any, dict[str, Any], str]:
    """(recipe, training record, command record) of an already trained folder (``--evaluate-only``)."""
    card = json.loads((Path(args.out) / "card.json").read_text(encoding="utf-8"))
    recipe_type = CLIPRecipe if args.model == "toy-clip" else VLMRecipe
    recipe = recipe_type(**{k: tuple(v) if isinstance(v, list) else v for k, v in card["recipe"].items()})
    return recipe, card["training"], card["command"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # a no-op when logging is set up
    torch.set_num_threads(args.threads)
    command, vlm_options = recorded_command(args)
    if vlm_options and args.model != "toy-vlm":
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in VLM_OPTIONS)
        parser.error(f"{flags} apply to toy-vlm only")
    if args.evaluate_only:
        recipe, training, command = recorded_run(args)
    else:
        recipe, training, command = train_command(args, command, vlm_options)
    out = Path(args.out)
    scores = evaluate_reward_model(args.model, out)
    subset = subset_scores(args.model, out)
    write_card(args.model, out, recipe, training, scores, subset, command)
    print(json.dumps({"scores": scores, "subset": subset}, indent=2))
    return 0
