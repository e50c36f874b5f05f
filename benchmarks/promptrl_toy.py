"""PromptRL on the toy world: joint rewriter + generator vs generator-only GRPO vs LM-only, per image.

Issue #24 item 7. Every arm runs ``configs/toy/promptrl.yaml``'s recipe (the toy rewriter
``assets/models/toy-rewriter`` rewrites each paraphrased RL-train prompt 8 times, toy-sd draws each
rewrite, ShapesEval scores the image against the original prompt plus a format reward, one group
advantage for both policies) and they differ only by ``train.prompt_rewrite.trains``:

- ``joint``: ``both`` (PromptRL);
- ``generator-only``: ``generator``, the rewriter frozen: GRPO of the generator alone (PPO-clip
  1e-4, KL 0.01) on the frozen rewriter's rewrites. The paper's "flow-only" baseline trains a flow
  model; the default recipe's generator is toy-sd (the sd family, DDIM eta 1 for the SDE steps),
  set when the toy-flow of the time passed ShapesEval on ~1% of its samples;
  ``--recipe configs/toy/promptrl_flow.yaml`` runs the same arms on the retrained toy-flow (flow SDE
  on the first 6 of 10 steps, guidance 4.5, Flow-GRPO on a LoRA), where this arm is flow-only GRPO;
- ``lm-only``: ``rewriter``, the generator frozen (and sampled by ODE during training, UniRL's
  prompt-only trainer).

Every step draws ``prompts_per_step * group_size`` images (16) in every arm, so equal steps are equal
image budgets. Arms are recipe fragments merged into the recipe (:data:`ARMS`; ``--set`` overrides
every arm).

Evaluation (before training and every ``--eval-every`` images): a fixed set of **paraphrased
RL-held-out** prompts, ``eval_set("rl_heldout", k)`` (k fixed-seed images per GenEval category)
with its i-th caption replaced by ``genalign.toy.paraphrase.paraphrase(prompt, 0, i)`` (as
``python -m genalign.toy.rewriter gap`` pairs them). Each paraphrase goes through the pipeline as
inference runs it, the same in all three arms: the arm's current rewriter (frozen in
``generator-only``) writes one completion of the recipe's template with the recipe's language
sampling (temperature 1.0 unless ``--rewrite-temperature``) from the item's fixed seed; the refined
prompt is the last ``<answer>`` (else the paraphrase itself, the recipe's ``fallback``); the arm's
current generator draws it with the recipe's sampling (toy-sd: 10 steps, the first 6 DDIM eta 1, guidance 2)
from the same seed; ShapesEval scores it against the paraphrase's canonical spec
(``genalign.toy.evaluation.evaluate_policy``). Also recorded: the fraction of rewrites that are the
exact canonical caption, and, once, two references with the initial generator: the raw paraphrase
drawn without a rewriter, and the canonical caption (a perfect rewriter).

Writes ``results.csv`` (one row per arm, seed and evaluation), ``summary.md`` (score per budget,
mean over seeds ± 95% t-interval; per arm before / after / change, and the images each arm needs to
reach the generator-only arm's final mean score, linearly interpolated on its mean curve) and
``promptrl_toy.png`` to ``--out``::

    OMP_NUM_THREADS=1 python benchmarks/promptrl_toy.py --seeds 0 --budget 1024 --out runs/prl/seed0
    python benchmarks/promptrl_toy.py --from-csv runs/prl/seed{0,1,2}/results.csv --out runs/prl/merged
    OMP_NUM_THREADS=1 python benchmarks/promptrl_toy.py --recipe configs/toy/promptrl_flow.yaml \
        --seeds 0 --budget 512 --eval-every 256 --eval-images-per-category 12 --out runs/prl-flow/seed0
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sample_efficiency import mean_ci, merge, read_rows, train_with_evaluations, write_csv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "toy" / "promptrl.yaml"
logger = logging.getLogger("promptrl_toy")

ARMS: dict[str, dict[str, Any]] = {
    "joint": {"train": {"prompt_rewrite": {"trains": "both"}}},
    "generator-only": {"train": {"prompt_rewrite": {"trains": "generator"}}},
    "lm-only": {"train": {"prompt_rewrite": {"trains": "rewriter"}}},
}
TARGET_ARM = "generator-only"  # the baseline whose final score the others race to
PARAPHRASE_SEED = 0


def build_config(args: argparse.Namespace, arm: str, seed: int, run_dir: Path):
    """The arm's RecipeConfig (the recipe, the arm's fragment, ``--set``), with ``num_steps`` set
    so that it draws ``--budget`` images; returns ``(config, images_per_step)``."""
    import yaml

    from genalign.config import apply_overrides, from_dict
    from genalign.trainers.config import RecipeConfig

    data = merge(yaml.safe_load(Path(args.recipe).read_text()), ARMS[arm])
    data = apply_overrides(data, list(args.set))
    data["train"]["seed"] = seed
    data["train"]["num_steps"] = 1
    data["logging"] = merge(
        data.get("logging", {}),
        {"run_dir": str(run_dir), "progress": False, "overwrite": True, "param_change": False},
    )
    per_step = from_dict(RecipeConfig, data).train.samples_per_step  # every row is drawn, in every arm
    steps = args.budget // per_step
    if steps < 1:
        raise ValueError(f"budget {args.budget} is below one step ({per_step} images)")
    data["train"]["num_steps"] = steps
    return from_dict(RecipeConfig, data), per_step


def eval_items(images_per_category: int) -> list[tuple[Any, int]]:
    """(paraphrase, seed) pairs: the i-th item of ``eval_set("rl_heldout", k)`` reworded by
    ``paraphrase(prompt, PARAPHRASE_SEED, i)`` (its spec stays the canonical caption's)."""
    from genalign.toy.evaluation import eval_set
    from genalign.toy.paraphrase import paraphrase

    items = eval_set("rl_heldout", images_per_category)
    return [(paraphrase(prompt, PARAPHRASE_SEED, i), seed) for i, (prompt, seed) in enumerate(items)]


@torch.no_grad()
def rewrite(rewriter: Any, texts: list[str], seeds: list[int], config: Any, args: argparse.Namespace):
    """One rewrite per text from its seed, as the strategy samples (template, language settings,
    fallback); ``--rewrite-temperature`` replaces the recipe's temperature. Returns the refined
    prompts and whether each completion held an answer tag."""
    from genalign.algorithms.prompt_rewrite import GENEVAL_TEMPLATE, refine_prompts

    options = config.train.prompt_rewrite
    template = options.template or GENEVAL_TEMPLATE
    kwargs = config.sampling.language.rollout_kwargs()
    if args.rewrite_temperature is not None:
        kwargs["temperature"] = args.rewrite_temperature
    completions: list[str] = []
    for start in range(0, len(texts), args.eval_batch_size):
        chunk = texts[start : start + args.eval_batch_size]
        out = rewriter.rollout(
            [template.format(prompt=x) for x in chunk],
            seeds=torch.tensor(seeds[start : start + len(chunk)], dtype=torch.long),
            **kwargs,
        )
        completions += list(out.completions)
    refined, tagged = refine_prompts(completions, texts, options.fallback)
    return list(refined), [bool(t) for t in tagged.tolist()]


def evaluate_pipeline(
    rewriter: Any, generator: Any, items: list, sampling: dict, config: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """ShapesEval of rewriter -> generator on the paraphrased items (rewriter None: the prompts as
    given); the overall score, image accuracy, per category, answer and canonical rates."""
    from genalign.toy.evaluation import evaluate_policy
    from genalign.toy.prompts import PromptSpec

    texts = [item.text for item, _ in items]
    seeds = [seed for _, seed in items]
    refined, tagged = (texts, [False] * len(texts))
    if rewriter is not None:
        refined, tagged = rewrite(rewriter, texts, seeds, config, args)
    drawn = [
        (PromptSpec(q, item.category, item.spec), s) for q, (item, s) in zip(refined, items, strict=True)
    ]
    result, _ = evaluate_policy(generator, drawn, sampling, batch_size=args.eval_batch_size)
    canonical = [q == item.canonical for q, (item, _) in zip(refined, items, strict=True)]
    return {
        "heldout_overall": result["overall"],
        "heldout_image_accuracy": result["image_accuracy"],
        "answer_rate": float(statistics.mean(tagged)),
        "canonical_rate": float(statistics.mean(canonical)),
        **{f"heldout_{k}": v for k, v in result["per_category"].items()},
    }


# The evaluations before training are the same in every run of a process: every arm starts from the
# same weights (full fine-tuning from the shipped models) and the evaluation seeds are fixed.
_INITIAL: dict[str, dict[str, Any]] = {}


def initial_evaluation(trainer: Any, items: list, sampling: dict, args: argparse.Namespace) -> dict[str, Any]:
    """The step-0 evaluation and the two references (no rewriter; canonical captions)."""
    from genalign.toy.paraphrase import Paraphrase

    key = repr((args.recipe, args.set, len(items), args.rewrite_temperature, sorted(sampling.items())))
    if key not in _INITIAL:
        generator, config = trainer.policy["generator"], trainer.config
        row = evaluate_pipeline(trainer.policy["rewriter"], generator, items, sampling, config, args)
        raw = evaluate_pipeline(None, generator, items, sampling, config, args)
        canon = [(Paraphrase(p.canonical, p.canonical, p.category, p.spec, ()), s) for p, s in items]
        oracle = evaluate_pipeline(None, generator, canon, sampling, config, args)
        row["no_rewriter_overall"] = raw["heldout_overall"]
        row["canonical_caption_overall"] = oracle["heldout_overall"]
        _INITIAL[key] = row
    return dict(_INITIAL[key])


def run_arm(args: argparse.Namespace, arm: str, seed: int, items: list) -> list[dict[str, Any]]:
    """Train one arm with one seed; return its evaluation rows."""
    from genalign.trainers import build_trainer

    run_dir = Path(args.out) / "runs" / f"{arm}-seed{seed}"
    config, per_step = build_config(args, arm, seed, run_dir)
    trainer = build_trainer(config, base_dir=Path(args.recipe).resolve().parent)
    trainer.policy.trained_module.eval()
    sampling = trainer.rollout_kwargs()  # the recipe's generator sampling, the same for every arm
    rows: list[dict[str, Any]] = []
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    train_seconds, rewards, tasks = 0.0, [], []

    def record(step: int, images: int, result: dict[str, Any]) -> None:
        window = max(1, args.eval_every // per_step)
        row = {"arm": arm, "seed": seed, "step": step, "images": images, **result}
        row["train_reward_mean"] = statistics.mean(rewards[-window:]) if rewards else float("nan")
        row["task_reward_mean"] = statistics.mean(tasks[-window:]) if tasks else float("nan")
        row["train_seconds"] = round(train_seconds, 2)
        row["cpu_seconds"] = round(time.process_time() - cpu_start, 2)
        rows.append(row)
        logger.info("%s seed %d: %d images, ShapesEval %.4f, canonical rewrites %.3f",
                    arm, seed, images, result["heldout_overall"], result["canonical_rate"])  # fmt: skip

    record(0, 0, initial_evaluation(trainer, items, sampling, args))

    def on_step(metrics: dict[str, Any]) -> None:
        rewards.append(float(metrics["reward_mean"]))
        tasks.append(float(metrics.get("task_reward", float("nan"))))

    def evaluate(step: int, images: int, metrics: dict[str, Any], seconds: float) -> None:
        nonlocal train_seconds
        train_seconds = seconds
        policy = trainer.policy
        policy.trained_module.eval()
        record(
            step,
            images,
            evaluate_pipeline(policy["rewriter"], policy["generator"], items, sampling, config, args),
        )

    train_with_evaluations(trainer, config.train.num_steps, per_step, args.eval_every, evaluate, on_step)
    quarter = max(1, len(tasks) // 4)
    rows[-1]["task_reward_first"] = statistics.mean(tasks[:quarter])
    rows[-1]["task_reward_last"] = statistics.mean(tasks[-quarter:])
    rows[-1]["wall_seconds"] = round(time.perf_counter() - wall_start, 1)
    return rows


# -- the report ---------------------------------------------------------------------------------------


def images_to_reach(images: list[float], scores: list[float], target: float) -> float:
    """The first budget at which the curve ``(images, scores)`` reaches ``target``, linearly
    interpolated between the two evaluations around the crossing; ``inf`` if it never does."""
    for index, (x, y) in enumerate(zip(images, scores, strict=True)):
        if y >= target:
            if index == 0:
                return float(x)
            x0, y0 = images[index - 1], scores[index - 1]
            return float(x0 + (target - y0) * (x - x0) / (y - y0))
    return math.inf


def curves(rows: list[dict[str, Any]], key: str = "heldout_overall") -> dict[str, dict[int, list[float]]]:
    """``{arm: {seed: [key at each evaluation, in image order]}}`` and the images of each."""
    out: dict[str, dict[int, list[tuple[int, float]]]] = {}
    for row in rows:
        out.setdefault(row["arm"], {}).setdefault(int(row["seed"]), []).append(
            (int(row["images"]), float(row[key]))
        )
    return {arm: {seed: sorted(points) for seed, points in seeds.items()} for arm, seeds in out.items()}


def mean_curve(points_by_seed: dict[int, list[tuple[int, float]]]) -> tuple[list[int], list[float]]:
    """The images evaluated by every seed and the mean score there."""
    common = sorted(set.intersection(*({x for x, _ in pts} for pts in points_by_seed.values())))
    means = [statistics.mean(dict(pts)[x] for pts in points_by_seed.values()) for x in common]
    return common, means


def _cell(values: list[float], scale: float = 100.0, digits: int = 1, sign: bool = False) -> str:
    if not values:
        return "-"
    mean, half = mean_ci(values)
    text = f"{scale * mean:{'+' if sign else ''}.{digits}f}"
    return text if math.isnan(half) else f"{text} ± {scale * half:.{digits}f}"


def _reach_text(value: float) -> str:
    return "not reached" if math.isinf(value) else f"{value:.0f}"


def reach_table(rows: list[dict[str, Any]]) -> list[str]:
    """Images each arm needs to reach the target arm's final mean score (see :func:`summarise`)."""
    by_arm = curves(rows)
    if TARGET_ARM not in by_arm:
        return [f"(no {TARGET_ARM} runs: no target score)"]
    finals = [pts[-1][1] for pts in by_arm[TARGET_ARM].values()]
    budget = statistics.mean(pts[-1][0] for pts in by_arm[TARGET_ARM].values())
    target, half = mean_ci(finals)
    low, high = (target, target) if math.isnan(half) else (target - half, target + half)
    lines = [
        f"Target: {TARGET_ARM}'s final score {100 * target:.1f}% "
        f"(95% interval [{100 * low:.1f}, {100 * high:.1f}]) at {budget:.0f} images.",
        "",
        "| arm | images to reach it (mean curve) | for the interval's low / high end | per seed | "
        f"{budget:.0f} / images |",
        "|---|---:|---:|---|---:|",
    ]
    for arm, seeds in by_arm.items():
        xs, ys = mean_curve(seeds)
        need = images_to_reach(xs, ys, target)
        ends = " / ".join(_reach_text(images_to_reach(xs, ys, t)) for t in (low, high))
        per_seed = ", ".join(_reach_text(images_to_reach(*map(list, zip(*pts, strict=True)), target))
                             for _, pts in sorted(seeds.items()))  # fmt: skip
        ratio = "-" if math.isinf(need) else "at the start" if need <= 0 else f"{budget / need:.2f}x"
        lines.append(f"| {arm} | {_reach_text(need)} | {ends} | {per_seed} | {ratio} |")
    return lines


def summarise(rows: list[dict[str, Any]]) -> str:
    """Markdown: the score at each budget per arm (mean over seeds ± 95% t-interval over seeds), the
    per-arm before / after / change (paired per seed) with the canonical-rewrite rate and the
    training task reward, then :func:`reach_table`."""
    by_arm = curves(rows)
    arms = list(by_arm)
    budgets = sorted({x for seeds in by_arm.values() for pts in seeds.values() for x, _ in pts})
    lines = ["| images | " + " | ".join(arms) + " |", "|---|" + "---:|" * len(arms)]
    for x in budgets:
        cells = [_cell([dict(pts)[x] for pts in by_arm[a].values() if x in dict(pts)]) for a in arms]
        lines.append(f"| {x} | " + " | ".join(cells) + " |")
    canonical = curves(rows, "canonical_rate")
    lines += [
        "",
        "| arm | seeds | before | after | change | canonical rewrites before | after | "
        "task reward, first quarter | last quarter | CPU s / run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in arms:
        runs = by_arm[arm].values()
        before, after = [pts[0][1] for pts in runs], [pts[-1][1] for pts in runs]
        change = [b - a for a, b in zip(before, after, strict=True)]
        c_runs = canonical[arm].values()
        finals = [r for r in rows if r["arm"] == arm and "task_reward_first" in r]
        cpu = [float(r["cpu_seconds"]) for r in finals]
        lines.append(
            f"| {arm} | {len(after)} | {_cell(before)} | {_cell(after)} | {_cell(change, sign=True)} "
            f"| {_cell([p[0][1] for p in c_runs])} | {_cell([p[-1][1] for p in c_runs])} "
            f"| {_cell([float(r['task_reward_first']) for r in finals], 1.0, 3)} "
            f"| {_cell([float(r['task_reward_last']) for r in finals], 1.0, 3)} "
            f"| {statistics.mean(cpu) if cpu else float('nan'):.0f} |"
        )
    return "\n".join(lines + [""] + reach_table(rows)) + "\n"


def references(rows: list[dict[str, Any]]) -> str:
    """The initial generator without a rewriter and on the canonical captions (step-0 rows)."""
    starts = [r for r in rows if "no_rewriter_overall" in r]
    if not starts:
        return ""
    raw, oracle = float(starts[0]["no_rewriter_overall"]), float(starts[0]["canonical_caption_overall"])
    return (
        f"References with the initial generator on the same items and seeds: the paraphrase drawn "
        f"without a rewriter {100 * raw:.1f}%, the canonical caption (a perfect rewriter) {100 * oracle:.1f}%.\n"
    )


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """ShapesEval (left) and the canonical-rewrite rate (right) against training images: mean over
    seeds with the 95% t-band; the target arm's final mean as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, label in (
        (axes[0], "heldout_overall", "ShapesEval, paraphrased RL-held-out (%)"),
        (axes[1], "canonical_rate", "rewrites = canonical caption (%)"),
    ):
        for arm, seeds in curves(rows, key).items():
            xs, _ = mean_curve(seeds)
            stats = [mean_ci([dict(pts)[x] for pts in seeds.values()]) for x in xs]
            means = [100 * m for m, _ in stats]
            (line,) = ax.plot(xs, means, marker="o", ms=3, label=arm)
            halves = [0.0 if math.isnan(h) else 100 * h for _, h in stats]
            ax.fill_between(xs, [m - h for m, h in zip(means, halves, strict=True)],
                            [m + h for m, h in zip(means, halves, strict=True)], alpha=0.15,
                            color=line.get_color())  # fmt: skip
            if key == "heldout_overall" and arm == TARGET_ARM:
                ax.axhline(means[-1], ls="--", lw=0.8, color=line.get_color())
        ax.set_xlabel("training images")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(rows: list[dict[str, Any]], out: Path, args: argparse.Namespace) -> str:
    """Write ``summary.md`` and ``promptrl_toy.png``; return the summary's tables."""
    table = summarise(rows)
    seeds = sorted({int(r["seed"]) for r in rows})
    temperature = "recipe's" if args.rewrite_temperature is None else str(args.rewrite_temperature)
    images = 6 * args.eval_images_per_category
    (out / "summary.md").write_text(
        f"ShapesEval (overall, %) on {images} paraphrased RL-held-out prompts (fixed seeds) through "
        f"rewriter -> generator (rewriter temperature: {temperature}), vs training images; mean over "
        f"seeds {seeds} ± 95% t-interval over seeds. Recipe {args.recipe}.\n\n{references(rows)}\n{table}"
    )
    plot(rows, out / "promptrl_toy.png")
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default=str(RECIPE), help="the recipe every arm shares")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds (use 3 or more)")
    parser.add_argument("--budget", type=int, default=1024, help="training images per arm and seed")
    parser.add_argument("--eval-every", type=int, default=128, help="training images between evaluations")
    parser.add_argument("--eval-images-per-category", type=int, default=24, help="6 categories")
    parser.add_argument("--eval-batch-size", type=int, default=48)
    parser.add_argument(
        "--rewrite-temperature", type=float, help="evaluation rewrites' temperature (default: the recipe's)"
    )
    parser.add_argument("--set", nargs="*", default=[], help="dotted overrides of every arm's recipe")
    parser.add_argument("--out", default="runs/promptrl_toy")
    parser.add_argument("--from-csv", nargs="+", help="train nothing: merge these results.csv into --out")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run every arm for every seed, then write the CSV, the summary and the plot."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.from_csv:
        rows = [{**r, "arm": str(r["arm"])} for r in read_rows(args.from_csv)]
        write_csv(rows, out / "results.csv")
        print(write_report(rows, out, args))
        return 0
    if args.budget <= 0 or args.eval_every <= 0:
        print("error: --budget and --eval-every must be positive", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()  # toy-sd's 16-token CLIP truncates long rewrites, as intended
    items = eval_items(args.eval_images_per_category)
    rows: list[dict[str, Any]] = []
    for arm in args.arms:
        for seed in args.seeds:
            rows += run_arm(args, arm, seed, items)
            write_csv(rows, out / "results.csv")  # after every run: a long benchmark keeps its rows
    print(write_report(rows, out, args))
    print(f"wrote {out / 'results.csv'}, {out / 'summary.md'}, {out / 'promptrl_toy.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
