"""Learning-dynamics study on the toy world: one recipe, a list of overrides, curves and a verdict.

Each run trains a recipe (default ``configs/toy/demo.yaml``) with ``key=value`` overrides, logs the
trainer's per-step diagnostics (reward, verifier monitor, gradient norm, approx_kl, clipfrac,
zero-variance groups, within-group reward std, parameter change) and evaluates ShapesEval on a
fixed evaluation set before and after. ``--prompts`` picks the training prompts: a caption (the
single-prompt case), ``rl_train`` (every RL-train prompt) or a prompt file. The evaluation set is
the training prompts on fixed seeds for a caption, else the RL-held-out set (``--eval-images``).

One JSON line per run is appended to ``--out/results.jsonl``; the metrics of each run stay in its
run folder. ``docs/toy_rl_study.md`` reports what these runs measured::

    python benchmarks/toy_rl_study.py --name grpo-1prompt --oracle correct \\
        --prompts "a photo of a black circle and a red square" train.num_steps=40
    python benchmarks/toy_rl_study.py --plot grpo-1prompt nft-1prompt --plot-path docs/figures/x.png
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

logger = logging.getLogger("toy_rl_study")


def _eval_items(prompts: str, eval_images: int, seed: int) -> list[Any]:
    from genalign.toy.evaluation import eval_set_for_images
    from genalign.toy.prompts import PromptSpec, prompts_for

    if prompts in ("rl_train", "rl_heldout") or prompts.endswith(".txt"):
        return eval_set_for_images("rl_heldout", eval_images, seed=seed)
    spec = next(p for p in prompts_for("all") if p.caption == prompts)
    return [(PromptSpec(spec.caption, spec.category, spec.spec), 10_007 * i + 17) for i in range(eval_images)]


def _prompt_overrides(prompts: str) -> list[str]:
    if prompts == "rl_train":
        return [f"prompts.file={ROOT / 'configs' / 'toy' / 'rl_train_prompts.txt'}"]
    if prompts.endswith(".txt"):
        return [f"prompts.file={Path(prompts).resolve()}"]
    return [f"prompts.prompts={json.dumps([prompts])}"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from genalign.toy.evaluation import evaluate_policy, paired_change_interval
    from genalign.trainers.config import load_recipe
    from genalign.trainers.trainer import build_trainer

    overrides = [f"name={args.name}", f"logging.run_dir={args.out}/runs/{{name}}", "logging.sample_every=0"]
    overrides += ["logging.progress=false"] + _prompt_overrides(args.prompts)
    if args.oracle:
        from genalign.toy.demo import ORACLE_REWARDS

        name, kwargs = ORACLE_REWARDS[args.oracle]
        overrides += [f"reward.name={name}", f"reward.kwargs={json.dumps(kwargs)}"]
    overrides += list(args.overrides)
    config = load_recipe(args.recipe, overrides)
    torch.manual_seed(config.train.seed)
    trainer = build_trainer(config, base_dir=Path(args.recipe).parent)
    sampling = {k: v for k, v in trainer.rollout_kwargs().items() if v is not None}
    items = _eval_items(args.prompts, args.eval_images, args.eval_seed)
    start = time.perf_counter()
    before, _ = evaluate_policy(trainer.policy, items, sampling, batch_size=64)
    history = trainer.train()
    after, _ = evaluate_policy(trainer.policy, items, sampling, batch_size=64)
    seconds = time.perf_counter() - start
    rewards = [m["reward_mean"] for m in history if not m.get("skipped")]
    window = max(1, min(10, len(rewards) // 4))
    result = {
        "name": args.name,
        "prompts": args.prompts,
        "oracle": args.oracle,
        "overrides": list(args.overrides),
        "eval_images": len(items),
        "eval_before": before["overall"],
        "eval_after": after["overall"],
        "per_category_before": before["per_category"],
        "per_category_after": after["per_category"],
        "eval_change_ci": list(
            paired_change_interval(
                [float(s["correct"]) for s in before["per_sample"]],
                [float(s["correct"]) for s in after["per_sample"]],
                [s["category"] for s in before["per_sample"]],
            )
        ),
        "reward_first": statistics.fmean(rewards[:window]),
        "reward_last": statistics.fmean(rewards[-window:]),
        "steps": len(history),
        "seconds": seconds,
    }
    for key in (
        "approx_kl",
        "clipfrac",
        "grad_norm",
        "param_change",
        "zero_variance_groups",
        "group_reward_std",
    ):
        values = [m[key] for m in history if key in m and math.isfinite(m[key])]
        if values:
            result[f"{key}_mean"] = statistics.fmean(values)
    return result


def plot(out: Path, names: list[str], path: Path, window: int = 5) -> Path:
    """The training reward (a running mean over ``window`` steps) of the named runs in one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name in names:
        lines = (out / "runs" / name / "metrics.jsonl").read_text().splitlines()
        rewards = [json.loads(line)["reward_mean"] for line in lines if line.strip()]
        smooth = [statistics.fmean(rewards[max(0, i - window + 1) : i + 1]) for i in range(len(rewards))]
        ax.plot(range(len(smooth)), smooth, label=name)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"reward on the rollouts (running mean of {window})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plot", nargs="+", default=None, help="plot these runs' reward curves and exit")
    parser.add_argument("--plot-path", default="docs/figures/toy_rl_study.png")
    parser.add_argument("--name", default=None)
    parser.add_argument("--recipe", default=str(ROOT / "configs" / "toy" / "demo.yaml"))
    parser.add_argument("--prompts", default="rl_train", help="a caption, rl_train, or a prompt file")
    parser.add_argument(
        "--oracle", choices=["correct", "partial", "mixed"], default=None, help="train on the verifier"
    )
    parser.add_argument("--eval-images", type=int, default=64)
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument("--out", default="runs/study")
    parser.add_argument("overrides", nargs="*", help="recipe key=value overrides")
    args = parser.parse_args(argv)
    if args.plot:
        print(plot(Path(args.out), args.plot, Path(args.plot_path)))
        return 0
    if not args.name:
        parser.error("--name is required for a run")
    logging.basicConfig(level=logging.WARNING)
    result = run(args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / "results.jsonl", "a") as handle:
        handle.write(json.dumps(result) + "\n")
    print(
        f"{result['name']}: eval {result['eval_before']:.3f} -> {result['eval_after']:.3f} | reward "
        f"{result['reward_first']:.3f} -> {result['reward_last']:.3f} | {result['steps']} steps "
        f"{result['seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
