"""Writing an evaluation's outputs: per-sample scores, summary, markdown report and plots.

Files in the output folder:

- ``scores.jsonl``: one line per sample: id, row, prompt, category, target, and per reward key its
  scores (one per image) or ``null`` with the error in ``errors``;
- ``summary.json``: every metric with its bootstrap interval, coverage, failures, per category,
  and ``bootstrap_unit``, what the intervals resample (images, pairs, prompts or clusters);
- ``report.md``: the rewards side by side in markdown tables;
- ``score_histogram.png``, ``scatter_mos.png`` (mos task), ``accuracy_per_category.png``
  (when the data has categories).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from genalign.rewards.evaluation.data import EvalDataset

logger = logging.getLogger(__name__)

PRIMARY_METRIC = {"preference": "accuracy_pickscore", "ranking": "inversion_score", "mos": "srcc"}
MAX_FAILURES_SHOWN = 10


def _clean(value: Any) -> Any:
    """JSON-safe copy: NaN/inf -> None, numpy scalars -> Python."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _format(entry: Mapping[str, float] | None) -> str:
    if not entry or entry.get("value") is None or not math.isfinite(entry["value"]):
        return "n/a"
    text = f"{entry['value']:.3f}"
    low, high = entry.get("ci_low"), entry.get("ci_high")
    if low is not None and high is not None and math.isfinite(low) and math.isfinite(high):
        text += f" [{low:.3f}, {high:.3f}]"
    return text


