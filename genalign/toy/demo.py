"""``genalign demo``: watch alignment happen, and check it against a verifier no reward model sees.

The demo (issue #6, DESIGN.md "The offline world") runs in minutes on a CPU, offline:

1. evaluate the toy generator with ShapesEval on three prompt sets, fixed seeds
   (``genalign.toy.evaluation``): **RL-held-out** prompts (the headline: inside the generator's
   pretraining distribution, never trained on by RL), the **RL-train** prompts, and **unseen
   combinations** (a compositional-generalisation probe, never a target);
2. RL-train it on the recipe's prompts against a *learned* toy reward (``configs/toy/demo.yaml``:
   DiffusionNFT on ``toy-sd-web70`` with ``toy-vlm``'s VQAScore), with the verifier attached as a
   monitor (scored on the same rollouts, never used for advantages) and, every
   ``eval_every`` steps, an RL-held-out evaluation;
3. evaluate again with the same prompts and seeds, and write ``report.md`` to the run folder with
   a section per prompt set (per-category tables, the change with its paired 95% interval), the
   reward and verifier curves, before/after image grids, and a reward-hacking check: did the
   learned reward rise faster than the verifier? ``summary.json`` holds the same numbers.

``oracle="correct"``, ``"partial"`` or ``"mixed"`` (``genalign demo --oracle``) is the control
experiment: the same recipe trained on the verifier itself (ShapesEval's 0/1 score, its fraction
of checks passed, or the 0/1 score plus half the fraction: :data:`ORACLE_REWARDS`), which bounds what any learned reward could give this recipe and budget. The report says
so at the top; its hacking check is then void (the reward is the monitor).

The hacking check compares effect sizes: the change of the mean from the first to the last
steps of training, in units of the across-sample standard deviation at the start, for the
learned reward and for the verifier on the same training rollouts. A learned reward that moves
several of its standard deviations while the verifier (and the held-out score) stands still is
the signature of reward hacking.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from genalign.toy.evaluation import (
    CI_METHOD,
    DEFAULT_EVAL_IMAGES,
    EVAL_SETS,
    HEADLINE,
    SetEvaluation,
    eval_set_for_images,
    evaluate_policy,
    ground_truth_renders,
    heldout_eval_set,
    reward_change,
)
from genalign.toy.hacking import HackingCheck, hacking_check, hacking_lines
from genalign.toy.prompts import PromptSpec, prompts_for

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RECIPE = ROOT / "configs" / "toy" / "demo.yaml"
# the verifier as the reward of an oracle run: (reward name, kwargs) per mode
ORACLE_REWARDS = {
    "correct": ("shapes_eval", {"partial": False}),  # GenEval's 0/1
    "partial": ("shapes_eval", {"partial": True}),  # the fraction of checks passed
    "mixed": (  # 0/1 plus half the fraction: ties among wrong samples broken by how close they came
        "ensemble",
        {
            "members": [
                {"name": "shapes_eval", "key": "correct", "weight": 1.0, "kwargs": {"partial": False}},
                {"name": "shapes_eval", "key": "partial", "weight": 0.5, "kwargs": {"partial": True}},
            ]
        },
    ),
}
ORACLE_MODES = tuple(ORACLE_REWARDS)
ORACLE_VERDICT = "void: the reward is the verifier (oracle run)"
# re-exported: benchmarks and older callers import these from the demo
__all__ = [
    "DemoInterrupted",
    "DemoResult",
    "HackingCheck",
    "evaluate_policy",
    "hacking_check",
    "heldout_eval_set",
    "run_demo",
    "write_report",
]


class DemoInterrupted(RuntimeError):
    """Training stopped early (SIGTERM / Ctrl-C): the demo reports nothing rather than a short run."""

    def __init__(self, steps_done: int, steps: int, signal: int) -> None:
        super().__init__(
            f"demo interrupted after {steps_done} of {steps} training steps: no evaluation after "
            "training and no report (run it again)"
        )
        self.signal = signal


# -- report -------------------------------------------------------------------------------------------


def _plot_curves(
    history: Sequence[dict[str, Any]],
    heldout_curve: Sequence[tuple[int, float]],
    path: Path,
    reward_name: str,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m for m in history if not m.get("skipped")]
    x = [m["step"] for m in steps]
    mean = [m["reward_mean"] for m in steps]
    err = [m["reward_stderr"] for m in steps]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.4))
    left.plot(x, mean, color="tab:blue", marker="o", ms=2)
    left.fill_between(x, [a - b for a, b in zip(mean, err)], [a + b for a, b in zip(mean, err)], alpha=0.25)
    left.set_xlabel("step")
    left.set_ylabel(f"learned reward ({reward_name})")
    left.set_title("training reward (train prompts)")
    if steps and "monitor_shapes_eval" in steps[0]:
        right.plot(
            x,
            [m["monitor_shapes_eval"] for m in steps],
            color="tab:orange",
            marker="o",
            ms=2,
            label="verifier on training rollouts",
        )
    if heldout_curve:
        right.plot(
            [s for s, _ in heldout_curve],
            [v for _, v in heldout_curve],
            color="tab:green",
            marker="s",
            label="RL-held-out ShapesEval",
        )
    right.set_xlabel("step")
    right.set_ylabel("ShapesEval accuracy")
    right.set_ylim(0, 1)
    right.set_title("verifier (never seen by the reward)")
    right.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _before_after_grid(
    items: Sequence[tuple[PromptSpec, int]],
    before: torch.Tensor,
    after: torch.Tensor,
    path: Path,
    count: int = 10,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = min(count, len(items))
    picks = [round(i * (len(items) - 1) / max(count - 1, 1)) for i in range(count)]
    fig, axes = plt.subplots(2, count, figsize=(1.5 * count, 3.6))
    axes = axes.reshape(2, count)
    for column, index in enumerate(picks):
        for row, images in enumerate((before, after)):
            ax = axes[row, column]
            ax.imshow(images[index].clamp(0, 1).permute(1, 2, 0).numpy())
            ax.set_xticks([])
            ax.set_yticks([])
            if column == 0:
                ax.set_ylabel("before" if row == 0 else "after", fontsize=8)
        caption = items[index][0].caption.replace("a photo of ", "")
        axes[0, column].set_title(_wrap(caption, 18), fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _wrap(text: str, width: int) -> str:
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    lines.append(line)
    return "\n".join(lines)


@dataclass
class DemoResult:
    """What ``run_demo`` measured; ``evaluations`` maps each of :data:`EVAL_SETS` to its
    before/after evaluation, ``heldout_curve`` is the RL-held-out score at each evaluated step."""

    run_dir: Path
    report: Path
    evaluations: dict[str, SetEvaluation]
    hacking: HackingCheck
    heldout_curve: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0
    oracle: str | None = None
    leaks: dict[str, int] = field(default_factory=dict)

    @property
    def headline(self) -> SetEvaluation:
        """The RL-held-out evaluation."""
        return self.evaluations[HEADLINE]

    def summary(self) -> dict[str, Any]:
        return demo_summary(
            self.evaluations, self.hacking, self.heldout_curve, self.seconds, self.oracle, self.leaks
        )


def demo_summary(
    evaluations: dict[str, SetEvaluation],
    hacking: HackingCheck,
    heldout_curve: Sequence[tuple[int, float]],
    seconds: float,
    oracle: str | None = None,
    leaks: dict[str, int] | None = None,
) -> dict[str, Any]:
    """``summary.json``: per set ``{set}_before``, ``_after``, ``_change``, ``_ci`` (95%, [low,
    high]), ``_images`` and per-category tables (:meth:`SetEvaluation.summary`), then the
    hacking check, the RL-held-out curve, the wall time, the oracle mode and how many training
    prompts belong to a held-out set (``trained_on_evaluation_prompts``)."""
    summary: dict[str, Any] = {"headline": HEADLINE, "ci_method": CI_METHOD}
    for evaluation in evaluations.values():
        summary.update(evaluation.summary())
    if hacking.fixed_seed is not None:
        summary.update(hacking.fixed_seed.summary("rl_train_reward"))
    summary.update(
        {
            "reward_effect": None if math.isnan(hacking.reward_effect) else hacking.reward_effect,
            "reward_effect_within_prompt": None
            if math.isnan(hacking.reward_effect_within)
            else hacking.reward_effect_within,
            "verifier_effect": None if math.isnan(hacking.verifier_effect) else hacking.verifier_effect,
            "verdict": hacking.verdict,
            "rl_heldout_curve": [list(point) for point in heldout_curve],
            "seconds": seconds,
            "oracle": oracle,
            "trained_on_evaluation_prompts": dict(leaks or {}),
        }
    )
    return summary


def _trains_on_the_verifier(name: str, kwargs: dict[str, Any]) -> bool:
    """Whether a reward spec is, or holds as an ensemble member, the ShapesEval verifier."""
    members = kwargs.get("members", []) if name == "ensemble" else []
    return name == "shapes_eval" or any(
        isinstance(m, dict) and m.get("name") == "shapes_eval" for m in members
    )


def _trained_on(config: Any, oracle: str | None) -> str:
    if oracle is None:
        return (
            f"against the learned reward `{config.reward.name}` {json.dumps(config.reward.kwargs)}; "
            "ShapesEval (the verifier) was never used for training"
        )
    return (
        f"against **the verifier itself** (oracle run: ShapesEval, `{oracle}` score), the upper bound "
        "of what a learned reward could give this recipe; the reward-hacking check below is void"
    )


def _evaluation_sections(evaluations: dict[str, SetEvaluation], config: Any) -> list[str]:
    """One report section per prompt set, in :data:`EVAL_SETS` order (the headline first)."""
    lines: list[str] = []
    for name in EVAL_SETS:
        if name not in evaluations:
            continue
        evaluation = evaluations[name]
        lines += [
            f"## {evaluation.title}",
            "",
            f"{len(evaluation.items)} images, fixed seeds, sampler: {config.sampling.num_inference_steps} steps, "
            f"guidance {config.sampling.guidance_scale}, eta {config.sampling.eta}.",
            "",
            *evaluation.table(),
            "",
        ]
    return lines


def write_report(
    run_dir: Path,
    config: Any,
    history: Sequence[dict[str, Any]],
    evaluations: dict[str, SetEvaluation],
    hacking: HackingCheck,
    heldout_curve: Sequence[tuple[int, float]],
    seconds: float,
    oracle: str | None = None,
    leaks: dict[str, int] | None = None,
) -> Path:
    """Write ``report.md``, ``curves.png``, ``before_after.png`` and ``summary.json`` to ``run_dir``.

    ``evaluations``: each of :data:`EVAL_SETS` (the RL-held-out one, the headline, must be there
    with its images); ``oracle``: the verifier mode the run trained on, for an oracle run (module
    docstring); ``leaks``: :func:`trained_on_evaluation_prompts` of the recipe's prompts, said at
    the top of the report. Returns the report's path.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    headline = evaluations[HEADLINE]
    curves = _plot_curves(history, heldout_curve, run_dir / "curves.png", config.reward.name)
    grid = _before_after_grid(
        headline.items, headline.images_before, headline.images_after, run_dir / "before_after.png"
    )
    steps = [m for m in history if not m.get("skipped")]
    change, low, high = headline.interval()
    lines = [
        f"# genalign demo: {config.name}",
        "",
        f"Generator `{config.model.path}` ({config.model.family}), trained with `{config.train.method}` "
        f"for {len(steps)} steps of {config.train.samples_per_step} samples {_trained_on(config, oracle)}. "
        f"Wall time {seconds / 60:.1f} min.",
        "",
        f"**Headline: RL-held-out ShapesEval {headline.before['overall']:.1%} → {headline.after['overall']:.1%} "
        f"({_change_text(change, low, high)}).**",
        "",
        f"Intervals: {CI_METHOD}.",
        "",
    ]
    for name, count in (leaks or {}).items():
        lines += [
            f"**Warning: {count} of the recipe's training prompts are {name} prompts; that set is not held out.**",
            "",
        ]
    lines += _evaluation_sections(evaluations, config)
    first, last = steps[0], steps[-1]
    lines += [
        "## Training curves",
        "",
        f"![reward and verifier curves]({curves.name})",
        "",
        f"{'Reward' if oracle else 'Learned reward'} (train rollouts): {first['reward_mean']:.4f} ± {first['reward_stderr']:.4f} at step "
        f"{first['step']} → {last['reward_mean']:.4f} ± {last['reward_stderr']:.4f} at step {last['step']}.",
    ]
    if "monitor_shapes_eval" in first:
        lines.append(
            f"Verifier on the same rollouts: {first['monitor_shapes_eval']:.1%} → {last['monitor_shapes_eval']:.1%}."
        )
    lines += ["", *hacking_lines(steps, hacking, evaluations, oracle)]
    lines += [
        f"Verdict: {hacking.verdict}.",
        "",
        "## Samples (RL-held-out prompts, same seeds)",
        "",
        f"![before and after]({grid.name})",
        "",
    ]
    report = run_dir / "report.md"
    report.write_text("\n".join(lines))
    summary = demo_summary(evaluations, hacking, heldout_curve, seconds, oracle, leaks)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return report


