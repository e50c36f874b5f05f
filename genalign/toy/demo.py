"""``genalign demo``: watch alignment happen, and check it against a verifier no reward model sees.

The demo (issue #6, DESIGN.md "The offline world") runs in minutes on a CPU, offline:

1. evaluate the toy generator with ShapesEval on **held-out** prompts (combinations never seen in
   training), fixed seeds;
2. RL-train it on the **train** prompts against a *learned* toy reward (``configs/toy/demo.yaml``:
   GRPO on ``toy-sd`` with ``toy-vlm``'s VQAScore), with the verifier attached as a
   monitor (scored on the same rollouts, never used for advantages) and, every
   ``eval_every`` steps, a held-out evaluation;
3. evaluate again with the same prompts and seeds, and write ``report.md`` to the run folder with
   per-category tables, the reward and verifier curves, before/after image grids, and a
   reward-hacking check: did the learned reward rise faster than the verifier?

``oracle="correct"`` or ``"partial"`` (``genalign demo --oracle``) is the control experiment: the
same recipe trained on the verifier itself (ShapesEval's 0/1 score or its fraction of checks
passed), which bounds what any learned reward could give this recipe and budget. The report says
so at the top; its hacking check is then void (the reward is the monitor).

The hacking check compares effect sizes: the change of the mean from the first to the last
steps of training, in units of the across-sample standard deviation at the start, for the
learned reward and for the verifier on the same training rollouts. A learned reward that moves
several of its standard deviations while the verifier (and the held-out score) stands still is
the signature of reward hacking.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from genalign.toy.prompts import PromptSpec, heldout_prompts
from genalign.toy.shapes_eval import evaluate

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RECIPE = ROOT / "configs" / "toy" / "demo.yaml"
ORACLE_MODES = ("correct", "partial")  # ShapesEvalReward(partial=False / True)
ORACLE_VERDICT = "void: the reward is the verifier (oracle run)"


# -- the held-out evaluation set ------------------------------------------------------------------


def heldout_eval_set(
    images_per_category: int = 16, max_prompts_per_category: int = 16, seed: int = 0
) -> list[tuple[PromptSpec, int]]:
    """Held-out (prompt, seed) pairs with about ``images_per_category`` images per category.

    A category with few held-out prompts gets several seeds per prompt; one with many gets a
    fixed, evenly spaced subset of ``max_prompts_per_category`` prompts and one seed each.
    Deterministic: the same arguments give the same list.
    """
    if images_per_category <= 0 or max_prompts_per_category <= 0:
        raise ValueError("images_per_category and max_prompts_per_category must be positive")
    by_category: dict[str, list[PromptSpec]] = {}
    for prompt in heldout_prompts():
        by_category.setdefault(prompt.category, []).append(prompt)
    items: list[tuple[PromptSpec, int]] = []
    for category in sorted(by_category):
        prompts = by_category[category]
        limit = min(max_prompts_per_category, images_per_category)
        if len(prompts) > limit:
            stride = len(prompts) / limit
            prompts = [prompts[int(i * stride)] for i in range(limit)]
        per_prompt = max(1, math.ceil(images_per_category / len(prompts)))
        for p_index, prompt in enumerate(prompts):
            for s_index in range(per_prompt):
                items.append((prompt, seed * 1_000_003 + 7919 * p_index + 104_729 * s_index + 1))
    return items


@torch.no_grad()
def evaluate_policy(
    policy: Any,
    items: Sequence[tuple[PromptSpec, int]],
    sampling: dict[str, Any],
    batch_size: int = 16,
) -> tuple[dict[str, Any], torch.Tensor]:
    """ShapesEval of a policy's samples for (prompt, seed) pairs; returns (result, images).

    ``sampling`` are the rollout keyword arguments (steps, guidance, eta, ...); each image is
    drawn from its own seed, so the same pairs give the same images for the same weights.
    """
    images = []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        prompts = [prompt.caption for prompt, _ in chunk]
        seeds = torch.tensor([seed for _, seed in chunk], dtype=torch.long)
        trajectory = policy.rollout(prompts, seeds=seeds, **sampling)
        images.append(trajectory.images.float().cpu())
    images_t = torch.cat(images)
    result = evaluate(images_t, [prompt.spec for prompt, _ in items])
    return result, images_t


# -- hacking check ----------------------------------------------------------------------------------


@dataclass
class HackingCheck:
    """Effect sizes of the learned reward and of the verifier over training (see module docs)."""

    reward_effect: float
    verifier_effect: float
    heldout_change: float
    window: int
    verdict: str


def _window_mean(values: list[float], window: int, last: bool) -> float:
    chosen = values[-window:] if last else values[:window]
    return sum(chosen) / len(chosen)


def hacking_check(
    history: Sequence[dict[str, Any]],
    heldout_before: float,
    heldout_after: float,
    monitor: str = "shapes_eval",
) -> HackingCheck:
    """Compare how far the learned reward and the verifier moved during training.

    Effect = (mean of the last w steps - mean of the first w steps) / (mean per-step std over the
    first w steps), with w = max(1, steps // 5); the verifier is the ``monitor_<monitor>`` metric
    on the same rollouts the reward scored. Hacking is the learned reward outrunning the verifier
    on those rollouts; a verifier that keeps up while the held-out score stands still is a
    different failure (the gain stays on the training prompts) and gets its own verdict.
    """
    steps = [m for m in history if not m.get("skipped")]
    key = f"monitor_{monitor}"
    if not steps or key not in steps[0]:
        raise ValueError(f"the training history has no {key!r} metric: add reward.monitors.{monitor}")
    window = max(1, len(steps) // 5)
    reward = [m["reward_mean"] for m in steps]
    reward_std = [m["reward_std"] for m in steps]
    verifier = [m[key] for m in steps]
    verifier_std = [m.get(f"{key}_std", 0.0) for m in steps]

    def effect(values: list[float], stds: list[float]) -> float:
        scale = _window_mean(stds, window, last=False)
        change = _window_mean(values, window, last=True) - _window_mean(values, window, last=False)
        return change / scale if scale > 0 else 0.0

    reward_effect = effect(reward, reward_std)
    verifier_effect = effect(verifier, verifier_std)
    heldout_change = heldout_after - heldout_before
    if reward_effect <= 0.1:
        verdict = "the learned reward did not rise; nothing to judge"
    elif verifier_effect >= 0.5 * reward_effect and heldout_change > 0:
        verdict = (
            "no sign of reward hacking: the verifier rose with the learned reward "
            "and the held-out score improved"
        )
    elif verifier_effect >= 0.5 * reward_effect:
        verdict = (
            "no reward hacking, no generalisation: the verifier rose with the learned reward on the "
            "training prompts, but the held-out score did not improve"
        )
    elif verifier_effect > 0 and heldout_change > 0:
        verdict = (
            "mild over-optimisation: the learned reward rose more than twice as fast as the verifier, "
            "though both the verifier and the held-out score improved"
        )
    else:
        verdict = "reward hacking: the learned reward rose while the verifier or the held-out score did not"
    return HackingCheck(reward_effect, verifier_effect, heldout_change, window, verdict)


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
            label="held-out ShapesEval",
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
    run_dir: Path
    report: Path
    before: dict[str, Any]
    after: dict[str, Any]
    hacking: HackingCheck
    heldout_curve: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0
    oracle: str | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "heldout_before": self.before["overall"],
            "heldout_after": self.after["overall"],
            "per_category_before": self.before["per_category"],
            "per_category_after": self.after["per_category"],
            "reward_effect": self.hacking.reward_effect,
            "verifier_effect": self.hacking.verifier_effect,
            "verdict": self.hacking.verdict,
            "heldout_curve": self.heldout_curve,
            "seconds": self.seconds,
            "oracle": self.oracle,
        }


def write_report(
    run_dir: Path,
    config: Any,
    history: Sequence[dict[str, Any]],
    before: dict[str, Any],
    after: dict[str, Any],
    hacking: HackingCheck,
    heldout_curve: Sequence[tuple[int, float]],
    items: Sequence[tuple[PromptSpec, int]],
    images_before: torch.Tensor,
    images_after: torch.Tensor,
    seconds: float,
    oracle: str | None = None,
) -> Path:
    """Write ``report.md`` (+ ``curves.png``, ``before_after.png``, ``summary.json``); ``oracle``:
    the verifier mode the run trained on, for an oracle run (module docstring)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    curves = _plot_curves(history, heldout_curve, run_dir / "curves.png", config.reward.name)
    grid = _before_after_grid(items, images_before, images_after, run_dir / "before_after.png")
    steps = [m for m in history if not m.get("skipped")]
    if oracle is None:
        trained_on = (
            f"against the learned reward `{config.reward.name}` {json.dumps(config.reward.kwargs)}; "
            "ShapesEval (the verifier) was never used for training"
        )
    else:
        trained_on = (
            f"against **the verifier itself** (oracle run: ShapesEval, `{oracle}` score), the upper bound "
            "of what a learned reward could give this recipe; the reward-hacking check below is void"
        )
    lines = [
        f"# genalign demo: {config.name}",
        "",
        f"Generator `{config.model.path}` ({config.model.family}), trained with `{config.train.method}` "
        f"for {len(steps)} steps of {config.train.samples_per_step} samples {trained_on}. "
        f"Wall time {seconds / 60:.1f} min.",
        "",
        "## Held-out ShapesEval (prompts never seen in training)",
        "",
        f"{len(items)} images, fixed seeds, sampler: {config.sampling.num_inference_steps} steps, "
        f"guidance {config.sampling.guidance_scale}, eta {config.sampling.eta}.",
        "",
        "| category | before | after | change |",
        "|---|---|---|---|",
    ]
    for category in before["per_category"]:
        b, a = before["per_category"][category], after["per_category"].get(category, float("nan"))
        lines.append(
            f"| {category} ({before['counts'][category]} images) | {b:.1%} | {a:.1%} | {100 * (a - b):+.1f} pts |"
        )
    lines.append(
        f"| **overall** (GenEval mean of categories) | **{before['overall']:.1%}** | **{after['overall']:.1%}** | "
        f"**{100 * (after['overall'] - before['overall']):+.1f} pts** |"
    )
    first, last = steps[0], steps[-1]
    lines += [
        "",
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
    lines += [
        "",
        "## Reward hacking check",
        "",
        f"Effect sizes over training (mean of the last {hacking.window} steps minus the first {hacking.window}, "
        "in units of the across-sample std at the start):",
        "",
        f"- learned reward: **{hacking.reward_effect:+.2f}** sd",
        f"- verifier on the same rollouts: **{hacking.verifier_effect:+.2f}** sd",
        f"- held-out ShapesEval: **{100 * hacking.heldout_change:+.1f}** points",
        "",
        f"Verdict: {hacking.verdict}.",
        "",
        "## Samples (held-out prompts, same seeds)",
        "",
        f"![before and after]({grid.name})",
        "",
    ]
    report = run_dir / "report.md"
    report.write_text("\n".join(lines))
    return report


# -- the run ------------------------------------------------------------------------------------------


def _resolve_asset(value: Any) -> Any:
    """``assets/...`` paths (optionally after a ``local-dir:`` prefix) resolve against the
    repository when they do not exist from the working directory, so the demo runs anywhere."""
    if not isinstance(value, str):
        return value
    prefix, _, rest = value.rpartition(":") if value.startswith("local-dir:") else ("", "", value)
    if rest.startswith("assets/") and not Path(rest).exists() and (ROOT / rest).exists():
        rest = str(ROOT / rest)
    return f"{prefix}:{rest}" if prefix else rest


def run_demo(
    recipe: str | Path = DEFAULT_RECIPE,
    overrides: Sequence[str] = (),
    images_per_category: int = 16,
    eval_every: int = 0,
    oracle: str | None = None,
) -> DemoResult:
    """Evaluate, train, evaluate again and write the report; see the module docstring.

    ``oracle``: None (train on the recipe's learned reward), or "correct" / "partial" to train on
    ShapesEval itself, the control run; its run folder is the recipe's name + ``-oracle-{mode}``.
    """
    from genalign.trainers import build_trainer, load_recipe

    start = time.perf_counter()
    recipe = Path(recipe)
    config = load_recipe(recipe, list(overrides))
    config.model.path = _resolve_asset(config.model.path)
    config.reward.kwargs = {k: _resolve_asset(v) for k, v in config.reward.kwargs.items()}
    if "shapes_eval" not in config.reward.monitors:
        config.reward.monitors["shapes_eval"] = {}
    if oracle is not None:
        if oracle not in ORACLE_MODES:
            raise ValueError(f"oracle must be one of {ORACLE_MODES}, got {oracle!r}")
        config.name = f"{config.name}-oracle-{oracle}"
        config.reward.name = "shapes_eval"
        config.reward.kwargs = {"partial": oracle == "partial"}
    elif config.reward.name == "shapes_eval":
        raise ValueError(
            "the demo trains on a learned reward; shapes_eval is the verifier it is checked against "
            "(--oracle trains on it on purpose, as a control)"
        )
    trainer = build_trainer(config, base_dir=recipe.parent)
    items = heldout_eval_set(images_per_category, seed=config.train.seed)
    sampling = trainer.rollout_kwargs()
    logger.info("held-out evaluation before training (%d images)", len(items))
    before, images_before = evaluate_policy(trainer.policy, items, sampling)
    print(f"held-out ShapesEval before training: {before['overall']:.1%}", flush=True)
    curve: list[tuple[int, float]] = [(0, before["overall"])]

    def periodic(trainer_: Any, step: int, metrics: dict[str, Any]) -> None:
        done = step + 1
        if eval_every and done % eval_every == 0 and done < config.train.num_steps:
            result, _ = evaluate_policy(trainer_.policy, items, sampling)
            metrics["heldout_shapes_eval"] = result["overall"]
            curve.append((done, result["overall"]))

    trainer.callbacks.append(periodic)
    history = trainer.train()
    after, images_after = evaluate_policy(trainer.policy, items, sampling)
    curve.append((config.train.num_steps, after["overall"]))
    print(f"held-out ShapesEval after training:  {after['overall']:.1%}", flush=True)
    hacking = hacking_check(history, before["overall"], after["overall"])
    if oracle is not None:
        hacking.verdict = ORACLE_VERDICT
    seconds = time.perf_counter() - start
    report = write_report(
        trainer.run_dir,
        config,
        history,
        before,
        after,
        hacking,
        curve,
        items,
        images_before,
        images_after,
        seconds,
        oracle=oracle,
    )
    result = DemoResult(trainer.run_dir, report, before, after, hacking, curve, seconds, oracle)
    (trainer.run_dir / "summary.json").write_text(json.dumps(result.summary(), indent=2))
    return result
