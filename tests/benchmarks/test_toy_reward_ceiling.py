"""benchmarks/toy_reward_ceiling.py: effects in starting stds and the 0/1 target by hand, and one
short run on the shipped toy models."""

from __future__ import annotations

import json
import math

import pytest


@pytest.fixture(scope="module")
def ceiling(benchmark_module):
    return benchmark_module("toy_reward_ceiling")


def test_effect_sd_by_hand(ceiling):
    start = [0.0, 1.0, 2.0]  # mean 1, std (ddof 1) 1
    assert ceiling.effect_sd([2.0, 3.0], start) == pytest.approx(1.5)
    assert ceiling.effect_sd(start, start) == 0.0
    assert math.isnan(ceiling.effect_sd([1.0], [0.5, 0.5]))  # a start with no spread has no unit


def test_zero_one_target_by_hand(ceiling):
    # p = 0.25 on 4 images: std (ddof 1) of [1, 0, 0, 0] is sqrt(0.25 * 0.75 * 4 / 3) = 0.5
    assert ceiling.zero_one_target(0.25, 4) == pytest.approx(0.75)
    # a 0/1 reward at that accuracy, [1, 1, 1, 0], is one starting std above [1, 0, 0, 0]
    assert ceiling.effect_sd([1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]) == pytest.approx(1.0)


def test_ceiling_rows_calibration(ceiling):
    scores = {"start": {"r": [0.0, 1.0, 0.0, 1.0]}, "truth": {"r": [1.0, 1.0, 0.5, 0.5]}}
    correct = {"start": [False, True, False, False], "truth": [True, True, True, True]}
    rows = {row["images"]: row for row in ceiling.ceiling_rows(scores, correct, "start")}
    spread = (4 * 0.25 / 3) ** 0.5  # std (ddof 1) of [0, 1, 0, 1]
    assert rows["truth"]["effect_sd"] == pytest.approx((0.75 - 0.5) / spread)
    assert rows["start"]["mean_correct"] == 1.0 and rows["start"]["mean_wrong"] == pytest.approx(1 / 3)
    assert rows["truth"]["accuracy"] == 1.0 and rows["truth"]["mean_wrong"] is None


def test_category_rows_by_hand(ceiling):
    scores = {"start": {"r": [0.0, 1.0, 2.0, 2.0]}, "after": {"r": [1.0, 2.0, 2.0, 2.0]}}
    rows = {row["images"]: row for row in ceiling.category_rows(scores, ["a", "a", "b", "b"], "start")}
    # a: start [0, 1] (std 0.71), +1 each; b: no spread at the start, so no unit
    assert rows["after"]["effect_sd_per_category"]["a"] == pytest.approx(1 / 0.5**0.5)
    assert rows["after"]["effect_sd_per_category"]["b"] is None


def test_short_run_on_the_toy_models(ceiling, tmp_path, capsys):
    out = tmp_path / "scores.json"
    assert ceiling.main(["--images", "12", "--models", "toy-sd-web70", "toy-sd", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    by = {(row.get("reward"), row.get("images")): row for row in rows if "effect_sd" in row}
    per_category = [row for row in rows if "effect_sd_per_category" in row]
    assert len(per_category) == len(by) == 6  # two rewards x (start, toy-sd, ground truth)
    start = next(r for r in per_category if r["images"] == "toy-sd-web70")["effect_sd_per_category"]
    assert len(start) == 6 and all(v is None or v == pytest.approx(0.0) for v in start.values())
    assert by[("oracle mixed", "ground truth")]["accuracy"] == 1.0  # every render satisfies its prompt
    assert by[("oracle mixed", "ground truth")]["mean"] == pytest.approx(1.5)  # 1 + half of all checks
    assert by[("learned (vlm_yes)", "toy-sd-web70")]["effect_sd"] == pytest.approx(0.0)
    saved = json.loads(out.read_text())
    assert set(saved["scores"]) == {"toy-sd-web70", "toy-sd", "ground truth"}
    assert all(len(v) == 12 for s in saved["scores"].values() for v in s.values())
    assert rows[-1]["zero_one_target"] > rows[-1]["start_accuracy"]
