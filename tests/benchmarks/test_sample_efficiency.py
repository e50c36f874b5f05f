"""benchmarks/sample_efficiency.py end to end on tiny:sd with a tiny budget."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def load_benchmark():
    spec = importlib.util.spec_from_file_location(
        "sample_efficiency", ROOT / "benchmarks" / "sample_efficiency.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_images_per_step_counts_branches():
    bench = load_benchmark()
    args = bench.parse_args(["--model", "tiny:sd", "--budget", "100", "--set", "train.b2diffurl.branches=3"])
    for name, expected in (("grpo", 40), ("b2diffurl", 24)):
        config, per_step = bench.build_config(
            args, {"name": name, "recipe": bench.METHODS[name]}, 0, Path("/tmp/x")
        )
        assert per_step == expected and config.train.num_steps == 100 // expected


@pytest.mark.slow
def test_benchmark_runs_end_to_end_on_tiny_sd(tmp_path):
    bench = load_benchmark()
    out = tmp_path / "se"
    code = bench.main(
        [
            "--model", "tiny:sd", "--budget", "10", "--eval-every", "10", "--eval-images-per-category", "1",
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
        ("grpo", 10),
        ("b2diffurl", 0),
        ("b2diffurl", 10),
    ]
    assert all(0.0 <= float(r["heldout_overall"]) <= 1.0 for r in rows)
    assert (out / "sample_efficiency.png").stat().st_size > 0
    assert "| 10 |" in (out / "summary.md").read_text()


def test_images_per_step_counts_previews_and_regenerations():
    bench = load_benchmark()
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
def test_benchmark_runs_the_flow_methods_on_tiny_sd3(tmp_path):
    bench = load_benchmark()
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
