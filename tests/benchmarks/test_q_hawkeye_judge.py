"""The paired judge comparison of benchmarks/q_hawkeye_judge.py (``--baseline``) against scipy and
a hand count, and its bootstrap against an unpaired one."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr


@pytest.fixture(scope="module")
def judge(benchmark_module):
    return benchmark_module("q_hawkeye_judge")


def test_point_differences_by_hand(judge):
    mos = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 2.5])
    ours = (np.array([1.0, 2.0, 3.0, 4.0, 5.0, 2.4]), np.array([0.5, 1.0, 3.5, 3.0, 4.0, 2.4]))
    theirs = (np.array([2.0, 1.0, 3.0, 5.0, 4.0, 2.0]), np.array([2.5, 0.0, 1.0, 6.0, 4.0, 1.0]))
    out = judge.paired_difference(ours, theirs, mos)
    srcc = spearmanr(ours[0], mos)[0] - spearmanr(theirs[0], mos)[0]
    plcc = pearsonr(ours[0], mos)[0] - pearsonr(theirs[0], mos)[0]
    assert out["srcc"][0] == pytest.approx(srcc) and out["plcc"][0] == pytest.approx(plcc)
    # original above degraded, a tie counting a half: ours 4 above, 1 below, 1 tie = 4.5/6; theirs
    # 3 above (1.0 > 0.0, 3.0 > 1.0, 2.0 > 1.0), 2 below (2.0 < 2.5, 5.0 < 6.0), 1 tie = 3.5/6
    assert out["original_above_degraded"][0] == pytest.approx(4.5 / 6 - 3.5 / 6)
    for value, low, high in out.values():
        assert low <= value + 1e-9 and value - 1e-9 <= high


def test_the_paired_interval_cancels_what_both_judges_share(judge):
    """Two judges that share most of their error: the paired interval of the SRCC difference is far
    narrower than the difference of two unpaired intervals, and excludes 0 where ours is better."""
    rng = np.random.default_rng(0)
    mos = rng.uniform(1, 5, 300)
    shared = rng.normal(0, 1.0, 300)
    ours = mos + shared + rng.normal(0, 0.1, 300)
    theirs = mos + shared + rng.normal(0, 0.4, 300)
    degraded = mos - 1.0
    out = judge.paired_difference((ours, degraded), (theirs, degraded), mos)
    value, low, high = out["srcc"]
    assert value > 0 and low > 0
    alone = [judge.summary(s, degraded, mos)["srcc"] for s in (ours, theirs)]
    unpaired_width = (alone[0][2] - alone[0][1]) + (alone[1][2] - alone[1][1])
    assert high - low < 0.5 * unpaired_width
    same = judge.paired_difference((ours, degraded), (ours, degraded), mos)
    assert all(v == pytest.approx(0.0) and lo == pytest.approx(0.0) == hi for v, lo, hi in same.values())


def test_the_answered_rate_leaves_out_pairs_whose_answer_did_not_parse(judge):
    """A degraded copy whose answer does not parse scores the floor (1): the plain rate credits the
    original for it, the answered rate leaves the pair out."""
    mos = np.array([5.0, 4.0, 3.0, 2.0])
    original = np.array([5.0, 4.0, 3.0, 2.0])
    degraded = np.array([1.0, 1.0, 3.0, 1.0])  # copies 0 and 1 did not parse (floor); 2 ties; 3 is right
    answered = np.array([False, False, True, True])
    out = judge.summary(original, degraded, mos, answered)
    assert out["original_above_degraded"][0] == pytest.approx(3.5 / 4)
    assert out["original_above_degraded_answered"][0] == pytest.approx(1.5 / 2)
    assert "original_above_degraded_answered" not in judge.summary(original, degraded, mos)


def test_the_paired_answered_rate_compares_both_judges_on_the_same_pairs(judge):
    """Pairs where either judge's answer did not parse leave both judges' rates."""
    mos = np.array([5.0, 4.0, 3.0, 2.0, 2.0])
    ours = (np.array([5.0, 4.0, 3.0, 2.0, 2.0]), np.array([1.0, 1.0, 3.0, 1.0, 3.0]))
    theirs = (np.array([4.0, 4.0, 2.0, 2.0, 1.0]), np.array([4.5, 3.0, 1.0, 2.0, 1.5]))
    answered = np.array([False, True, True, True, False])  # pairs 0 and 4: one copy did not parse
    out = judge.paired_difference(ours, theirs, mos, answered)
    # over pairs 1-3: ours above, tie, above = 2.5 / 3; theirs above, above, tie = 2.5 / 3
    assert out["original_above_degraded_answered"][0] == pytest.approx(0.0)
    # over all five: ours 3.5 / 5 (pair 4 below), theirs 2.5 / 5 (pairs 0 and 4 below)
    assert out["original_above_degraded"][0] == pytest.approx(1.0 / 5)
    value, low, high = out["original_above_degraded_answered"]
    assert low <= value <= high
    assert "original_above_degraded_answered" not in judge.paired_difference(ours, theirs, mos)


def test_intervals_resample_scenes_when_the_set_has_them(judge):
    """Copies of one scene are not independent: with the set's clusters every interval is the
    cluster bootstrap's (eval-reward's), wider than the image bootstrap when scenes differ."""
    from genalign.rewards.evaluation import metrics

    rng = np.random.default_rng(1)
    scenes = np.repeat(np.arange(24), 12)
    mos = rng.uniform(1, 5, 288)
    original = mos + np.repeat(rng.normal(0, 1.5, 24), 12) + rng.normal(0, 0.3, 288)
    degraded = original - rng.normal(0.2, 1.0, 288)
    out = judge.summary(original, degraded, mos, clusters=scenes)
    expected = metrics.bootstrap_intervals(
        lambda index: metrics.mos_correlations(original[index], mos[index], fit=False), 288, clusters=scenes
    )
    assert tuple(out["srcc"][1:]) == pytest.approx(expected["srcc"])
    credit = judge.above_degraded_credit(original, degraded)
    assert tuple(out["original_above_degraded"][1:]) == pytest.approx(
        metrics.mean_interval(credit, clusters=scenes)
    )
    plain = judge.summary(original, degraded, mos)
    assert out["srcc"][2] - out["srcc"][1] > plain["srcc"][2] - plain["srcc"][1]
    paired = judge.paired_difference((original, degraded), (mos, degraded), mos, clusters=scenes)
    assert all(low <= value <= high for value, low, high in paired.values())