def _change_text(change: float, low: float, high: float) -> str:
    if low != low:  # NaN: too few images per category for an interval
        return f"{100 * change:+.1f} points, 95% CI n/a"
    return f"{100 * change:+.1f} points, 95% CI [{100 * low:+.1f}, {100 * high:+.1f}]"


# -- the run ------------------------------------------------------------------------------------------


def run_demo(
    recipe: str | Path = DEFAULT_RECIPE,
    overrides: Sequence[str] = (),
    eval_every: int = 0,
    oracle: str | None = None,
    rl_heldout_images: int = DEFAULT_EVAL_IMAGES["rl_heldout"],
    rl_train_images: int = DEFAULT_EVAL_IMAGES["rl_train"],
    unseen_images: int = DEFAULT_EVAL_IMAGES["unseen_combinations"],
) -> DemoResult:
    """Evaluate, train, evaluate again and write the report; see the module docstring.

    ``oracle``: None (train on the recipe's learned reward), or "correct" / "partial" to train on
    ShapesEval itself, the control run; its run folder is the recipe's name + ``-oracle-{mode}``.
    ``rl_heldout_images``, ``rl_train_images``, ``unseen_images``: images per evaluation of each
    prompt set (at least that many, spread evenly over the set's categories); ``eval_every``:
    also evaluate RL-held-out every that many steps (0: only before and after).
    """
    from genalign.trainers import build_trainer, load_recipe
    from genalign.trainers.recipe_paths import resolve_recipe_paths

    start = time.perf_counter()
    recipe = Path(recipe)
    # the recipe's model and reward paths as the trainer resolves them (the demo loads them too)
    config = resolve_recipe_paths(load_recipe(recipe, list(overrides)), recipe.parent)
    if "shapes_eval" not in config.reward.monitors:
        config.reward.monitors["shapes_eval"] = {}
    if oracle is not None:
        if oracle not in ORACLE_MODES:
            raise ValueError(f"oracle must be one of {ORACLE_MODES}, got {oracle!r}")
        config.name = f"{config.name}-oracle-{oracle}"
        config.reward.name, kwargs = ORACLE_REWARDS[oracle]
        config.reward.kwargs = copy.deepcopy(kwargs)
    elif _trains_on_the_verifier(config.reward.name, config.reward.kwargs):
        raise ValueError(
            "the demo trains on a learned reward; shapes_eval is the verifier it is checked against "
            "(--oracle trains on it on purpose, as a control)"
        )
    sizes = {
        "rl_heldout": rl_heldout_images,
        "rl_train": rl_train_images,
        "unseen_combinations": unseen_images,
    }
    item_sets = {name: eval_set_for_images(name, sizes[name], seed=config.train.seed) for name in EVAL_SETS}
    trainer = build_trainer(config, base_dir=recipe.parent)
    leaks = trained_on_evaluation_prompts(config.prompts.load(recipe.parent))
    for name, count in leaks.items():
        logger.warning(
            "%d of the recipe's training prompts are %s prompts: that set is not held out", count, name
        )
    sampling = trainer.rollout_kwargs()
    before = {name: evaluate_policy(trainer.policy, items, sampling) for name, items in item_sets.items()}
    for name in EVAL_SETS:
        print(f"{name} ShapesEval before training: {before[name][0]['overall']:.1%}", flush=True)
    curve: list[tuple[int, float]] = [(0, before[HEADLINE][0]["overall"])]

    def periodic(trainer_: Any, step: int, metrics: dict[str, Any]) -> None:
        done = step + 1
        if eval_every and done % eval_every == 0 and done < config.train.num_steps:
            with exported_weights(trainer_):
                result, _ = evaluate_policy(trainer_.policy, item_sets[HEADLINE], sampling)
            metrics["rl_heldout_shapes_eval"] = result["overall"]
            curve.append((done, result["overall"]))

    trainer.callbacks.append(periodic)
    history = trainer.train()
    if trainer.interrupted is not None:
        raise DemoInterrupted(trainer.step, config.train.num_steps, int(trainer.interrupted))
    evaluations: dict[str, SetEvaluation] = {}
    for name, items in item_sets.items():
        with exported_weights(trainer):  # what final/ holds: the EMA with train.ema_decay
            after, images_after = evaluate_policy(trainer.policy, items, sampling)
        keep = name in (HEADLINE, "rl_train")  # the grid shows the headline; rl_train is re-scored
        evaluations[name] = SetEvaluation(
            name,
            items,
            before[name][0],
            after,
            before[name][1] if keep else None,
            images_after if keep else None,
        )
        print(f"{name} ShapesEval after training:  {after['overall']:.1%}", flush=True)
    headline = evaluations[HEADLINE]
    curve.append((config.train.num_steps, headline.after["overall"]))
    first, last, low = headline.before["overall"], headline.after["overall"], headline.interval()[1]
    hacking = hacking_check(history, first, last, heldout_low=low)
    train_set = evaluations["rl_train"]
    hacking.fixed_seed = reward_change(
        trainer.reward,
        train_set.items,
        train_set.images_before,
        train_set.images_after,
        ground_truth_images=ground_truth_renders(train_set.items, train_set.images_before.shape[-1]),
    )
    if oracle is not None:
        hacking.verdict = ORACLE_VERDICT
    seconds = time.perf_counter() - start
    report = write_report(
        trainer.run_dir, config, history, evaluations, hacking, curve, seconds, oracle, leaks
    )
    return DemoResult(trainer.run_dir, report, evaluations, hacking, curve, seconds, oracle, leaks)


def exported_weights(trainer: Any) -> AbstractContextManager[None]:
    """The trainer's policy holds the weights it exports while this is open: the EMA of the trained
    weights when the recipe keeps one (``train.ema_decay``), else the trained weights themselves."""
    return trainer.ema.swapped(trainer.parameters) if trainer.ema is not None else nullcontext()


def trained_on_evaluation_prompts(training_prompts: Sequence[str]) -> dict[str, int]:
    """How many distinct training prompts belong to a held-out evaluation set (``rl_heldout``,
    ``unseen_combinations``); sets with none are left out. A recipe that trains on the old
    ``train`` split (``colour_prompts.txt``, ``train_prompts.txt``) trains on RL-held-out prompts."""
    prompts = set(training_prompts)
    counts = {
        name: len(prompts & {p.caption for p in prompts_for(name)})
        for name in ("rl_heldout", "unseen_combinations")
    }
    return {name: count for name, count in counts.items() if count}
