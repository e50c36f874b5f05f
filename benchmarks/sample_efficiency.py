"""Sample efficiency: RL-held-out ShapesEval versus the number of generated images, per RL method.

Every method trains the same generator (default ``assets/models/toy-sd``) against the same reward
on the toy world's **RL-train** prompts (``genalign.toy.prompts.balanced_prompts("rl_train", 40)``:
the text of ``configs/toy/rl_train_prompts.txt``, 40 captions per GenEval category), with the same
budget of generated (decoded and scored) images; every ``--eval-every`` images the policy samples
the fixed **RL-held-out** evaluation set (``genalign.toy.evaluation.eval_set("rl_heldout", ...)``:
pretraining-split scenes that RL never trains on, ``--eval-images-per-category`` fixed seeds per
category) and ShapesEval scores it (GenEval-style overall accuracy, and per category).
``--eval-split unseen_combinations`` evaluates the compositional-generalisation probe instead.

Methods are recipes: a name and a nested dict merged into the shared base recipe, so a later method
is one more entry of :data:`METHODS` or of a ``--methods-file`` YAML list::

    - name: b2diffurl-3branches
      recipe: {train: {strategy: b2diffurl, method: b2diffurl, b2diffurl: {branches: 3}}}

Built in (sd family): ``grpo`` (PPO-clip on LoRA, groups of 5), ``b2diffurl`` (branched rollouts)
and ``nft`` (DiffusionNFT, full fine-tuning at 1e-4, 4 prompts x 16, the setting of
``configs/toy/demo.yaml`` and ``docs/toy_rl_study.md``); flow family: ``flow-grpo``,
``nft-6in6``, ``naive-6in24``, ``sol-rl-6in24-int8``. The sampler is the demo's (10 DDIM steps,
eta 1, guidance 2).

Images per step: ``groups`` draws ``prompts_per_step * group_size`` images, ``b2diffurl``
``prompts_per_step * group_size * branches`` (the shared prefixes are not images); another
strategy's spec gives ``images_per_step``. Each method runs ``budget // images_per_step`` steps.

Reward (the same for every method): the CLIP score of ``assets/models/toy-clip`` when that model
exists, else the verifier's dense form ``shapes_eval`` with ``partial=True`` (fraction of atomic
checks passed), an offline reward that needs no model. Say which reward was used when reporting
(it is in ``results.csv``).

Writes ``results.csv`` (one row per method, seed and evaluation; the last row of a run also holds
the training reward over its first and last quarter of steps), ``summary.md`` (RL-held-out overall
at each budget and the training-reward change: mean over seeds with a 95% t-interval over seeds)
and ``sample_efficiency.png`` (mean and 95% band) to ``--out``::

    python benchmarks/sample_efficiency.py --seeds 0 1 2        # toy-sd, grpo/b2diffurl/nft, 2048 images
    python benchmarks/sample_efficiency.py --model tiny:sd --budget 32 --eval-every 32 \\
        --eval-images-per-category 1 --out /tmp/se --set sampling.num_inference_steps=4 \\
        train.prompts_per_step=2 train.minibatch_size=2 train.b2diffurl.split_step_start=2  # smoke run
"""

from __future__ import annotations

import argparse
import copy
import csv
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
TOY_SD = ROOT / "assets" / "models" / "toy-sd"
TOY_CLIP = ROOT / "assets" / "models" / "toy-clip"

logger = logging.getLogger("sample_efficiency")

# Shared by every method: PPO-clip on LoRA, same learning rate and sampler.
BASE_TRAIN: dict[str, Any] = {
    "loss": "ppo_clip",
    "learning_rate": 3.0e-4,
    "ratio_reduction": "mean",
    "advantage_clip": 5.0,
    "inner_epochs": 1,
    "timestep_fraction": 1.0,
    "max_grad_norm": 1.0,
}

