"""benchmarks/iqa_readout.py on the tiny LLaVA: both readout paths run on the same answers and agree."""

from __future__ import annotations

import json


def test_the_two_readouts_agree_on_the_same_answers(benchmark_module, capsys):
    bench = benchmark_module("iqa_readout")
    assert bench.main(["tiny", "--images", "3", "--repeats", "1", "--batch-size", "2"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["images"] == 3 and row["answers_parsed"] == 1.0
    assert row["max_abs_difference"] < 1e-5
    assert row["forward_per_answer_s"] > 0 and row["forward_per_digit_s"] > 0
    assert row["speedup"] == row["forward_per_digit_s"] / row["forward_per_answer_s"]
