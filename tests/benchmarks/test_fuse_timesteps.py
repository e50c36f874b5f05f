"""benchmarks/fuse_timesteps.py runs both variants on one cached rollout batch and reports them."""

from __future__ import annotations

import json
import math


def test_times_fused_and_unfused_updates_of_one_batch(benchmark_module, tmp_path, capsys):
    bench = benchmark_module("fuse_timesteps")
    out = tmp_path / "fuse.json"
    overrides = [
        "train.prompts_per_step=1",
        "train.group_size=4",
        "train.minibatch_size=4",
        "sampling.num_inference_steps=4",
        "train.timestep_fraction=0.5",
        "reward.monitors={}",
        f"logging.run_dir={tmp_path / 'run'}",
    ]
    payload = bench.main([*overrides, "--repeats", "2", "--threads", "1", "--json", str(out)])
    result = payload["result"]
    assert len(result["measured"]) == len(result["baseline"]) == 2
    assert all(t > 0 for t in result["measured"] + result["baseline"])
    assert math.isfinite(result["ratio"]) and result["ratio"] > 0
    assert json.loads(out.read_text())["result"]["ratio"] == result["ratio"]
    printed = capsys.readouterr().out
    assert "fused / unfused" in printed and "samples=4" in printed