# Each method: the recipe fragment merged into the base. GRPO and B2-DiffuRL draw 40 images per
# step, DiffusionNFT 64.
METHODS: dict[str, dict[str, Any]] = {
    "grpo": {
        "train": {
            "method": "grpo",
            "strategy": "groups",
            "prompts_per_step": 8,
            "group_size": 5,
            "minibatch_size": 8,
            "advantage": "group",
            "clip_range": 1.0e-4,
        }
    },
    "b2diffurl": {
        "train": {
            "method": "b2diffurl",
            "strategy": "b2diffurl",
            "prompts_per_step": 8,
            "group_size": 1,
            "minibatch_size": 4,
            "clip_range": 0.1,
            # the paper's schedule (14 of 20) scaled to the sampler's T = 10 (split_step_end: null = T)
            "b2diffurl": {"split_step_start": 7, "split_step_end": None, "branches": 5, "history_steps": 8},
        }
    },
    # DiffusionNFT as docs/toy_rl_study.md found it works on single prompts and configs/toy/demo.yaml
    # uses it: full fine-tuning at 1e-4, groups of 16 over 4 prompts, 3 of 10 noise levels per sample.
    "nft": {
        "model": {"lora": None},
        "train": {
            "method": "diffusion_nft",
            "strategy": "groups",
            "loss": "nft",
            "learning_rate": 1.0e-4,
            "prompts_per_step": 4,
            "group_size": 16,
            "minibatch_size": 16,
            "timestep_fraction": 0.3,
            "advantage": "group",
            "advantage_std": "global",
            "adam_weight_decay": 0.0,
        },
    },
}
SD_METHODS = ["grpo", "b2diffurl", "nft"]


# Issue #10's comparison on the flow family (``--family flow --model assets/models/toy-flow``),
# scaled from Sol-RL's 24-in-96 to 6-in-24 per prompt so a CPU run fits: GRPO (PPO-clip on SDE
# rollouts), DiffusionNFT on 6 samples per prompt ("24-in-24"), naive scaling (24 full-precision
# samples, the best 3 and worst 3 trained on) and Sol-RL (24 int8 previews with fewer steps,
# best 3 + worst 3 regenerated in full precision). Every image counts, previews included.
FLOW_PROMPTS = 4
# what every flow method shares: the batch (6 trained samples per prompt) and group advantages
FLOW_BATCH: dict[str, Any] = {
    "prompts_per_step": FLOW_PROMPTS,
    "group_size": 6,
    "minibatch_size": 8,
    "advantage": "group",
    "advantage_std": "global",
}
SOL_KEEP: dict[str, Any] = {"pool_size": 24, "keep_top": 3, "keep_bottom": 3}
FLOW_METHODS: dict[str, dict[str, Any]] = {
    "flow-grpo": {
        "sampling": {"mode": "sde"},
        "train": {**FLOW_BATCH, "method": "flow_grpo", "strategy": "groups", "clip_range": 1.0e-4},
    },
    "nft-6in6": {
        "sampling": {"mode": "ode"},
        "train": {**FLOW_BATCH, "method": "diffusion_nft", "strategy": "groups", "loss": "nft"},
    },
    "naive-6in24": {
        "sampling": {"mode": "ode"},
        "train": {
            **FLOW_BATCH,
            "method": "sol_rl",
            "strategy": "sol_rl",
            "loss": "nft",
            "sol_rl": {**SOL_KEEP, "preview_steps": 0},
        },
    },
    "sol-rl-6in24-int8": {
        "sampling": {"mode": "ode"},
        "train": {
            **FLOW_BATCH,
            "method": "sol_rl",
            "strategy": "sol_rl",
            "loss": "nft",
            "sol_rl": {**SOL_KEEP, "preview_steps": 6, "preview_precision": "int8"},
        },
    },
}
METHODS.update(FLOW_METHODS)


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in recursively (neither is modified)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def default_reward() -> dict[str, Any]:
    """toy-clip's CLIP score when the model is there, else the verifier's dense (partial) score."""
    if TOY_CLIP.is_dir():
        return {"name": "clip", "kwargs": {"model": f"local-dir:{TOY_CLIP}", "pretrained": None}}
    return {"name": "shapes_eval", "kwargs": {"partial": True}}


def base_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe every method shares: the RL-train prompts balanced over categories, the demo's sampler."""
    from genalign.toy.prompts import balanced_prompts

    return {
        "name": "sample-efficiency",
        "model": {"family": args.family, "path": args.model, "lora": {"rank": 8, "alpha": 8}},
        "sampling": {"num_inference_steps": 10, "guidance_scale": 2.0, "eta": 1.0},
        "reward": default_reward(),
        "prompts": {"prompts": balanced_prompts("rl_train", 40)},
        "train": dict(BASE_TRAIN),
        "logging": {"progress": False, "keep_last": 1},
    }


