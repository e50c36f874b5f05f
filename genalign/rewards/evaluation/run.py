"""Score a data set with one or more rewards (cached, resumable) and compute the task's metrics.

Scores are cached per reward configuration in ``<out>/cache/<reward-key>.jsonl``, one line per
sample (``{"id", "scores"}``), appended as each batch finishes; the reward key is the reward name
plus a hash of its keyword arguments, and a sample's cache id hashes its prompt and the bytes of
its images (:func:`~genalign.rewards.evaluation.data.content_key`), so a replaced image file is
scored again.
An interrupted run therefore resumes without rescoring. Failures (unreadable images, a reward that
raises or returns NaN) are recorded per sample, reported, and never cached, so they are retried.

Metrics are computed over the scored samples; ``n_scored / n_total`` (coverage) and every failure
are reported beside them. PickScore's tie threshold is tuned once on the validation split (rows
whose ``split`` is validation/val/valid, else a seeded random ``validation_fraction`` of the pairs)
and the accuracy and its bootstrap interval are computed on the remaining test pairs with that
threshold fixed; per-category numbers reuse the same threshold and test pairs.

Intervals resample pairs (preference), prompts (ranking) or images (mos), unless the samples
carry a ``cluster`` (the data's cluster column, or :attr:`EvalConfig.cluster_by`): then every
preference and MOS interval, overall and per category, resamples whole clusters
(:func:`~genalign.rewards.evaluation.metrics.cluster_bootstrap_index`) with the same seeds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genalign.rewards.evaluation import metrics
from genalign.rewards.evaluation.data import (
    VALIDATION_SPLITS,
    EvalDataset,
    EvalSample,
    content_key,
    load_image_tensor,
)

logger = logging.getLogger(__name__)

# the sample fields a bootstrap can cluster by (EvalConfig.cluster_by); any other file column is
# mapped onto ``cluster`` with --columns cluster=COLUMN
CLUSTER_BY = ("cluster", "prompt", "category", "id")
BOOTSTRAP_UNITS = {"preference": "pairs", "ranking": "prompts", "mos": "images"}
FEW_CLUSTERS = 10  # below this many clusters a cluster bootstrap's interval is rough


@dataclass
class RewardSpec:
    """A reward to evaluate: registry name and keyword arguments for ``load_reward``."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """``<name>-<hash of kwargs>``: the cache file stem and the column name in outputs."""
        payload = json.dumps(self.kwargs, sort_keys=True, default=str)
        return f"{self.name}-{hashlib.sha1(payload.encode()).hexdigest()[:8]}"


def parse_reward_specs(names: Sequence[str], arguments: Sequence[str] = ()) -> list[RewardSpec]:
    """``["jpeg_compressibility,clip"]`` and ``["clip.model=ViT-B-32", "device=cpu"]`` -> specs.

    An argument ``NAME.key=value`` goes to the reward NAME only; ``key=value`` to every reward.
    Values are parsed as YAML (``1`` -> int, ``null`` -> None, ``[a, b]`` -> list).
    """
    import yaml

    listed = [name.strip() for item in names for name in item.split(",") if name.strip()]
    if not listed:
        raise ValueError("give at least one reward with --reward")
    specs = [RewardSpec(name) for name in listed]
    for argument in arguments:
        if "=" not in argument:
            raise ValueError(f"reward argument {argument!r} must look like key=value or NAME.key=value")
        key, text = argument.split("=", 1)
        value = yaml.safe_load(text) if text else ""
        target, _, field_name = key.rpartition(".")
        if target and target not in listed:
            raise ValueError(
                f"reward argument {argument!r} names reward {target!r}, which is not in {listed}"
            )
        for spec in specs:
            if not target or spec.name == target:
                spec.kwargs[field_name] = value
    return specs


@dataclass
class EvalConfig:
    """Options of one evaluation run.

    Attributes:
        batch_size: images per reward call.
        bootstrap: bootstrap resamples per interval (0 disables intervals).
        seed: seed of the bootstrap and of PickScore's random validation split.
        image_size: resize every image to a square of this side (None: keep sizes; images of
            different sizes are scored in separate calls).
        tie_threshold: fixed PickScore tie threshold; None tunes it on the validation split.
        validation_fraction: share of pairs used to tune the threshold when the data has no split column.
        temperature: softmax temperature turning reward scores into PickScore probabilities.
        progress: show a progress bar.
        cluster_by: resample whole clusters of samples sharing this field (one of
            :data:`CLUSTER_BY`, e.g. ``"prompt"``) in the preference and MOS intervals; None uses
            the data's ``cluster`` column when it has one, else resamples single pairs / images.
    """

    batch_size: int = 16
    bootstrap: int = 1000
    seed: int = 0
    image_size: int | None = None
    tie_threshold: float | None = None
    validation_fraction: float = 0.5
    temperature: float = 1.0
    progress: bool = True
    cluster_by: str | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.bootstrap < 0:
            raise ValueError(f"bootstrap must be >= 0, got {self.bootstrap}")
        if not 0 < self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.cluster_by is not None and self.cluster_by not in CLUSTER_BY:
            raise ValueError(
                f"cluster_by must be one of {CLUSTER_BY}, got {self.cluster_by!r}; to cluster by "
                f"another column of the file, map it: --columns cluster={self.cluster_by}"
            )


@dataclass
class SampleResult:
    """Scores of one sample under one reward (one per image), or why it has none."""

    scores: list[float] | None = None
    error: str | None = None


# -- scoring -----------------------------------------------------------------------------------------


class ScoreCache:
    """Append-only JSONL of ``{"id", "scores"}`` lines for one reward configuration."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, list[float]] = {}
        if path.exists():
            with path.open(encoding="utf-8") as handle:
                for line in handle:
                    try:
                        entry = json.loads(line)
                        self.entries[entry["id"]] = [float(s) for s in entry["scores"]]
                    except (json.JSONDecodeError, KeyError, TypeError):  # a line cut by an interruption
                        continue

    def add(self, results: Mapping[str, list[float]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            for sample_id, scores in results.items():
                handle.write(json.dumps({"id": sample_id, "scores": scores}) + "\n")
        self.entries.update(results)


def _chunks(samples: Sequence[EvalSample], batch_size: int) -> list[list[EvalSample]]:
    """Consecutive groups of whole samples holding about ``batch_size`` images each."""
    chunks, current, images = [], [], 0
    for sample in samples:
        current.append(sample)
        images += len(sample.images)
        if images >= batch_size:
            chunks.append(current)
            current, images = [], 0
    if current:
        chunks.append(current)
    return chunks


def _call_reward(reward: Callable, images: list[torch.Tensor], prompts: list[str]) -> list[float]:
    """Score images grouped by size; raises on failure or NaN."""
    scores: list[float | None] = [None] * len(images)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for index, image in enumerate(images):
        by_shape.setdefault(tuple(image.shape), []).append(index)
    for indices in by_shape.values():
        batch = torch.stack([images[i] for i in indices])  # (B, 3, H, W)
        with torch.no_grad():
            out = reward(batch, [prompts[i] for i in indices])
        values = out.scores.detach().float().cpu().tolist()
        for i, value in zip(indices, values):
            scores[i] = value
    if any(s is None or not np.isfinite(s) for s in scores):
        raise FloatingPointError("reward returned NaN or infinite scores")
    return scores  # type: ignore[return-value]


def score_chunk(
    reward: Callable, chunk: Sequence[EvalSample], dataset: EvalDataset, image_size: int | None
) -> dict[str, SampleResult]:
    """Load a chunk's images and score them; per-sample errors instead of exceptions."""
    results: dict[str, SampleResult] = {}
    loaded: list[tuple[EvalSample, list[torch.Tensor]]] = []
    for sample in chunk:
        try:
            images = [load_image_tensor(ref, dataset.base_dir, image_size) for ref in sample.images]
        except Exception as error:  # noqa: BLE001 - any decoding failure makes the sample unscorable
            results[sample.id] = SampleResult(error=f"unreadable image: {error}")
            continue
        loaded.append((sample, images))
    if not loaded:
        return results
    flat = [image for _, images in loaded for image in images]
    prompts = [sample.prompt for sample, images in loaded for _ in images]
    try:
        scores = _call_reward(reward, flat, prompts)
    except Exception as error:  # noqa: BLE001 - isolate the failing samples one by one
        if len(loaded) == 1:
            results[loaded[0][0].id] = SampleResult(error=f"reward failed: {type(error).__name__}: {error}")
            return results
        logger.info("batch failed (%s); rescoring its %d samples one by one", error, len(loaded))
        for sample, images in loaded:
            try:
                results[sample.id] = SampleResult(_call_reward(reward, images, [sample.prompt] * len(images)))
            except Exception as sample_error:  # noqa: BLE001
                results[sample.id] = SampleResult(
                    error=f"reward failed: {type(sample_error).__name__}: {sample_error}"
                )
        return results
    start = 0
    for sample, images in loaded:
        results[sample.id] = SampleResult(scores[start : start + len(images)])
        start += len(images)
    return results


def score_dataset(
    reward: Callable, dataset: EvalDataset, cache_path: Path, config: EvalConfig, desc: str = ""
) -> dict[str, SampleResult]:
    """Scores of every sample under ``reward``, reading and extending the cache at ``cache_path``."""
    from genalign.utils.progress import progress_bar

    cache = ScoreCache(cache_path)
    # cached by content: a replaced image file is rescored, a moved one is not
    keys = {s.id: content_key(s, dataset.base_dir) for s in dataset.samples}
    results = {
        s.id: SampleResult(cache.entries[keys[s.id]]) for s in dataset.samples if keys[s.id] in cache.entries
    }
    todo: dict[str, EvalSample] = {}
    for sample in dataset.samples:
        if sample.id not in results:
            todo.setdefault(sample.id, sample)
    if results:
        logger.info("%s: %d samples cached, %d to score", desc, len(results), len(todo))
    total_images = sum(len(s.images) for s in todo.values())
    bar = progress_bar(
        range(total_images),
        desc=desc,
        disable=not config.progress or not todo,
        total=total_images,
        unit="img",
    )
    started = time.perf_counter()
    for chunk in _chunks(list(todo.values()), config.batch_size):
        chunk_results = score_chunk(reward, chunk, dataset, config.image_size)
        cache.add({keys[key]: r.scores for key, r in chunk_results.items() if r.scores is not None})
        results.update(chunk_results)
        bar.update(sum(len(s.images) for s in chunk))
    bar.close()
    if todo:
        elapsed = time.perf_counter() - started
        logger.info(
            "%s: scored %d images in %.1fs (%.1f images/s)",
            desc,
            total_images,
            elapsed,
            total_images / max(elapsed, 1e-9),
        )
    return results


# -- metrics -----------------------------------------------------------------------------------------


def sample_clusters(samples: Sequence[EvalSample], cluster_by: str | None) -> np.ndarray | None:
    """The samples' cluster labels (their ``cluster_by`` field, default their ``cluster``), or
    None when they have none and ``cluster_by`` is not set. Raises when some samples lack one."""
    name = cluster_by or "cluster"
    labels = [getattr(sample, name) for sample in samples]
    if cluster_by is None and all(label is None for label in labels):
        return None
    missing = [s.line or f"row {s.row + 1}" for s, label in zip(samples, labels) if label in (None, "")]
    if missing:
        raise ValueError(
            f"cannot cluster by {name!r}: it is empty in {len(missing)} of {len(samples)} samples "
            f"({', '.join(missing[:10])})"
        )
    return np.array(labels, dtype=object)


def bootstrap_unit(dataset: EvalDataset, config: EvalConfig, warn: bool = True) -> dict[str, Any]:
    """What the intervals resample: ``{"unit": "images" | "pairs" | "prompts"}``, or
    ``{"unit": "clusters", "column": <file column>, "n_clusters": K}``; checks the clusters
    (``warn``: log when there are fewer than :data:`FEW_CLUSTERS`)."""
    if dataset.task == "ranking":
        if config.cluster_by is not None:
            raise ValueError(
                "cluster_by is for the preference and mos tasks: a ranking sample is already one prompt"
            )
        return {"unit": BOOTSTRAP_UNITS["ranking"]}
    clusters = sample_clusters(dataset.samples, config.cluster_by)
    if clusters is None:
        return {"unit": BOOTSTRAP_UNITS[dataset.task]}
    name = config.cluster_by or "cluster"
    n_clusters = len(set(clusters.tolist()))
    if warn and n_clusters < FEW_CLUSTERS:
        logger.warning("only %d clusters: a cluster bootstrap's intervals are rough with so few", n_clusters)
    return {"unit": "clusters", "column": dataset.columns.get(name, name), "n_clusters": n_clusters}


def _with_interval(value: float, interval: tuple[float, float]) -> dict[str, float]:
    return {"value": float(value), "ci_low": interval[0], "ci_high": interval[1]}


def _pickscore_split(samples: Sequence[EvalSample], config: EvalConfig) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (validation, test) for PickScore's threshold tuning."""
    n = len(samples)
    marked = np.array([(s.split or "").lower() in VALIDATION_SPLITS for s in samples], dtype=bool)
    if marked.any():
        return marked, ~marked
    validation = np.zeros(n, dtype=bool)
    if n >= 2:
        order = np.random.default_rng(config.seed).permutation(n)
        validation[order[: max(1, int(round(config.validation_fraction * n)))]] = True
    return validation, ~validation


def preference_metrics(
    samples: Sequence[EvalSample], scores: np.ndarray, config: EvalConfig
) -> dict[str, Any]:
    """Accuracy under each tie policy, with intervals; ``scores`` is ``[N, 2]``."""
    labels = np.array([s.target for s in samples], dtype=float)
    s0, s1 = scores[:, 0], scores[:, 1]
    result: dict[str, Any] = {"metrics": {}, "credits": {}}
    if config.tie_threshold is not None:
        threshold, validation, test, curve = (
            config.tie_threshold,
            np.zeros(len(samples), bool),
            np.ones(len(samples), bool),
            [],
        )
    else:
        validation, test = _pickscore_split(samples, config)
        if validation.any() and test.any():
            threshold, curve = metrics.tune_tie_threshold(
                s0[validation], s1[validation], labels[validation], temperature=config.temperature
            )
        else:  # too few pairs to hold some out: no tie is ever predicted unless scores are equal
            threshold, curve, validation, test = (
                0.0,
                [],
                np.zeros(len(samples), bool),
                np.ones(len(samples), bool),
            )
    credits = {
        "pickscore": np.where(
            test,
            metrics.preference_credit(s0, s1, labels, "pickscore", threshold, config.temperature),
            np.nan,
        ),
        "skip-ties": metrics.preference_credit(s0, s1, labels, "skip-ties"),
        "strict": metrics.preference_credit(s0, s1, labels, "strict"),
    }
    clusters = sample_clusters(samples, config.cluster_by)
    for offset, (policy, credit) in enumerate(credits.items()):
        name = "accuracy_" + policy.replace("-", "_")
        value = float(np.nanmean(credit)) if np.isfinite(credit).any() else float("nan")
        result["metrics"][name] = _with_interval(
            value,
            metrics.mean_interval(credit, config.bootstrap, config.seed + offset, clusters=clusters),
        )
    result["credits"] = credits
    result["pickscore"] = {
        "threshold": threshold,
        "validation_pairs": int(validation.sum()),
        "test_pairs": int(test.sum()),
        "validation_accuracies": curve,
        "temperature": config.temperature,
    }
    result["human_ties"] = int(np.sum(labels == 0.5))
    return result


def ranking_metrics(
    samples: Sequence[EvalSample], scores: Sequence[list[float]], config: EvalConfig
) -> dict[str, Any]:
    """Mean HPS v2 inversion score over prompts and ImageReward's pooled pair accuracy, each with
    an interval resampling prompts."""
    per_prompt = np.array(
        [metrics.inversion_score(s.target, sc) for s, sc in zip(samples, scores)], dtype=float
    )
    value = float(np.mean(per_prompt)) if per_prompt.size else float("nan")
    interval = metrics.mean_interval(per_prompt, config.bootstrap, config.seed)
    counts = np.array(
        [metrics.imagereward_pair_counts(s.target, sc) for s, sc in zip(samples, scores)], dtype=float
    ).reshape(-1, 2)
    return {
        "metrics": {
            "inversion_score": _with_interval(value, interval),
            "accuracy_imagereward": _with_interval(
                *metrics.pooled_accuracy(counts, config.bootstrap, config.seed)
            ),
        },
        "credits": {"inversion_score": per_prompt, "imagereward": counts},
    }


def mos_metrics(samples: Sequence[EvalSample], scores: np.ndarray, config: EvalConfig) -> dict[str, Any]:
    """SRCC / KRCC / PLCC raw and after the logistic fit, each with a bootstrap interval."""
    mos = np.array([s.target for s in samples], dtype=float)
    x = scores[:, 0] if scores.size else np.zeros(0)
    point = metrics.mos_correlations(x, mos) if len(x) else {}
    intervals = metrics.bootstrap_intervals(
        lambda index: metrics.mos_correlations(x[index], mos[index]),
        len(x),
        config.bootstrap,
        config.seed,
        clusters=sample_clusters(samples, config.cluster_by),
    )
    nan = (float("nan"), float("nan"))
    return {
        "metrics": {name: _with_interval(value, intervals.get(name, nan)) for name, value in point.items()}
    }


TASK_METRICS = {"preference": preference_metrics, "ranking": ranking_metrics, "mos": mos_metrics}


def compute_metrics(
    dataset: EvalDataset, results: Mapping[str, SampleResult], config: EvalConfig
) -> dict[str, Any]:
    """Metrics over the scored samples, coverage counts, failures and per-category breakdowns."""
    scored = [
        s for s in dataset.samples if results.get(s.id, SampleResult(error="not scored")).scores is not None
    ]
    failures = [
        {
            "id": s.id,
            "row": s.row,
            "line": s.line,
            "error": results.get(s.id, SampleResult(error="not scored")).error,
        }
        for s in dataset.samples
        if results.get(s.id, SampleResult(error="not scored")).scores is None
    ]
    bootstrap_unit(dataset, config, warn=False)  # checks the clusters before any metric
    summary: dict[str, Any] = {
        "n_total": len(dataset.samples),
        "n_scored": len(scored),
        "n_failed": len(failures),
        "coverage": len(scored) / max(len(dataset.samples), 1),
        "failures": failures,
    }
    if failures:
        logger.warning(
            "%d of %d samples could not be scored (see summary.json)", len(failures), len(dataset.samples)
        )
    task_fn = TASK_METRICS[dataset.task]

    def run(subset: Sequence[EvalSample]) -> dict[str, Any]:
        values = [results[s.id].scores for s in subset]
        array = (
            values if dataset.task == "ranking" else np.array(values, dtype=float).reshape(len(subset), -1)
        )
        return task_fn(subset, array, config)

    overall = run(scored) if scored else {"metrics": {}}
    summary["metrics"] = overall["metrics"]
    if "pickscore" in overall:
        summary["pickscore"] = overall["pickscore"]
        summary["human_ties"] = overall["human_ties"]
    if dataset.has_categories:
        summary["per_category"] = _per_category(dataset, scored, overall, run, config)
    return summary


def _per_category(
    dataset: EvalDataset,
    scored: Sequence[EvalSample],
    overall: Mapping[str, Any],
    run: Callable[[Sequence[EvalSample]], dict[str, Any]],
    config: EvalConfig,
) -> dict[str, Any]:
    """Per-category metrics. Credit-based tasks reuse the overall per-unit credits (so PickScore
    keeps the globally tuned threshold and its test split); MOS correlations are recomputed."""
    categories = sorted({s.category for s in dataset.samples if s.category is not None})
    scored_categories = np.array([s.category for s in scored], dtype=object)
    clusters = None if dataset.task == "ranking" else sample_clusters(scored, config.cluster_by)
    breakdown = {}
    for category in categories:
        mask = scored_categories == category
        entry: dict[str, Any] = {
            "n_total": sum(s.category == category for s in dataset.samples),
            "n_scored": int(mask.sum()),
            "metrics": {},
        }
        if "credits" in overall:
            for policy, credit in overall["credits"].items():
                name = policy if policy == "inversion_score" else "accuracy_" + policy.replace("-", "_")
                values = np.asarray(credit, dtype=float)[mask]
                if policy == "imagereward":  # (right, counted) per prompt: a pooled ratio
                    entry["metrics"][name] = _with_interval(
                        *metrics.pooled_accuracy(values, config.bootstrap, config.seed)
                    )
                    continue
                value = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
                entry["metrics"][name] = _with_interval(
                    value,
                    metrics.mean_interval(
                        values,
                        config.bootstrap,
                        config.seed,
                        clusters=None if clusters is None else clusters[mask],
                    ),
                )
        elif mask.any():
            entry["metrics"] = run([s for s, keep in zip(scored, mask) if keep])["metrics"]
        breakdown[category] = entry
    return breakdown


# -- entry point -------------------------------------------------------------------------------------


def evaluate_rewards(
    dataset: EvalDataset,
    rewards: Sequence[RewardSpec],
    out_dir: str | Path,
    config: EvalConfig | None = None,
    reward_factory: Callable[[RewardSpec], Callable] | None = None,
) -> dict[str, Any]:
    """Score ``dataset`` with every reward, compute metrics and write all outputs to ``out_dir``.

    Args:
        dataset: from :func:`~genalign.rewards.evaluation.data.load_eval_dataset`.
        rewards: reward specs; their keys name columns, cache files and report rows.
        out_dir: gets ``scores.jsonl``, ``summary.json``, ``report.md``, PNG plots and ``cache/``.
        config: run options.
        reward_factory: builds a reward from a spec (default: ``load_reward(name, **kwargs)``).

    Returns:
        The summary written to ``summary.json``.
    """
    from genalign.rewards.evaluation import report

    config = config or EvalConfig()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if reward_factory is None:
        from genalign.rewards import load_reward

        def reward_factory(spec: RewardSpec) -> Callable:
            return load_reward(spec.name, **spec.kwargs).eval()

    all_results: dict[str, dict[str, SampleResult]] = {}
    summary: dict[str, Any] = {
        "task": dataset.task,
        "data": dataset.source,
        "n_samples": len(dataset.samples),
        "columns": dataset.columns,
        "bootstrap": config.bootstrap,
        "confidence": 0.95,
        "seed": config.seed,
        "bootstrap_unit": bootstrap_unit(dataset, config),
        "rewards": {},
    }
    for spec in rewards:
        reward = reward_factory(spec)
        results = score_dataset(
            reward, dataset, out_dir / "cache" / f"{spec.key}.jsonl", config, desc=spec.key
        )
        all_results[spec.key] = results
        entry = compute_metrics(dataset, results, config)
        summary["rewards"][spec.key] = {"name": spec.name, "kwargs": spec.kwargs, **entry}
        del reward
    report.write_outputs(dataset, all_results, summary, out_dir)
    return summary
