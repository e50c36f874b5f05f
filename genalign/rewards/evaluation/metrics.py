"""Agreement metrics between reward scores and human judgements, with bootstrap intervals.

Preference (pairs; ``label`` = 0 image_0 wins, 1 image_1 wins, 0.5 tie), three tie policies:

- ``pickscore`` (Kirstain et al., "Pick-a-Pic", NeurIPS 2023, Sec. 5 and their
  ``eval_preference_predictor.py``): the two scores become probabilities
  ``p = softmax([s0, s1] / temperature)`` (PickScore's scores are already multiplied by CLIP's
  logit scale, so temperature 1 reproduces it); a tie is predicted when ``|p1 - p0| <= t``; credit is
  1 when prediction equals label, 0.5 when exactly one of them is a tie, else 0. ``t`` is chosen
  from ``{0, 0.1, ..., 1}`` by accuracy on a validation split (first best), then applied to the test split.
- ``skip-ties``: human ties are dropped; a strictly higher score on the winner scores 1, the
  loser 0, exactly equal scores 0.5 (a coin flip's expectation).
- ``strict``: every pair counts; a human tie is right only when the scores are exactly equal, a
  decided pair only when the winner scores strictly higher.

Ranking, two official readings:

- ``inversion_score`` (HPS v2, Wu et al. 2023, ``evaluate_rank``): per prompt
  ``1 - inversions / (n (n - 1) / 2)``, an inversion being a pair ordered one way by humans and the
  other by the reward (human ties are never inversions); the mean over prompts. HPS v2 ranks the
  scores with an argsort, which orders equal scores arbitrarily; a pair the reward ties counts half
  an inversion here, the expectation over that order (so the score does not depend on the order of
  the images in the file).
- ``accuracy_imagereward`` (ImageReward, Xu et al. 2023, ``test.py``'s ``acc``; HPS v2 uses it too on
  ImageReward's test set, which has human ties): over every pair of every prompt, pooled, pairs
  humans tied are left out and a pair the reward ties counts as wrong.

MOS (IQA practice, VQEG 2000 Phase I report): SRCC, KRCC, PLCC of scores against MOS, raw and
after mapping the scores through the 4-parameter logistic
``f(x) = (b1 - b2) / (1 + exp(-(x - b3) / |b4|)) + b2`` fitted by least squares. The fitted
values predict MOS, so ``plcc_fitted`` measures prediction accuracy and is positive for a good fit
whether the reward rises or falls with quality; the raw correlations keep the sign.

Intervals are percentile bootstraps. By default they resample the units (images, pairs, prompts)
independently; given ``clusters`` (one label per unit), :func:`bootstrap_intervals` and
:func:`mean_interval` run a cluster bootstrap instead: each resample draws K cluster labels with
replacement from the K clusters and takes every unit of each drawn cluster
(:func:`cluster_bootstrap_index`), so units that share a scene or a prompt stay together and the
interval reflects how much the clusters, not the units, vary. With one unit per cluster the
resamples, and so the intervals, are exactly the unit-level ones.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Hashable, Iterator, Sequence

import numpy as np
from scipy import optimize, special, stats

logger = logging.getLogger(__name__)

TIE_POLICIES = ("pickscore", "skip-ties", "strict")
PICKSCORE_THRESHOLDS = tuple(round(0.1 * i, 1) for i in range(11))  # PickScore's grid {0, 0.1, ..., 1}


# -- preference --------------------------------------------------------------------------------------


def pickscore_probability_gap(
    scores_0: np.ndarray, scores_1: np.ndarray, temperature: float = 1.0
) -> np.ndarray:
    """``p1 - p0`` with ``p = softmax([s0, s1] / temperature)``, i.e. ``tanh((s1 - s0) / (2 T))``."""
    diff = (np.asarray(scores_1, float) - np.asarray(scores_0, float)) / temperature
    return np.tanh(diff / 2.0)


def preference_credit(
    scores_0: Sequence[float],
    scores_1: Sequence[float],
    labels: Sequence[float],
    policy: str = "pickscore",
    threshold: float = 0.0,
    temperature: float = 1.0,
) -> np.ndarray:
    """Per-pair credit in {0, 0.5, 1} under ``policy``; NaN for pairs the policy drops.

    Args:
        scores_0, scores_1: reward scores of the two images, ``[N]``.
        labels: ``[N]`` in {0, 0.5, 1} (probability that image_1 is preferred).
        policy: one of :data:`TIE_POLICIES`.
        threshold: PickScore's tie threshold on ``|p1 - p0|`` (``pickscore`` only).
        temperature: softmax temperature turning scores into PickScore probabilities.
    """
    s0, s1, y = (np.asarray(a, dtype=float) for a in (scores_0, scores_1, labels))
    human_tie = y == 0.5
    human_winner = np.where(y > 0.5, 1, 0)
    if policy == "pickscore":
        gap = pickscore_probability_gap(s0, s1, temperature)
        predicted_tie = np.abs(gap) <= threshold
        predicted_winner = np.where(gap > 0, 1, 0)
        same = (predicted_tie & human_tie) | (
            ~predicted_tie & ~human_tie & (predicted_winner == human_winner)
        )
        one_tie = predicted_tie ^ human_tie
        return np.where(same, 1.0, np.where(one_tie, 0.5, 0.0))
    if policy == "skip-ties":
        right = np.where(human_winner == 1, s1 > s0, s0 > s1)
        credit = np.where(s0 == s1, 0.5, right.astype(float))
        return np.where(human_tie, np.nan, credit)
    if policy == "strict":
        right = np.where(human_winner == 1, s1 > s0, s0 > s1)
        return np.where(human_tie, (s0 == s1).astype(float), right.astype(float))
    raise ValueError(f"unknown tie policy {policy!r}; policies are {TIE_POLICIES}")


def tune_tie_threshold(
    scores_0: Sequence[float],
    scores_1: Sequence[float],
    labels: Sequence[float],
    thresholds: Sequence[float] = PICKSCORE_THRESHOLDS,
    temperature: float = 1.0,
) -> tuple[float, list[float]]:
    """PickScore's threshold search: accuracy for each threshold; the first best one wins.

    Returns ``(best_threshold, accuracies)``.
    """
    accuracies = [
        float(np.mean(preference_credit(scores_0, scores_1, labels, "pickscore", t, temperature)))
        for t in thresholds
    ]
    return float(thresholds[int(np.argmax(accuracies))]), accuracies


# -- ranking -----------------------------------------------------------------------------------------


def scores_to_ranks(scores: Sequence[float]) -> np.ndarray:
    """0-based ranks, 0 = highest score; equal scores keep input order (stable sort)."""
    order = np.argsort(-np.asarray(scores, dtype=float), kind="stable")
    ranks = np.empty(len(order), dtype=int)
    ranks[order] = np.arange(len(order))
    return ranks


def inversion_score(human_ranks: Sequence[float], scores: Sequence[float]) -> float:
    """HPS v2's per-prompt score: ``1 - inversions / (n (n - 1) / 2)`` (human ranks: lower = better;
    higher score = better). A pair humans ranked and the reward tied is half an inversion."""
    human = np.asarray(human_ranks, dtype=float)
    score = np.asarray(scores, dtype=float)
    n = len(human)
    if n < 2:
        return float("nan")
    i, j = np.triu_indices(n, k=1)
    human_order = np.sign(human[j] - human[i])  # +1: i ranked better by humans
    reward_order = np.sign(score[i] - score[j])  # +1: i scored higher
    inversions = np.sum(human_order * reward_order < 0) + 0.5 * np.sum(
        (human_order != 0) & (reward_order == 0)
    )
    return float(1.0 - inversions / (n * (n - 1) / 2))


def imagereward_pair_counts(human_ranks: Sequence[float], scores: Sequence[float]) -> tuple[int, int]:
    """ImageReward's pair counts on one prompt: ``(right, counted)``, humans' ties left out, the
    reward's ties wrong (their ``acc``: the accuracy is the pooled ``sum right / sum counted``)."""
    human = np.asarray(human_ranks, dtype=float)
    score = np.asarray(scores, dtype=float)
    i, j = np.triu_indices(len(human), k=1)
    human_order = np.sign(human[j] - human[i])
    counted = human_order != 0
    right = counted & (human_order * np.sign(score[i] - score[j]) > 0)
    return int(right.sum()), int(counted.sum())