def images_per_step(config: Any, spec: dict[str, Any]) -> int:
    """Generated images per training step of a recipe (see the module doc)."""
    if "images_per_step" in spec:
        return int(spec["images_per_step"])
    train = config.train
    if train.strategy == "groups":
        return train.samples_per_step
    if train.strategy == "b2diffurl":
        return train.samples_per_step * train.b2diffurl.branches
    if train.strategy == "sol_rl":
        sol = train.sol_rl
        if sol.preview_steps == 0:  # naive scaling: the pool itself is full precision, nothing regenerated
            return train.prompts_per_step * sol.pool_size
        return train.prompts_per_step * (sol.pool_size + sol.keep_top + sol.keep_bottom)
    raise ValueError(
        f"method {spec['name']!r}: strategy {train.strategy!r} has no known image count per step; "
        f"give images_per_step in its spec"
    )


def build_config(args: argparse.Namespace, spec: dict[str, Any], seed: int, run_dir: Path):
    """The method's RecipeConfig with ``num_steps`` set so that it spends the image budget."""
    from genalign.config import apply_overrides, from_dict
    from genalign.trainers.config import RecipeConfig

    data = merge(base_recipe(args), spec.get("recipe", {}))
    data = apply_overrides(data, list(args.set))
    data["train"]["seed"] = seed
    data["train"]["num_steps"] = 1
    data["logging"]["run_dir"] = str(run_dir)
    per_step = images_per_step(from_dict(RecipeConfig, data), spec)
    steps = args.budget // per_step
    if steps < 1:
        raise ValueError(
            f"method {spec['name']!r}: budget {args.budget} is below one step ({per_step} images)"
        )
    data["train"]["num_steps"] = steps
    return from_dict(RecipeConfig, data), per_step