def write_scores(dataset: EvalDataset, results: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for sample in dataset.samples:
            line = {
                "id": sample.id,
                "row": sample.row,
                "prompt": sample.prompt,
                "category": sample.category,
                "target": sample.target,
                "scores": {},
                "errors": {},
            }
            for key, per_sample in results.items():
                result = per_sample.get(sample.id)
                line["scores"][key] = None if result is None else result.scores
                if result is None or result.scores is None:
                    line["errors"][key] = "not scored" if result is None else result.error
            handle.write(json.dumps(_clean(line)) + "\n")


def markdown_report(summary: Mapping[str, Any]) -> str:
    """The rewards side by side: one row per reward, one column per metric (value [95% CI])."""
    rewards = summary["rewards"]
    names = sorted({name for entry in rewards.values() for name in entry["metrics"]}, key=_metric_order)
    lines = [
        f"# Reward evaluation: {summary['task']}",
        "",
        f"Data: `{summary['data']}` ({summary['n_samples']} samples). "
        f"Intervals: {int(summary['confidence'] * 100)}% percentile bootstrap, "
        f"{summary['bootstrap']} resamples, seed {summary['seed']}; {resampling_unit(summary)}.",
        "",
        "| reward | scored | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for key, entry in rewards.items():
        cells = [_format(entry["metrics"].get(name)) for name in names]
        lines.append(f"| `{key}` | {entry['n_scored']}/{entry['n_total']} | " + " | ".join(cells) + " |")
    notes = []
    for key, entry in rewards.items():
        if "pickscore" in entry:
            p = entry["pickscore"]
            notes.append(
                f"- `{key}`: PickScore tie threshold {p['threshold']} (tuned on {p['validation_pairs']} "
                f"validation pairs, accuracy on {p['test_pairs']} test pairs); {entry.get('human_ties', 0)} human ties."
            )
    if notes:
        lines += ["", *notes]
    lines += _category_table(summary)
    lines += _failure_section(summary)
    spec_lines = [
        f"- `{key}`: `{entry['name']}` {json.dumps(entry['kwargs'], default=str)}"
        for key, entry in rewards.items()
    ]
    lines += ["", "## Rewards", "", *spec_lines, ""]
    return "\n".join(lines)


def resampling_unit(summary: Mapping[str, Any]) -> str:
    """``intervals resample images`` (pairs, prompts), or ``intervals resample clusters (column
    `X`, K clusters)`` for a cluster bootstrap (``summary["bootstrap_unit"]``)."""
    unit = summary.get("bootstrap_unit") or {}
    if unit.get("unit") == "clusters":
        return f"intervals resample clusters (column `{unit['column']}`, {unit['n_clusters']} clusters)"
    return f"intervals resample {unit.get('unit', 'samples')}"


def _metric_order(name: str) -> tuple[bool, int, str]:
    order = [
        "accuracy_pickscore",
        "accuracy_skip_ties",
        "accuracy_strict",
        "inversion_score",
        "accuracy_imagereward",
        "srcc",
        "krcc",
        "plcc",
    ]
    base = name.replace("_fitted", "")
    return (name.endswith("_fitted"), order.index(base) if base in order else len(order), name)


def _category_table(summary: Mapping[str, Any]) -> list[str]:
    rewards = summary["rewards"]
    if not any("per_category" in entry for entry in rewards.values()):
        return []
    metric = PRIMARY_METRIC[summary["task"]]
    categories = sorted({c for entry in rewards.values() for c in entry.get("per_category", {})})
    lines = ["", f"## Per category ({metric})", "", "| reward | " + " | ".join(categories) + " |"]
    lines.append("|---|" + "---|" * len(categories))
    for key, entry in rewards.items():
        per = entry.get("per_category", {})
        cells = [_format(per.get(c, {}).get("metrics", {}).get(metric)) for c in categories]
        lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
    return lines


def _failure_section(summary: Mapping[str, Any]) -> list[str]:
    lines = []
    for key, entry in summary["rewards"].items():
        if entry["n_failed"]:
            lines += ["", f"### `{key}`: {entry['n_failed']} of {entry['n_total']} samples not scored", ""]
            for failure in entry["failures"][:MAX_FAILURES_SHOWN]:
                where = failure.get("line") or f"row {failure['row'] + 1}"
                lines.append(f"- {where} (`{failure['id']}`): {failure['error']}")
            if entry["n_failed"] > MAX_FAILURES_SHOWN:
                lines.append(f"- ... {entry['n_failed'] - MAX_FAILURES_SHOWN} more in summary.json")
    if lines:
        lines = ["", "## Failures (excluded from the metrics, counted in `scored`)", *lines]
    return lines


# -- plots -------------------------------------------------------------------------------------------


def plot_histograms(results: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3), squeeze=False)
    for ax, (key, per_sample) in zip(axes[0], results.items()):
        values = [s for r in per_sample.values() if r.scores is not None for s in r.scores]
        ax.hist(values, bins=30, color="tab:blue")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("score")
    axes[0][0].set_ylabel("images")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_mos_scatter(dataset: EvalDataset, results: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from genalign.rewards.evaluation.metrics import fit_logistic4, logistic4

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.2), squeeze=False)
    for ax, (key, per_sample) in zip(axes[0], results.items()):
        pairs = [
            (per_sample[s.id].scores[0], s.target)
            for s in dataset.samples
            if per_sample[s.id].scores is not None
        ]
        if not pairs:
            continue
        x, y = np.array(pairs, dtype=float).T
        ax.scatter(x, y, s=8, alpha=0.7)
        params = fit_logistic4(x, y) if len(x) >= 4 else None
        if params is not None:
            grid = np.linspace(x.min(), x.max(), 200)
            ax.plot(grid, logistic4(grid, *params), color="tab:red", label="logistic fit")
            ax.legend(fontsize=7)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("score")
        ax.set_ylabel("MOS")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_per_category(summary: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = PRIMARY_METRIC[summary["task"]]
    rewards = summary["rewards"]
    categories = sorted({c for entry in rewards.values() for c in entry.get("per_category", {})})
    width = 0.8 / max(len(rewards), 1)
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(categories) * len(rewards)), 3.2))
    for offset, (key, entry) in enumerate(rewards.items()):
        stats = [entry["per_category"].get(c, {}).get("metrics", {}).get(metric, {}) for c in categories]
        values = np.array([s.get("value", np.nan) for s in stats], dtype=float)
        low = np.array([s.get("ci_low", np.nan) for s in stats], dtype=float)
        high = np.array([s.get("ci_high", np.nan) for s in stats], dtype=float)
        errors = np.nan_to_num(np.stack([values - low, high - values]), nan=0.0).clip(min=0)
        positions = np.arange(len(categories)) + offset * width
        ax.bar(positions, np.nan_to_num(values), width, yerr=errors, capsize=2, label=key)
    ax.set_xticks(np.arange(len(categories)) + width * (len(rewards) - 1) / 2)
    ax.set_xticklabels(categories, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(metric)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_outputs(
    dataset: EvalDataset,
    results: Mapping[str, Mapping[str, Any]],
    summary: Mapping[str, Any],
    out_dir: Path,
) -> dict[str, Path]:
    """Write every output file; returns their paths by kind."""
    paths = {
        "scores": out_dir / "scores.jsonl",
        "summary": out_dir / "summary.json",
        "report": out_dir / "report.md",
        "histogram": out_dir / "score_histogram.png",
    }
    write_scores(dataset, results, paths["scores"])
    paths["summary"].write_text(json.dumps(_clean(summary), indent=2), encoding="utf-8")
    paths["report"].write_text(markdown_report(_clean(summary)), encoding="utf-8")
    if results:
        plot_histograms(results, paths["histogram"])
        if dataset.task == "mos":
            paths["scatter"] = out_dir / "scatter_mos.png"
            plot_mos_scatter(dataset, results, paths["scatter"])
        if dataset.has_categories:
            paths["per_category"] = out_dir / "accuracy_per_category.png"
            plot_per_category(_clean(summary), paths["per_category"])
    logger.info("wrote %s", ", ".join(str(p) for p in paths.values()))
    return paths
