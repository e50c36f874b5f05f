"""benchmarks/svg_reward_ranking.py: the within-group AUC and spread per reward term, and a small run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench(benchmark_module):
    return benchmark_module("svg_reward_ranking")


def _row(prompt, correct, score, length, category="colors"):
    return {"prompt": prompt, "category": category, "correct": correct, "score": score, "length": length}


def test_summary_counts_mixed_groups_and_ranks_each_term_within_them(bench):
    rows = [
        _row("a", True, 0.9, 0.1),
        _row("a", False, 0.2, 0.5),
        _row("a", False, 0.4, 0.5),
        _row("b", False, 0.3, 0.2),  # no correct sample: b says nothing about ranking
        _row("b", False, 0.1, 0.4),
    ]
    summary = bench.summarise(rows)
    assert summary["groups"] == {"all": 2, "mixed": 1, "verifier": pytest.approx(0.2)}
    assert summary["score"]["auc"] == pytest.approx(1.0)  # the correct sample beats both wrong ones
    assert summary["length"]["auc"] == pytest.approx(0.0)  # and loses to both on length
    # best of group, over the one mixed group: the top score is the correct sample, the top length is not
    assert summary["score"]["best_of_group"] == 1.0 and summary["length"]["best_of_group"] == 0.0
    # mean over groups of the population std: a: pstdev(0.9, 0.2, 0.4), b: pstdev(0.3, 0.1) = 0.1
    import statistics

    expected = (statistics.pstdev([0.9, 0.2, 0.4]) + 0.1) / 2
    assert summary["score"]["within_group_std"] == pytest.approx(expected)
    assert "image" not in summary  # terms the rows lack are left out


def test_runs_on_the_shipped_svg_writer(tmp_path, capsys, bench):
    pytest.importorskip("open_clip")
    writer = ROOT / "assets" / "models" / "toy-svg-writer"
    if not writer.is_dir():
        pytest.fail(f"{writer} is missing: the toy SVG writer ships with the repository")
    out = tmp_path / "rows.json"
    assert bench.main(["--scenes", "6", "--group", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 12 and {r["prompt"] for r in rows} == {f"scene-{i}" for i in range(6)}
    assert all(set(bench.TERMS) <= set(r) for r in rows)
    printed = json.loads(capsys.readouterr().out)
    assert printed["groups"]["all"] == 6 and 0.0 <= printed["groups"]["verifier"] <= 1.0
    with pytest.raises(SystemExit):
        bench.main(["--group", "1"])


def test_another_semantic_tower_and_scene_match_as_the_truth(tmp_path, capsys, bench):
    pytest.importorskip("open_clip")
    clip = ROOT / "assets" / "models" / "toy-clip"
    out = tmp_path / "rows.json"
    argv = ["--scenes", "3", "--group", "2", "--truth", "scene", "--out", str(out)]
    assert bench.main([*argv, "--semantic", f"again={clip}"]) == 0
    rows = json.loads(out.read_text())
    # the same tower under another name scores every completion the same
    assert all(r["semantic:again"] == pytest.approx(r["semantic"], abs=1e-5) for r in rows)
    assert all(r["score:again"] == pytest.approx(r["score"], abs=1e-5) for r in rows)
    printed = json.loads(capsys.readouterr().out)
    assert {"semantic:again", "score:again"} <= set(printed)
    with pytest.raises(SystemExit):
        bench.main(["--semantic", "no-equals-sign"])


def test_a_pair_judge_column_and_its_weighted_score(tmp_path, capsys, bench):
    pytest.importorskip("open_clip")
    import torch

    from genalign.rewards.svg.judge import PairJudge

    torch.manual_seed(0)
    PairJudge(width=8, embed=16, hidden=16).save(tmp_path / "judge", extra={"image_size": 32})
    out = tmp_path / "rows.json"
    argv = ["--scenes", "3", "--group", "2", "--out", str(out), "--judge", f"j={tmp_path / 'judge'}"]
    assert bench.main([*argv, "--judge-weight", "2"]) == 0
    rows = json.loads(out.read_text())
    for r in rows:
        assert -1.0 <= r["judge:j"] <= 1.0
        four = r["image"] + r["edge"] + r["semantic"] + r["length"]
        assert r["score:j+judge2"] == pytest.approx((four + 2 * r["judge:j"]) / 6, abs=1e-6)
    assert {"judge:j", "score:j+judge2"} <= set(json.loads(capsys.readouterr().out))
    with pytest.raises(SystemExit):
        bench.main(["--judge", "no-equals-sign"])


def test_valid_only_drops_broken_samples_before_ranking(bench):
    rows = [
        {**_row("a", True, 0.9, 0.1), "valid": True},
        {**_row("a", False, 0.95, 0.5), "valid": True},
        {**_row("a", False, -3.0, -1.0), "valid": False},  # broken: wrong and at the floor
    ]
    every = bench.summarise(rows)
    assert every["score"]["auc"] == pytest.approx(0.5)  # beats the broken one, loses to the valid one
    assert every["groups"]["validity"] == pytest.approx(2 / 3)
    valid = bench.summarise(rows, valid_only=True)
    assert valid["score"]["auc"] == pytest.approx(0.0) and valid["groups"]["all"] == 1
    assert valid["groups"]["validity"] == pytest.approx(2 / 3)  # of every sample, before the filter
    assert bench.summarise(rows[2:], valid_only=True)["groups"]["all"] == 0  # nothing renders


def test_text_to_svg_with_the_recipes_own_reward(tmp_path, capsys, bench):
    out = tmp_path / "rows.json"
    recipe = str(ROOT / "configs" / "toy" / "rlrf_text2svg.yaml")
    writer = str(ROOT / "assets" / "models" / "toy-svg-writer-t2s")
    args = ["--recipe", recipe, "--model", writer, "--scenes", "6", "--group", "2", "--truth", "exact"]
    assert bench.main([*args, "--valid-only", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 12 and all({"reward", "valid", "correct"} <= set(r) for r in rows)
    # the recipe's reward: a broken SVG at its floor (min_reward - length_weight = -3)
    assert all(r["reward"] == pytest.approx(-3.0) for r in rows if not r["valid"])
    assert all(r["reward"] > -3.0 for r in rows if r["valid"])
    printed = json.loads(capsys.readouterr().out)
    assert "reward" in printed and "validity" in printed["groups"]
