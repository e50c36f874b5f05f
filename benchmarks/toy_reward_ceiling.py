"""How far can the demo's reward rise? Generators and ground-truth renders, in starting stds.

Issue #21 asks that the learned reward rise by one standard deviation of its start. Whether that
is possible depends on where the reward puts images a faithful generator could draw. On the demo's
RL-train evaluation items (the same prompts and seeds ``genalign demo`` scores before and after),
this draws each ``--model``'s samples with the demo recipe's sampler, renders a ground-truth scene
for every item, and scores all of them with each reward (the demo's learned reward, toy-vlm's
VQAScore, and the oracle control's ``mixed`` verifier reward). Each mean is given as an effect
in units of the first model's (the RL start's) across-image std, with the verifier's accuracy and
the reward's mean on correct and on wrong samples (its calibration), then per GenEval category in
that category's own starting std. ``docs/toy_rl_study.md``
(section 24) reports the numbers::

    python benchmarks/toy_reward_ceiling.py --models toy-sd-web70 toy-sd toy-sd-web
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GROUND_TRUTH = "ground truth"


def model_path(name: str) -> Path:
    """A folder as given (a run's ``final/``, say), else ``assets/models/<name>``."""
    return Path(name) if Path(name).exists() else ROOT / "assets/models" / name


def load_generator(name: str, start: str):
    """The sd-family policy of a model folder, or of a fully fine-tuned run's ``final/`` (only its
    ``unet/``): ``start``'s pipeline with that UNet's weights."""
    from diffusers import UNet2DConditionModel

    from genalign.policies import load_policy

    folder = model_path(name)
    if (folder / "model_index.json").exists() or not (folder / "unet").is_dir():
        return load_policy("sd", folder)
    policy = load_policy("sd", model_path(start))
    trained = UNet2DConditionModel.from_pretrained(folder / "unet")
    policy.denoiser.load_state_dict(trained.state_dict())
    return policy


def effect_sd(scores: Sequence[float], start: Sequence[float]) -> float:
    """``(mean(scores) - mean(start)) / std(start)`` (ddof 1): how many starting stds above the
    start a set of images scores, the unit of #21's "+1 starting sd"; NaN for a start with no
    spread."""
    spread = float(np.std(start, ddof=1)) if len(start) > 1 else 0.0
    if not spread > 0:
        return math.nan
    return (float(np.mean(scores)) - float(np.mean(start))) / spread


def zero_one_target(accuracy: float, n: int) -> float:
    """The accuracy a 0/1 reward must reach to rise one starting std from ``accuracy`` on ``n``
    images: ``p + sqrt(p (1 - p) n / (n - 1))`` (the std of n Bernoulli draws, ddof 1)."""
    return accuracy + math.sqrt(accuracy * (1 - accuracy) * n / (n - 1))


def ceiling_rows(
    scores: dict[str, dict[str, list[float]]], correct: dict[str, list[bool]], start: str
) -> list[dict]:
    """One row per (reward, image source): mean, effect in ``start``'s stds, accuracy, and the
    reward's mean over correct and over wrong images (None where there are none)."""
    rows = []
    for reward in next(iter(scores.values())):
        for source, by_reward in scores.items():
            values = np.asarray(by_reward[reward], dtype=np.float64)
            right = np.asarray(correct[source], dtype=bool)
            rows.append(
                {
                    "reward": reward,
                    "images": source,
                    "mean": float(values.mean()),
                    "effect_sd": effect_sd(values, scores[start][reward]),
                    "accuracy": float(right.mean()),
                    "mean_correct": float(values[right].mean()) if right.any() else None,
                    "mean_wrong": float(values[~right].mean()) if (~right).any() else None,
                }
            )
    return rows


def category_rows(
    scores: dict[str, dict[str, list[float]]], categories: Sequence[str], start: str
) -> list[dict]:
    """Per (reward, image source): each category's effect in that category's own starting std
    (:func:`genalign.toy.evaluation.category_effects`), where a reward's headroom is."""
    from genalign.toy.evaluation import category_effects

    rows = []
    for reward in scores[start]:
        for source, by_reward in scores.items():
            effects = category_effects(scores[start][reward], by_reward[reward], None, categories)
            rows.append(
                {
                    "reward": reward,
                    "images": source,
                    "effect_sd_per_category": {name: e.effect for name, e in effects.items()},
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    from genalign.rewards import load_reward
    from genalign.toy.demo import ORACLE_REWARDS
    from genalign.toy.evaluation import eval_set_for_images, evaluate_policy, ground_truth_renders
    from genalign.toy.shapes_eval import evaluate
    from genalign.trainers import build_trainer, load_recipe
    from genalign.trainers.recipe_paths import resolve_recipe_paths

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["toy-sd-web70", "toy-sd"],
        help="names under assets/models or folders (a run's final/ too); the first is the start",
    )
    parser.add_argument(
        "--recipe", default=str(ROOT / "configs/toy/demo.yaml"), help="its sampler and learned reward"
    )
    parser.add_argument(
        "--images", type=int, default=324, help="RL-train evaluation items (the demo's default)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the demo's train.seed, which picks the items")
    parser.add_argument("--out", default=None, help="also write the per-image scores here (JSON)")
    args = parser.parse_args(argv)

    items = eval_set_for_images("rl_train", args.images, seed=args.seed)
    prompts = [prompt.caption for prompt, _ in items]
    config = load_recipe(args.recipe, [f"model.path={model_path(args.models[0])}"])
    config = resolve_recipe_paths(config, Path(args.recipe).parent)  # the reward is loaded here too
    trainer = build_trainer(config, base_dir=Path(args.recipe).parent)  # the recipe's reward and sampler
    sampling = trainer.rollout_kwargs()
    oracle_name, oracle_kwargs = ORACLE_REWARDS["mixed"]
    rewards = {
        f"learned ({config.reward.name})": trainer.reward,
        "oracle mixed": load_reward(oracle_name, **copy.deepcopy(oracle_kwargs)),
    }

    def score(images: torch.Tensor) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for name, reward in rewards.items():
            values: list[float] = []
            for start in range(0, len(prompts), 64):
                chunk = images[start : start + 64]
                values += reward(chunk, prompts[start : start + 64]).scores.float().tolist()
            out[name] = values
        return out

    scores: dict[str, dict[str, list[float]]] = {}
    correct: dict[str, list[bool]] = {}
    for model in args.models:
        policy = trainer.policy if model == args.models[0] else load_generator(model, args.models[0])
        result, images = evaluate_policy(policy, items, sampling)
        scores[model] = score(images)
        correct[model] = [bool(s["correct"]) for s in result["per_sample"]]
    truth = ground_truth_renders(items, images.shape[-1])  # the verifier checks them too
    scores[GROUND_TRUTH] = score(truth)
    correct[GROUND_TRUTH] = [
        bool(s["correct"]) for s in evaluate(truth, [p.spec for p, _ in items])["per_sample"]
    ]

    if args.out:
        Path(args.out).write_text(json.dumps({"scores": scores, "correct": correct}) + "\n", encoding="utf-8")
    for row in ceiling_rows(scores, correct, args.models[0]):
        print(json.dumps(row))
    categories = [prompt.category for prompt, _ in items]
    for row in category_rows(scores, categories, args.models[0]):
        print(json.dumps(row))
    start_accuracy = float(np.mean(correct[args.models[0]]))
    print(
        json.dumps(
            {"zero_one_target": zero_one_target(start_accuracy, len(items)), "start_accuracy": start_accuracy}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
