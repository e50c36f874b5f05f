"""Plots written to a run folder: the reward curve of a training run."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def reward_curve(history: list[dict[str, Any]], ylabel: str, title: str, path: Path) -> Path | None:
    """Mean reward per step with a +-1 standard-error band, from the trainer's metrics.

    Skipped steps are left out; returns None (and writes nothing) when no step remains.
    """
    kept = [m for m in history if not m.get("skipped")]
    if not kept:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in kept]
    mean = [m["reward_mean"] for m in kept]
    err = [m["reward_stderr"] for m in kept]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(steps, mean, marker="o", ms=3)
    ax.fill_between(steps, [a - b for a, b in zip(mean, err)], [a + b for a, b in zip(mean, err)], alpha=0.25)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