def pooled_accuracy(
    counts: np.ndarray, n_boot: int = 1000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, tuple[float, float]]:
    """``sum right / sum counted`` over units ``counts [n, 2]`` (right, counted) and its percentile
    bootstrap interval, resampling whole units (prompts: their pairs are not independent)."""
    counts = np.asarray(counts, dtype=float).reshape(-1, 2)
    total = counts[:, 1].sum()
    value = float(counts[:, 0].sum() / total) if total > 0 else float("nan")
    if n_boot <= 0 or total == 0:
        return value, (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(counts), size=(n_boot, len(counts)))
    right, counted = counts[index, 0].sum(axis=1), counts[index, 1].sum(axis=1)
    ratios = right[counted > 0] / counted[counted > 0]
    alpha = 100 * (1.0 - confidence) / 2.0
    low, high = np.percentile(ratios, [alpha, 100 - alpha])
    return value, (float(low), float(high))


# -- MOS ---------------------------------------------------------------------------------------------


def logistic4(x: np.ndarray, b1: float, b2: float, b3: float, b4: float) -> np.ndarray:
    """VQEG's 4-parameter logistic ``(b1 - b2) / (1 + exp(-(x - b3) / |b4|)) + b2``."""
    return (b1 - b2) * special.expit((np.asarray(x, float) - b3) / (np.abs(b4) + 1e-12)) + b2


