"""Does a learned reward rank samples of one prompt as the verifier does? Within-prompt AUC by category.

Group-relative advantages (GRPO, DiffusionNFT) compare samples of the *same* prompt, so what a
reward must get right is their order, not the order across prompts. For ``--per-category`` prompts
of each GenEval category of the RL-train prompt file, ``--group`` samples are drawn with a recipe's
sampler from the toy generator, scored by the ShapesEval verifier (0/1) and by each learned reward,
and each reward's AUC against the verifier is taken inside every group that has both outcomes
(0.5: no information; 1: the reward orders every correct sample above every wrong one), then
averaged per category. ``docs/toy_rl_study.md`` (section 5) reports the numbers::

    python benchmarks/toy_reward_ranking.py --per-category 8 --group 8
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REWARDS = {
    "toy-vlm VQAScore": ("vlm_yes", {"model": str(ROOT / "assets/models/toy-vlm"), "batch_size": 64}),
    "toy-clip CLIPScore": (
        "clip",
        {"model": f"local-dir:{ROOT / 'assets/models/toy-clip'}", "pretrained": None},
    ),
}


def auc(positives: Sequence[float], negatives: Sequence[float]) -> float | None:
    """P(a random positive scores above a random negative), ties counting one half (Mann-Whitney);
    None when either side is empty."""
    if not positives or not negatives:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def within_prompt_auc(rows: Sequence[dict], key: str) -> dict[str, tuple[float, int]]:
    """Mean within-group AUC of score ``key`` per category: ``{category: (mean AUC, groups)}``,
    over the groups (rows sharing a ``prompt``) that hold both a correct and a wrong sample."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["prompt"], []).append(row)
    per_category: dict[str, list[float]] = {}
    for group in groups.values():
        value = auc([r[key] for r in group if r["correct"]], [r[key] for r in group if not r["correct"]])
        if value is not None:
            per_category.setdefault(group[0]["category"], []).append(value)
    return {c: (statistics.fmean(v), len(v)) for c, v in sorted(per_category.items())}


def main(argv: list[str] | None = None) -> int:
    from genalign.policies import load_policy
    from genalign.rewards import load_reward
    from genalign.toy.prompts import balanced_prompts, prompts_for
    from genalign.toy.shapes_eval import evaluate

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-category", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--guidance", type=float, default=2.0)
    parser.add_argument("--eta", type=float, default=1.0)
    parser.add_argument("--out", default=None, help="also write the per-sample rows here (JSON)")
    parser.add_argument("--model", default=str(ROOT / "assets/models/toy-sd"), help="the sd-family generator")
    parser.add_argument(
        "--vlm",
        action="append",
        default=[],
        help="also rank with this toy VLM folder's VQAScore (e.g. assets/models/toy-vlm-iqa); repeatable",
    )
    args = parser.parse_args(argv)

    specs = {p.caption: p for p in prompts_for("rl_train")}
    by_category: dict[str, list] = {}
    for caption in dict.fromkeys(balanced_prompts("rl_train")):  # the demo's RL-train prompt file
        by_category.setdefault(specs[caption].category, []).append(specs[caption])
    prompts = []
    for category in sorted(by_category):
        chosen = list(by_category[category])
        random.Random(args.seed).shuffle(chosen)
        prompts += chosen[: args.per_category]

    policy = load_policy("sd", args.model)
    chosen_rewards = dict(REWARDS)
    for folder in args.vlm:
        chosen_rewards[f"{Path(folder).name} VQAScore"] = ("vlm_yes", {"model": folder, "batch_size": 64})
    rewards = {name: load_reward(kind, **kwargs) for name, (kind, kwargs) in chosen_rewards.items()}
    rows = []
    for index, prompt in enumerate(prompts):
        seeds = torch.arange(args.group) + 1000 * index + 100_003 * args.seed
        images = policy.rollout(
            [prompt.caption] * args.group,
            seeds=seeds,
            num_inference_steps=args.steps,
            guidance_scale=args.guidance,
            eta=args.eta,
        ).images.float()
        correct = [s["correct"] for s in evaluate(images, [prompt.spec] * args.group)["per_sample"]]
        scores = {
            name: r(images, [prompt.caption] * args.group).scores.float().tolist()
            for name, r in rewards.items()
        }
        for j in range(args.group):
            rows.append(
                {"prompt": prompt.caption, "category": prompt.category, "correct": bool(correct[j])}
                | {name: scores[name][j] for name in rewards}
            )
    if args.out:
        Path(args.out).write_text(json.dumps(rows) + "\n", encoding="utf-8")
    for name in rewards:
        table = within_prompt_auc(rows, name)
        groups = sum(n for _, n in table.values())
        overall = statistics.fmean(a for a, n in table.values() for _ in range(n)) if groups else float("nan")
        print(json.dumps({"reward": name, "within_prompt_auc": table, "all": overall, "groups": groups}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
