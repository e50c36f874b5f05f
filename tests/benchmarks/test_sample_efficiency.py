"""benchmarks/sample_efficiency.py end to end on tiny:sd with a tiny budget."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


@pytest.fixture(scope="module")
def bench(benchmark_module):
    return benchmark_module("sample_efficiency")


def test_images_per_step_counts_branches(bench):
    args = bench.parse_args(["--model", "tiny:sd", "--budget", "100", "--set", "train.b2diffurl.branches=3"])
    for name, expected in (("grpo", 40), ("b2diffurl", 24), ("nft", 64)):
        config, per_step = bench.build_config(
            args, {"name": name, "recipe": bench.METHODS[name]}, 0, Path("/tmp/x")
        )
        assert per_step == expected and config.train.num_steps == 100 // expected
    nft, _ = bench.build_config(args, {"name": "nft", "recipe": bench.METHODS["nft"]}, 0, Path("/tmp/x"))
    assert nft.model.lora is None and nft.train.loss == "nft" and nft.train.learning_rate == 1.0e-4


def test_trains_on_balanced_rl_train_prompts_and_evaluates_rl_heldout(bench):
    from genalign.toy.prompts import balanced_prompts, rl_heldout_prompts

    args = bench.parse_args(["--model", "tiny:sd"])
    assert args.eval_split == "rl_heldout"
    prompts = bench.base_recipe(args)["prompts"]["prompts"]
    assert prompts == balanced_prompts("rl_train", 40)
    assert not set(prompts) & {p.caption for p in rl_heldout_prompts()}


def test_summary_reports_mean_and_t_interval_over_seeds(bench):
    mean, half = bench.mean_ci([0.5, 0.6, 0.7])
    assert mean == pytest.approx(0.6) and half == pytest.approx(4.3027 * 0.1 / 3**0.5, rel=1e-3)
    rows = [
        {"method": "grpo", "seed": s, "images": i, "heldout_overall": v}
        for s, (a, b) in enumerate(((0.5, 0.6), (0.5, 0.7), (0.5, 0.5)))
        for i, v in ((0, a), (10, b))
    ]
    for row, (first, last) in zip(rows[1::2], ((0.1, 0.2), (0.1, 0.3), (0.1, 0.1)), strict=True):
        row.update(train_reward_first=first, train_reward_last=last, wall_seconds=1.0)
    table = bench.summarise(rows, [10])
    assert "| 10 | 60.0 ± 24.8 |" in table
    assert "| 0 | 50.0 |" in table  # the shared start: no interval over seeds
    assert "| grpo | 3 | 10.0 ± 24.8 |" in table


@pytest.mark.slow
def test_benchmark_runs_end_to_end_on_tiny_sd(tmp_path, capsys, bench):
    out = tmp_path / "se"
    code = bench.main(
        [
            "--model", "tiny:sd", "--budget", "32", "--eval-every", "32", "--eval-images-per-category", "1",
            "--set", "sampling.num_inference_steps=4", "train.prompts_per_step=2", "train.minibatch_size=2",
            "train.b2diffurl.split_step_start=2", "reward.name=jpeg_compressibility", "reward.kwargs={}",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["method"], int(r["images"])) for r in rows] == [
        ("grpo", 0),
        ("grpo", 30),  # 3 steps of 2 prompts x 5
        ("b2diffurl", 0),
        ("b2diffurl", 30),  # 3 steps of 2 prompts x 5 branches
        ("nft", 0),
        ("nft", 32),  # 1 step of 2 prompts x 16
    ]
    assert all(0.0 <= float(r["heldout_overall"]) <= 1.0 for r in rows)
    assert {r["eval_split"] for r in rows} == {"rl_heldout"}
    assert (out / "sample_efficiency.png").stat().st_size > 0
    summary = (out / "summary.md").read_text()
    assert "| 30 / 32 |" in summary and "| nft | 1 |" in summary  # each method's image count
    # report only, from the CSV (as when seeds ran in separate processes): the same tables
    merged = tmp_path / "merged"
    assert (
        bench.main(
            ["--from-csv", str(out / "results.csv"), "--eval-images-per-category", "1", "--out", str(merged)]
        )
        == 0
    )
    assert (merged / "summary.md").read_text().split("\n\n", 1)[1] == summary.split("\n\n", 1)[1]
    # the report names the runs' model, split and image count, not the report command's defaults
    header = (merged / "summary.md").read_text().split("\n\n", 1)[0]
    assert "model tiny:sd;" in header and "6 rl_heldout images" in header
    assert {r["model"] for r in rows} == {"tiny:sd"} and {r["eval_images"] for r in rows} == {"6"}
    # merging runs of different models is refused, naming both
    other = tmp_path / "other.csv"
    other.write_text((out / "results.csv").read_text().replace("tiny:sd", "tiny:sd3"))
    code = bench.main(["--from-csv", str(out / "results.csv"), str(other), "--out", str(tmp_path / "m2")])
    assert code == 2
    assert "different model: 'tiny:sd' and 'tiny:sd3'" in capsys.readouterr().err


def test_images_per_step_counts_previews_and_regenerations(bench):
    args = bench.parse_args(["--model", "tiny:sd3", "--family", "flow", "--budget", "500"])
    assert [s["name"] for s in bench.load_methods(args)] == list(bench.FLOW_METHODS)
    prompts = bench.FLOW_PROMPTS
    expected = {
        "flow-grpo": prompts * 6,
        "nft-6in6": prompts * 6,
        "naive-6in24": prompts * 24,  # the whole pool at full precision
        "sol-rl-6in24-int8": prompts * (24 + 6),  # previews + regenerated
    }
    for name, count in expected.items():
        config, per_step = bench.build_config(
            args, {"name": name, "recipe": bench.METHODS[name]}, 0, Path("/x")
        )
        assert per_step == count, name
        assert config.train.num_steps == 500 // count


@pytest.mark.slow
def test_benchmark_runs_the_flow_methods_on_tiny_sd3(tmp_path, bench):
    out = tmp_path / "se-flow"
    code = bench.main(
        [
            "--model", "tiny:sd3", "--family", "flow", "--budget", "120", "--eval-every", "120",
            "--eval-images-per-category", "1", "--methods", "nft-6in6", "sol-rl-6in24-int8",
            "--set", "sampling.num_inference_steps=3", "sampling.guidance_scale=1.0", "train.prompts_per_step=1",
            "train.minibatch_size=6", "train.sol_rl.preview_steps=2", "reward.name=jpeg_compressibility", "reward.kwargs={}",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["method"], int(r["images"])) for r in rows] == [
        ("nft-6in6", 0),
        ("nft-6in6", 120),
        ("sol-rl-6in24-int8", 0),
        ("sol-rl-6in24-int8", 120),
    ]
    assert float(rows[-1]["train_seconds"]) > 0