def fit_logistic4(scores: Sequence[float], mos: Sequence[float]) -> np.ndarray | None:
    """Least-squares logistic parameters ``(b1, b2, b3, b4)``; None when the fit fails."""
    x, y = np.asarray(scores, float), np.asarray(mos, float)
    spread = float(np.std(x)) or 1.0
    # Start from the line through the data: increasing when scores and MOS correlate positively.
    increasing = np.corrcoef(x, y)[0, 1] >= 0 if np.std(x) > 0 and np.std(y) > 0 else True
    high, low = (np.max(y), np.min(y)) if increasing else (np.min(y), np.max(y))
    initial = [high, low, float(np.mean(x)), spread]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            params, _ = optimize.curve_fit(logistic4, x, y, p0=initial, maxfev=10000)
    except (RuntimeError, ValueError, optimize.OptimizeWarning):
        return None
    return params if np.all(np.isfinite(params)) else None


def _correlations(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan"), float("nan"), float("nan")
    with (
        warnings.catch_warnings()
    ):  # nearly constant inputs (a saturated logistic) give NaN, reported as such
        warnings.simplefilter("ignore")
        return (
            float(stats.spearmanr(x, y).statistic),
            float(stats.kendalltau(x, y).statistic),
            float(stats.pearsonr(x, y).statistic),
        )


def mos_correlations(scores: Sequence[float], mos: Sequence[float], fit: bool = True) -> dict[str, float]:
    """``srcc, krcc, plcc`` raw and ``*_fitted`` after the 4-parameter logistic (NaN if it fails)."""
    x, y = np.asarray(scores, float), np.asarray(mos, float)
    srcc, krcc, plcc = _correlations(x, y)
    result = {"srcc": srcc, "krcc": krcc, "plcc": plcc}
    if fit:
        params = fit_logistic4(x, y) if len(x) >= 4 else None
        fitted = logistic4(x, *params) if params is not None else None
        values = _correlations(fitted, y) if fitted is not None else (float("nan"),) * 3
        result.update(srcc_fitted=values[0], krcc_fitted=values[1], plcc_fitted=values[2])
    return result


# -- bootstrap ---------------------------------------------------------------------------------------


def cluster_codes(clusters: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    """Cluster labels as codes ``0..K-1`` in order of first appearance, and K.

    The first-appearance order makes one unit per cluster map unit ``i`` to code ``i``, so a
    cluster bootstrap of singletons draws exactly the unit-level resamples."""
    codes: dict[Hashable, int] = {}
    array = np.fromiter((codes.setdefault(label, len(codes)) for label in clusters), dtype=np.int64)
    return array, len(codes)


def cluster_bootstrap_index(
    clusters: Sequence[Hashable], n_boot: int, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """Row indices of ``n_boot`` cluster-bootstrap resamples of rows labelled ``clusters``.

    Each resample draws K cluster codes with ``rng.integers(0, K, size=K)`` (codes in order of
    first appearance, :func:`cluster_codes`) and yields the rows of every drawn cluster, in the
    drawn order, rows of one cluster in row order; a cluster drawn twice appears twice. The
    length varies with the clusters drawn; its mean over resamples is ``len(clusters)``.
    Resamples are drawn lazily, one ``rng`` call each, as the unit-level bootstrap draws them, so
    with one row per cluster they equal ``rng.integers(0, n, size=n)`` exactly.
    """
    codes, k = cluster_codes(clusters)
    order = np.argsort(codes, kind="stable")  # rows grouped by cluster, row order within
    sizes = np.bincount(codes, minlength=k)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    for _ in range(n_boot if k > 0 else 0):
        draw = rng.integers(0, k, size=k)
        lengths = sizes[draw]
        ends = np.cumsum(lengths)
        within = np.arange(ends[-1]) - np.repeat(ends - lengths, lengths)  # position inside its cluster
        yield order[np.repeat(starts[draw], lengths) + within]


def _check_clusters(clusters: Sequence[Hashable] | None, n: int) -> None:
    if clusters is not None and len(clusters) != n:
        raise ValueError(f"clusters has {len(clusters)} labels for {n} units")


def bootstrap_intervals(
    statistic: Callable[[np.ndarray], dict[str, float]],
    n: int,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    clusters: Sequence[Hashable] | None = None,
) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap intervals of several statistics computed on the same resamples.

    ``statistic`` receives an index array of length ``n`` drawn with replacement from
    ``range(n)`` and returns named values. Resamples where a value is NaN are ignored for that
    value; ``(nan, nan)`` when none is finite or ``n_boot`` is 0. With ``clusters`` (``n``
    labels) the index array is a cluster-bootstrap resample (:func:`cluster_bootstrap_index`),
    whose length varies.
    """
    _check_clusters(clusters, n)
    rng = np.random.default_rng(seed)
    if clusters is None:
        resamples: Iterator[np.ndarray] = (rng.integers(0, n, size=n) for _ in range(n_boot if n > 0 else 0))
    else:
        resamples = cluster_bootstrap_index(clusters, n_boot, rng)
    draws: dict[str, list[float]] = {}
    for index in resamples:
        for name, value in statistic(index).items():
            draws.setdefault(name, []).append(value)
    alpha = 100 * (1.0 - confidence) / 2.0
    intervals = {}
    for name, values in draws.items():
        finite = np.asarray(values, dtype=float)
        finite = finite[np.isfinite(finite)]
        if finite.size == 0:
            intervals[name] = (float("nan"), float("nan"))
        else:
            low, high = np.percentile(finite, [alpha, 100 - alpha])
            intervals[name] = (float(low), float(high))
    return intervals


def bootstrap_interval(
    statistic: Callable[[np.ndarray], float],
    n: int,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    clusters: Sequence[Hashable] | None = None,
) -> tuple[float, float]:
    """Percentile bootstrap interval of one statistic (see :func:`bootstrap_intervals`)."""
    if n_boot <= 0 or n == 0:
        return float("nan"), float("nan")
    return bootstrap_intervals(
        lambda index: {"value": statistic(index)}, n, n_boot, seed, confidence, clusters
    )["value"]


def mean_interval(
    values: Sequence[float],
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    clusters: Sequence[Hashable] | None = None,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``nanmean(values)``, vectorised (per-pair credits, per-prompt scores).

    With ``clusters`` (one label per value) a cluster bootstrap: ``rng.integers(0, K, size=(n_boot, K))``
    draws the clusters of every resample at once (as the unit-level path draws units) and a
    resample's mean is its clusters' summed finite values over their count of finite values, the
    ``nanmean`` of all their rows.
    """
    values = np.asarray(values, dtype=float)
    _check_clusters(clusters, values.size)
    if n_boot <= 0 or values.size == 0 or not np.isfinite(values).any():
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    if clusters is None:
        index = rng.integers(0, values.size, size=(n_boot, values.size))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            means = np.nanmean(values[index], axis=1)
    else:
        codes, k = cluster_codes(clusters)
        finite = np.isfinite(values)
        sums = np.bincount(codes, weights=np.where(finite, values, 0.0), minlength=k)
        counts = np.bincount(codes[finite], minlength=k)
        draw = rng.integers(0, k, size=(n_boot, k))
        with np.errstate(invalid="ignore", divide="ignore"):
            means = sums[draw].sum(axis=1) / counts[draw].sum(axis=1)
    means = means[np.isfinite(means)]
    if means.size == 0:
        return float("nan"), float("nan")
    alpha = 100 * (1.0 - confidence) / 2.0
    low, high = np.percentile(means, [alpha, 100 - alpha])
    return float(low), float(high)