def train_with_evaluations(
    trainer: Any,
    num_steps: int,
    per_step: int,
    eval_every: int,
    evaluate: Callable[[int, int, dict[str, Any], float], None],
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Run ``num_steps`` training steps of ``trainer`` (``per_step`` generated images each) and call
    ``evaluate(step, images, metrics, train_seconds)`` each time another ``eval_every`` images have
    been generated and after the last step; ``train_seconds`` is the training wall-clock so far,
    evaluations excluded. ``on_step(metrics)`` sees every step's metrics before any evaluation."""
    images, next_eval, seconds = 0, eval_every, 0.0
    for step in range(num_steps):
        tick = time.perf_counter()
        metrics = trainer.train_step(step)
        trainer.step = step + 1
        trainer.log(metrics)
        seconds += time.perf_counter() - tick
        images += per_step
        if on_step is not None:
            on_step(metrics)
        if images >= next_eval or step == num_steps - 1:
            evaluate(step + 1, images, metrics, seconds)
            while next_eval <= images:
                next_eval += eval_every


# The evaluation before training, shared by every run of one process with the same generator, sampler
# and evaluation set: every method starts from the same weights (LoRA adapters start at zero), and
# the evaluation seeds are fixed, so its images and score are the same for every method and seed.
_INITIAL_EVALUATION: dict[str, dict[str, Any]] = {}


def run_method(
    args: argparse.Namespace, spec: dict[str, Any], seed: int, items: list
) -> list[dict[str, Any]]:
    """Train one method with one seed; return its evaluation rows."""
    from genalign.toy.demo import evaluate_policy
    from genalign.trainers import build_trainer

    run_dir = Path(args.out) / "runs" / f"{spec['name']}-seed{seed}"
    config, per_step = build_config(args, spec, seed, run_dir)
    trainer = build_trainer(config)
    sampling = trainer.rollout_kwargs()
    rows: list[dict[str, Any]] = []
    reward_label = f"{config.reward.name} {config.reward.kwargs}"

    def evaluate(step: int, images: int, train_reward: float, train_seconds: float = 0.0) -> None:
        trainer.policy.denoiser.eval()
        key = repr((args.model, args.eval_split, len(items), sorted(sampling.items())))
        if step == 0 and key in _INITIAL_EVALUATION:
            result = _INITIAL_EVALUATION[key]
        else:
            result, _ = evaluate_policy(trainer.policy, items, sampling, batch_size=args.eval_batch_size)
            if step == 0:
                _INITIAL_EVALUATION[key] = result
        row = {
            "method": spec["name"],
            "seed": seed,
            "step": step,
            "images": images,
            "eval_split": args.eval_split,
            "eval_images": len(items),
            "model": args.model,
            "heldout_overall": result["overall"],
            "heldout_image_accuracy": result["image_accuracy"],
            "train_reward_mean": train_reward,
            "train_seconds": round(train_seconds, 2),
            "reward": reward_label,
        }
        row.update({f"heldout_{k}": v for k, v in result["per_category"].items()})
        rows.append(row)
        logger.info(
            "%s seed %d: %d images, %s ShapesEval %.4f",
            spec["name"],
            seed,
            images,
            args.eval_split,
            result["overall"],
        )

    evaluate(0, 0, float("nan"))
    start = time.perf_counter()
    rewards: list[float] = []

    def evaluate_after(step: int, images: int, metrics: dict[str, Any], seconds: float) -> None:
        evaluate(step, images, rewards[-1], seconds)

    train_with_evaluations(
        trainer,
        config.train.num_steps,
        per_step,
        args.eval_every,
        evaluate_after,
        lambda metrics: rewards.append(float(metrics["reward_mean"])),
    )
    quarter = max(1, len(rewards) // 4)
    rows[-1]["train_reward_first"] = statistics.mean(rewards[:quarter])
    rows[-1]["train_reward_last"] = statistics.mean(rewards[-quarter:])
    rows[-1]["wall_seconds"] = round(time.perf_counter() - start, 1)
    logger.info(
        "%s seed %d: %d steps in %.0f s",
        spec["name"],
        seed,
        config.train.num_steps,
        time.perf_counter() - start,
    )
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its ``level`` t-interval over ``values`` (nan for one value)."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, float("nan")
    from scipy import stats

    quantile = float(stats.t.ppf(0.5 + level / 2, len(values) - 1))
    return mean, quantile * statistics.stdev(values) / math.sqrt(len(values))


def _cell(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    if not values:
        return "-"
    mean, half = mean_ci(values)
    text = f"{scale * mean:.{digits}f}"
    return text if math.isnan(half) else f"{text} ± {scale * half:.{digits}f}"


def summarise(rows: list[dict[str, Any]], budgets: list[int] | None = None) -> str:
    """Markdown tables: RL-held-out overall (%, mean over seeds ± 95% t-interval) at each evaluation
    (the k-th evaluation of every run; a method whose step is not a divisor of ``--eval-every`` is
    evaluated at the first step past it, so the row names each method's image count); then the
    training-reward change per method (first quarter of the steps to the last, the same statistics).
    ``budgets`` (optional) keeps only the rows whose image counts are all at or below its largest.
    The start (0 images) is one evaluation every seed shares, so it has no interval over seeds; the
    intervals are over training seeds on one fixed evaluation set, so they leave out that set's own
    sampling error (about 4-5 points at 96 images)."""
    methods = list(dict.fromkeys(row["method"] for row in rows))
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        runs.setdefault((row["method"], row["seed"]), []).append(row)
    for evaluations in runs.values():
        evaluations.sort(key=lambda row: row["images"])
    depth = max((len(evaluations) for evaluations in runs.values()), default=0)
    lines = [
        "| images | " + " | ".join(methods) + " |",
        "|---|" + "---:|" * len(methods),
    ]
    for index in range(depth):
        cells, counts = [], []
        for method in methods:
            at = [ev[index] for (name, _), ev in runs.items() if name == method and len(ev) > index]
            counts += [int(row["images"]) for row in at]
            values = [float(row["heldout_overall"]) for row in at]
            if at and all(int(row["images"]) == 0 for row in at):  # the start: one shared evaluation
                values = values[:1]
            cells.append(_cell(values))
        counts = list(dict.fromkeys(counts))
        if budgets and max(counts, default=0) > max(budgets):
            continue
        lines.append(f"| {' / '.join(map(str, counts))} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| method | seeds | eval change (last - 0) | training reward, first quarter | last quarter | change | wall s / run |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for method in methods:
        runs = [row for row in rows if row["method"] == method]
        finals = [row for row in runs if "train_reward_first" in row]
        starts = {row["seed"]: float(row["heldout_overall"]) for row in runs if row["images"] == 0}
        gains = [
            float(row["heldout_overall"]) - starts[row["seed"]] for row in finals if row["seed"] in starts
        ]
        first = [float(row["train_reward_first"]) for row in finals]
        last = [float(row["train_reward_last"]) for row in finals]
        change = [b - a for a, b in zip(first, last, strict=True)]
        wall = [float(row["wall_seconds"]) for row in finals]
        lines.append(
            f"| {method} | {len(finals)} | {_cell(gains)} | {_cell(first, 1.0, 4)} | {_cell(last, 1.0, 4)} "
            f"| {_cell(change, 1.0, 4)} | {statistics.mean(wall) if wall else float('nan'):.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path, split: str = "rl_heldout") -> None:
    """RL-held-out ShapesEval against generated images (left) and training wall-clock (right): the
    mean over seeds, and its 95% t-interval as a band where there are several seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, label in (
        (axes[0], "images", "generated images"),
        (axes[1], "train_seconds", "training wall-clock (s)"),
    ):
        for method in dict.fromkeys(row["method"] for row in rows):
            # one point per evaluation budget; wall-clock differs per seed, so x is its mean there
            by_images: dict[int, list[dict[str, Any]]] = {}
            for row in rows:
                if row["method"] == method:
                    by_images.setdefault(int(row["images"]), []).append(row)
            groups = [by_images[images] for images in sorted(by_images)]
            xs = [statistics.mean(float(row.get(key, 0.0)) for row in group) for group in groups]
            stats = [mean_ci([float(row["heldout_overall"]) for row in group]) for group in groups]
            means = [100 * m for m, _ in stats]
            (line,) = ax.plot(xs, means, marker="o", ms=3, label=method)
            if any(not math.isnan(h) for _, h in stats):
                halves = [0.0 if math.isnan(h) else 100 * h for _, h in stats]
                lows = [m - h for m, h in zip(means, halves, strict=True)]
                highs = [m + h for m, h in zip(means, halves, strict=True)]
                ax.fill_between(xs, lows, highs, alpha=0.15, color=line.get_color())
        ax.set_xlabel(label)
        ax.set_ylabel(f"{split} ShapesEval (%)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load_methods(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The method specs to run: ``--methods-file`` entries, then ``--methods`` (default: the family's)."""
    specs = []
    if args.methods_file:
        import yaml

        listed = yaml.safe_load(Path(args.methods_file).read_text())
        if not isinstance(listed, list) or not all(isinstance(s, dict) and "name" in s for s in listed):
            raise ValueError(f"{args.methods_file}: expected a list of {{name, recipe}} mappings")
        specs += listed
    default = list(FLOW_METHODS) if args.family == "flow" else SD_METHODS
    for name in args.methods or ([] if specs else default):
        if name not in METHODS:
            raise ValueError(
                f"unknown method {name!r}; built in: {', '.join(METHODS)} (or use --methods-file)"
            )
        specs.append({"name": name, "recipe": METHODS[name]})
    return specs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(TOY_SD), help="generator: folder, hub id or tiny:NAME")
    parser.add_argument("--family", default="sd")
    parser.add_argument(
        "--methods",
        nargs="*",
        help=f"built-in methods ({', '.join(METHODS)}); default: the family's ({', '.join(SD_METHODS)} for sd)",
    )
    parser.add_argument("--methods-file", help="YAML list of {name, recipe[, images_per_step]}")
    parser.add_argument("--budget", type=int, default=2048, help="generated images per method and seed")
    parser.add_argument("--eval-every", type=int, default=256, help="images between evaluations")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds (use 3 or more)")
    parser.add_argument(
        "--eval-split",
        default="rl_heldout",
        choices=["rl_heldout", "unseen_combinations", "rl_train"],
        help="prompt set evaluated (default: RL-held-out)",
    )
    parser.add_argument(
        "--eval-images-per-category",
        type=int,
        default=16,
        help="fixed-seed images per category (6 categories)",
    )
    parser.add_argument("--eval-batch-size", type=int, default=16)
    parser.add_argument(
        "--set", nargs="*", default=[], help="dotted overrides of every recipe, e.g. train.learning_rate=1e-4"
    )
    parser.add_argument("--out", default="runs/sample_efficiency")
    parser.add_argument(
        "--from-csv",
        nargs="+",
        help="train nothing: merge these results.csv files (e.g. one per seed) into --out's summary and plot",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser.parse_args(argv)


def read_rows(paths: list[str]) -> list[dict[str, Any]]:
    """The rows of ``results.csv`` files (e.g. one per seed, run as separate processes), numbers parsed."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        with Path(path).open(newline="") as handle:
            for raw in csv.DictReader(handle):
                row: dict[str, Any] = {}
                for key, value in raw.items():
                    if value in (None, ""):
                        continue  # a column only some rows have (the run's last row)
                    try:
                        row[key] = int(value) if key in ("seed", "step", "images") else float(value)
                    except ValueError:
                        row[key] = value
                rows.append(row)
    return rows


def run_setting(rows: list[dict[str, Any]], key: str, default: Any) -> Any:
    """The one value of column ``key`` over ``rows`` (``default`` where no row has it, as in CSVs
    written before the column existed); rows that disagree are an error naming both values."""
    values = list(dict.fromkeys(row[key] for row in rows if key in row))
    if len(values) > 1:
        raise ValueError(f"the results mix runs with different {key}: {values[0]!r} and {values[1]!r}")
    return values[0] if values else default


def write_report(rows: list[dict[str, Any]], out: Path, args: argparse.Namespace, eval_images: int) -> str:
    """Write ``summary.md`` and ``sample_efficiency.png`` for ``rows``; return the tables. The
    model, evaluated split and image count are the rows' own (``--from-csv`` merges earlier runs),
    the command line's only for rows that lack them."""
    budgets = sorted({row["images"] for row in rows if row["images"] > 0})
    table = summarise(rows, budgets)
    seeds = sorted({row["seed"] for row in rows})
    split = run_setting(rows, "eval_split", args.eval_split)
    model = run_setting(rows, "model", args.model)
    eval_images = int(run_setting(rows, "eval_images", eval_images))
    (out / "summary.md").write_text(
        f"{split} ShapesEval (overall, %) vs generated images, mean over seeds ± 95% "
        f"t-interval; model {model}; reward {run_setting(rows, 'reward', '?')}; {eval_images} {split} "
        f"images; seeds {seeds}; training prompts: RL-train, balanced over categories.\n\n{table}"
    )
    plot(rows, out / "sample_efficiency.png", split)
    return table


def main(argv: list[str] | None = None) -> int:
    """Run every method for every seed, then write the CSV, the summary and the plot."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.from_csv:  # report only: merge earlier runs' results.csv
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        rows = read_rows(args.from_csv)
        write_csv(rows, out / "results.csv")
        from genalign.toy.evaluation import eval_set

        eval_images = len(eval_set(args.eval_split, images_per_category=args.eval_images_per_category))
        try:
            print(write_report(rows, out, args, eval_images))
        except ValueError as error:
            print(f"error: {' '.join(args.from_csv)}: {error}", file=sys.stderr)
            return 2
        return 0
    torch.set_num_threads(args.threads)
    if not args.model.startswith("tiny:") and not Path(args.model).exists() and args.model == str(TOY_SD):
        print(f"error: {TOY_SD} does not exist yet; train it or pass --model (e.g. tiny:sd)", file=sys.stderr)
        return 2
    if args.budget <= 0 or args.eval_every <= 0:
        print("error: --budget and --eval-every must be positive", file=sys.stderr)
        return 2
    from genalign.toy.evaluation import eval_set

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    items = eval_set(args.eval_split, images_per_category=args.eval_images_per_category)
    rows: list[dict[str, Any]] = []
    for spec in load_methods(args):
        for seed in args.seeds:
            rows += run_method(args, spec, seed, items)
            write_csv(rows, out / "results.csv")  # after every run: a long benchmark keeps its rows
    print(write_report(rows, out, args, len(items)))
    print(f"wrote {out / 'results.csv'}, {out / 'summary.md'}, {out / 'sample_efficiency.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
