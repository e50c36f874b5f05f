"""SIGTERM, Ctrl-C and a failing reward keep the run: a checkpoint of the last good step,
and a resume that ends bitwise equal to an uninterrupted run (issue 23.3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from genalign.trainers.checkpoint import list_checkpoints

from .conftest import ROOT, SMALL, TINY_SD, make_trainer, params

HERE = Path(__file__).resolve().parent
FAULTY = "reward.name=faulty_rewards:FaultAtCall"
if str(HERE) not in sys.path:  # faulty_rewards is named as "module:Class" in the recipe
    sys.path.append(str(HERE))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Trainable weights after 4 uninterrupted steps."""
    trainer = make_trainer(tmp_path_factory.mktemp("straight") / "run", "train.num_steps=4", FAULTY)
    trainer.train()
    return params(trainer)


def _resume_and_compare(run: Path, straight: dict) -> None:
    os.environ.pop("GENALIGN_TEST_FAULT", None)  # monkeypatch restores it after the test
    resumed = make_trainer(run, "train.num_steps=4", "logging.resume=latest", FAULTY)
    resumed.train()
    assert [m["step"] for m in resumed.history] == [0, 1, 2, 3]
    after = params(resumed)
    for name in straight:
        torch.testing.assert_close(after[name], straight[name], atol=0, rtol=0)


def test_checkpoint_every_is_on_by_default():
    from genalign.trainers.config import LoggingConfig

    assert LoggingConfig().checkpoint_every > 0


def test_reward_exception_leaves_a_checkpoint_of_the_last_good_step(tmp_path, straight, monkeypatch):
    monkeypatch.setenv("GENALIGN_TEST_FAULT", "2:raise")
    run = tmp_path / "run"
    trainer = make_trainer(run, "train.num_steps=4", FAULTY)
    with pytest.raises(RuntimeError, match="reward server went away"):
        trainer.train()
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-00000002"]
    _resume_and_compare(run, straight)


def test_ctrl_c_finishes_the_step_and_saves(tmp_path, straight, monkeypatch):
    monkeypatch.setenv("GENALIGN_TEST_FAULT", "1:sigint")
    run = tmp_path / "run"
    trainer = make_trainer(run, "train.num_steps=4", FAULTY)
    # the handler before training: Python's default, or SIG_IGN where the shell started the
    # tests in the background
    handler = signal.getsignal(signal.SIGINT)
    trainer.train()
    assert trainer.interrupted == signal.SIGINT and trainer.step == 2
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-00000002"]
    assert not (run / "final").exists()
    assert signal.getsignal(signal.SIGINT) is handler  # restored
    _resume_and_compare(run, straight)


def test_second_ctrl_c_stops_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("GENALIGN_TEST_FAULT", "1:sigint2")
    run = tmp_path / "run"
    trainer = make_trainer(run, "train.num_steps=4", FAULTY)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert list_checkpoints(run) == []
    assert not (run / "run.lock").exists()


def test_sigterm_mid_step_in_a_subprocess(tmp_path, straight):
    run = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
        "OMP_NUM_THREADS": "1",
        "GENALIGN_TEST_FAULT": "1:sigterm",
    }
    command = [
        sys.executable,
        "-m",
        "genalign.cli",
        "train",
        str(TINY_SD),
        *SMALL,
        f"logging.run_dir={run}",
        "train.num_steps=4",
        FAULTY,
    ]
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-2000:]
    assert "interrupted" in result.stdout and "resume=latest" in result.stdout, result.stdout
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-00000002"]
    _resume_and_compare(run, straight)


def test_a_run_whose_every_step_is_skipped_does_not_exit_as_a_success(tmp_path, monkeypatch, capsys):
    # found by a new user: every reward NaN, nothing trained, exit code 0
    from genalign.cli import main

    monkeypatch.setenv("GENALIGN_TEST_FAULT", "0:nan")
    argv = ["train", str(TINY_SD), *SMALL, "train.num_steps=1", FAULTY, f"logging.run_dir={tmp_path}/run"]
    assert main(argv) == 2
    assert "genalign: error: every step was skipped (" in capsys.readouterr().err
    monkeypatch.setenv("GENALIGN_TEST_FAULT", "-1:none")  # the same run with finite rewards succeeds
    assert main([*argv[:-1], f"logging.run_dir={tmp_path}/ok"]) == 0
