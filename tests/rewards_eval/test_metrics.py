"""Metrics against independent computations on small hand-made inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from genalign.rewards.evaluation import metrics

# Five pairs: image_1 wins, image_0 wins, tie, tie, image_1 wins.
LABELS = [1.0, 0.0, 0.5, 0.5, 1.0]
S0 = [0.0, 2.0, 1.0, 0.0, 3.0]
S1 = [1.0, 0.0, 1.0, 3.0, 3.0]


def pickscore_reference(scores_0, scores_1, labels, threshold):
    """PickScore's eval_preference_predictor protocol, written out per pair."""
    total = []
    for s0, s1, label in zip(scores_0, scores_1, labels):
        p0, p1 = np.exp([s0, s1]) / np.exp([s0, s1]).sum()
        human = "tie" if label == 0.5 else ("0" if label == 0 else "1")
        pred = "tie" if abs(p1 - p0) <= threshold else ("0" if p0 > p1 else "1")
        total.append(1.0 if human == pred else (0.5 if "tie" in (human, pred) else 0.0))
    return total


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.5, 1.0])
def test_pickscore_policy_matches_the_reference_protocol(threshold):
    rng = np.random.default_rng(0)
    s0, s1 = rng.normal(size=40), rng.normal(size=40)
    labels = rng.choice([0.0, 0.5, 1.0], size=40)
    credit = metrics.preference_credit(s0, s1, labels, "pickscore", threshold)
    np.testing.assert_allclose(credit, pickscore_reference(s0, s1, labels, threshold))


def test_pickscore_hand_computed():
    # threshold 0: only the equal-score pairs (2, 4) are predicted ties.
    # pair 0 right (1), pair 1 right (1), pair 2 tie-tie (1), pair 3 tie vs pred 1 (0.5), pair 4 pred tie vs 1 (0.5)
    np.testing.assert_allclose(
        metrics.preference_credit(S0, S1, LABELS, "pickscore", 0.0), [1, 1, 1, 0.5, 0.5]
    )
    # threshold 0.5: |tanh(0.5)| = 0.46 -> pair 0 becomes a predicted tie (0.5); |tanh(1)| = 0.76, |tanh(1.5)| = 0.91 stay
    np.testing.assert_allclose(
        metrics.preference_credit(S0, S1, LABELS, "pickscore", 0.5), [0.5, 1, 1, 0.5, 0.5]
    )


def test_tune_threshold_is_the_first_best_on_the_grid():
    rng = np.random.default_rng(1)
    s0, s1 = rng.normal(size=30), rng.normal(size=30)
    labels = rng.choice([0.0, 0.5, 1.0], size=30)
    best, curve = metrics.tune_tie_threshold(s0, s1, labels)
    reference = [np.mean(pickscore_reference(s0, s1, labels, t)) for t in metrics.PICKSCORE_THRESHOLDS]
    np.testing.assert_allclose(curve, reference)
    assert best == metrics.PICKSCORE_THRESHOLDS[int(np.argmax(reference))]


def test_skip_ties_and_strict_hand_computed():
    skip = metrics.preference_credit(S0, S1, LABELS, "skip-ties")
    # ties dropped; pair 4 has equal scores -> 0.5
    np.testing.assert_array_equal(np.isnan(skip), [False, False, True, True, False])
    assert np.nanmean(skip) == pytest.approx((1 + 1 + 0.5) / 3)
    strict = metrics.preference_credit(S0, S1, LABELS, "strict")
    # tie pair 2 predicted exactly equal -> right; tie pair 3 -> wrong; pair 4 equal scores on a decided pair -> wrong
    np.testing.assert_array_equal(strict, [1, 1, 1, 0, 0])
    with pytest.raises(ValueError, match="tie policy"):
        metrics.preference_credit(S0, S1, LABELS, "lenient")


def test_inversion_score_is_kendall_tau_rescaled_without_ties():
    rng = np.random.default_rng(2)
    for _ in range(5):
        n = int(rng.integers(2, 9))
        human = rng.permutation(n) + 1  # ranks 1..n, 1 best
        scores = rng.normal(size=n)
        tau = stats.kendalltau(human, -scores).statistic
        assert metrics.inversion_score(human, scores) == pytest.approx((1 + tau) / 2)


def test_inversion_score_counts_pairs_by_hand():
    # human: a > b > c (ranks 1, 2, 3); reward orders b > a > c: one inversion of three pairs.
    assert metrics.inversion_score([1, 2, 3], [0.5, 0.9, 0.1]) == pytest.approx(2 / 3)
    # human ties are never inversions
    assert metrics.inversion_score([1, 1, 2], [0.0, 5.0, 1.0]) == pytest.approx(1 - 1 / 3)
    brute = sum(
        (h_i - h_j) * (p_i - p_j) < 0
        for (h_i, p_i), (h_j, p_j) in itertools.combinations(zip([3, 1, 2, 4], [1, 0, 2, 3]), 2)
    )
    assert metrics.inversion_score([3, 1, 2, 4], [0.0, 4.0, -1.0, -2.0]) == pytest.approx(1 - brute / 6)


