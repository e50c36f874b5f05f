"""kill -9 in the middle of a checkpoint write: the resumed run ends bitwise equal to an
uninterrupted one (weights, metrics), and the dead run's lock is taken over (issue 23.8)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from genalign.trainers.checkpoint import list_checkpoints

from .conftest import ROOT, SMALL, TINY_SD, make_trainer, params


def _metrics(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in rows]


def test_kill9_during_a_checkpoint_write_then_resume_is_bitwise_equal(tmp_path, caplog):
    straight = make_trainer(tmp_path / "straight", "train.num_steps=4")
    straight.train()

    run = tmp_path / "run"
    overrides = [*SMALL, f"logging.run_dir={run}", "train.num_steps=4", "logging.checkpoint_every=1"]
    script = textwrap.dedent(
        f"""
        import os, signal
        from genalign.trainers import build_trainer, checkpoint, load_recipe
        original = checkpoint._save_safetensors
        def write_then_die(tensors, path, metadata):
            original(tensors, path, metadata)
            if "checkpoint-00000003" in str(path) and "optimizer" in path.name:
                os.kill(os.getpid(), signal.SIGKILL)  # no handler, no finally: kill -9
        checkpoint._save_safetensors = write_then_die
        config = load_recipe({str(TINY_SD)!r}, {overrides!r})
        build_trainer(config, base_dir={str(TINY_SD.parent)!r}).train()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-00000001", "checkpoint-00000002"]
    assert (run / "run.lock").exists()  # left by the killed run

    resumed = make_trainer(run, "train.num_steps=4", "logging.checkpoint_every=1", "logging.resume=latest")
    with caplog.at_level("WARNING"):
        resumed.train()
    assert "stale lock" in caplog.text
    a, b = params(straight), params(resumed)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)
    assert _metrics(straight.metrics_path) == _metrics(resumed.metrics_path)
    assert not list((run / "checkpoints").glob("*.tmp"))