def test_a_pair_the_reward_ties_is_half_an_inversion_whatever_the_order():
    """HPS v2's argsort orders equal scores arbitrarily; half an inversion is the expectation, and
    the score no longer depends on where the images sit in the file."""
    assert metrics.inversion_score([1, 2, 3, 4], [0, 0, 0, 0]) == 0.5
    assert metrics.inversion_score([4, 3, 2, 1], [0, 0, 0, 0]) == 0.5
    human, scores = [1, 2, 3, 4], [3, 3, 1, 0]  # pair (0, 1) tied by the reward, the rest right
    assert metrics.inversion_score(human, scores) == pytest.approx(1 - 0.5 / 6)
    assert metrics.inversion_score(human[::-1], scores[::-1]) == metrics.inversion_score(human, scores)
    rng = np.random.default_rng(4)  # the mean over every tie order, by brute force
    human = rng.permutation(6) + 1
    scores = rng.integers(0, 3, size=6).astype(float)
    orders = [
        metrics.inversion_score(human, scores + 1e-9 * np.array(p)) for p in itertools.permutations(range(6))
    ]
    assert metrics.inversion_score(human, scores) == pytest.approx(np.mean(orders))


def imagereward_acc_by_hand(rankings, rewards):
    """ImageReward's ``acc`` (``test.py``), transcribed: ranks lower = better, pooled over pairs."""
    right = counted = 0
    for ranking, reward in zip(rankings, rewards):
        for i, j in itertools.combinations(range(len(ranking)), 2):
            if ranking[i] > ranking[j]:
                counted += 1
                right += reward[i] < reward[j]
            elif ranking[i] < ranking[j]:
                counted += 1
                right += reward[i] > reward[j]
    return right / counted


def test_imagereward_accuracy_pools_pairs_skips_human_ties_and_counts_reward_ties_wrong():
    rankings = [[1, 2, 2, 4], [2, 1, 3], [1, 1, 1, 2, 3]]
    rewards = [[0.0, 0.0, 0.0, 0.0], [0.2, 0.9, 0.1], [0.5, 0.4, 0.4, 0.4, 0.0]]
    counts = np.array([metrics.imagereward_pair_counts(r, s) for r, s in zip(rankings, rewards)])
    assert counts[0].tolist() == [0, 5]  # a constant reward gets nothing right; the human tie is out
    value, (low, high) = metrics.pooled_accuracy(counts, n_boot=200, seed=0)
    assert value == pytest.approx(imagereward_acc_by_hand(rankings, rewards))
    assert low <= value <= high
    rng = np.random.default_rng(5)
    rankings = [list(rng.integers(1, 5, size=6)) for _ in range(20)]
    rewards = [list(rng.integers(0, 3, size=6).astype(float)) for _ in range(20)]
    counts = np.array([metrics.imagereward_pair_counts(r, s) for r, s in zip(rankings, rewards)])
    assert metrics.pooled_accuracy(counts, n_boot=0)[0] == pytest.approx(
        imagereward_acc_by_hand(rankings, rewards)
    )


def test_mos_correlations_match_scipy_and_the_logistic_fit_recovers_a_logistic():
    rng = np.random.default_rng(3)
    x = np.sort(rng.uniform(-3, 3, size=30))
    y = metrics.logistic4(x, 5.0, 1.0, 0.5, 0.8) + rng.normal(0, 0.01, size=30)
    result = metrics.mos_correlations(x, y)
    assert result["srcc"] == pytest.approx(stats.spearmanr(x, y).statistic)
    assert result["krcc"] == pytest.approx(stats.kendalltau(x, y).statistic)
    assert result["plcc"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert result["plcc_fitted"] > result["plcc"]
    assert result["plcc_fitted"] == pytest.approx(1.0, abs=1e-3)
    params = metrics.fit_logistic4(x, y)
    np.testing.assert_allclose(
        metrics.logistic4(x, *params), metrics.logistic4(x, 5.0, 1.0, 0.5, 0.8), atol=0.05
    )
    # a decreasing relation is fitted too: the mapped scores predict MOS, so fitted PLCC is ~ +1
    decreasing = metrics.mos_correlations(x, -y)
    assert decreasing["plcc"] < 0
    assert decreasing["plcc_fitted"] == pytest.approx(1.0, abs=1e-3)


def test_logistic4_closed_form():
    x = np.array([-1.0, 0.0, 2.0])
    expected = (3 - 1) / (1 + np.exp(-(x - 0.5) / 2)) + 1
    np.testing.assert_allclose(metrics.logistic4(x, 3.0, 1.0, 0.5, -2.0), expected)


def test_intervals_contain_the_estimate_and_shrink_with_more_data():
    rng = np.random.default_rng(4)
    widths = []
    for n in (20, 500):
        credit = (rng.random(n) < 0.7).astype(float)
        low, high = metrics.mean_interval(credit, n_boot=300, seed=0)
        assert low <= credit.mean() <= high
        widths.append(high - low)
        x = rng.normal(size=n)
        y = x + rng.normal(size=n)
        point = metrics.mos_correlations(x, y, fit=False)["srcc"]
        lo, hi = metrics.bootstrap_interval(
            lambda index, x=x, y=y: metrics.mos_correlations(x[index], y[index], fit=False)["srcc"],
            n,
            200,
            seed=0,
        )
        assert lo <= point <= hi
    assert widths[1] < widths[0] / 2


def test_bootstrap_edge_cases():
    assert np.isnan(metrics.mean_interval([], n_boot=10)).all()
    assert np.isnan(metrics.bootstrap_interval(lambda index: 1.0, 5, n_boot=0)).all()
    assert metrics.bootstrap_interval(lambda index: 1.0, 5, n_boot=10) == (1.0, 1.0)
