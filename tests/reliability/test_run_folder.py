"""A run folder belongs to one run: lock, fresh-run check, resume without a checkpoint (issue 23.2)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from genalign.trainers.checkpoint import list_checkpoints
from genalign.trainers.run_folder import LOCK_FILE, RunFolderError, RunFolderLock

from .conftest import make_trainer


def _steps(trainer) -> list[int]:
    return [json.loads(line)["step"] for line in trainer.metrics_path.read_text().splitlines()]


def test_fresh_run_into_a_used_folder_refuses_and_keeps_the_old_run(tmp_path):
    make_trainer(tmp_path / "run", "train.num_steps=2").train()
    before = list_checkpoints(tmp_path / "run")
    again = make_trainer(tmp_path / "run", "train.num_steps=1")
    with pytest.raises(RunFolderError, match="resume=latest.*overwrite=true"):
        again.train()
    assert list_checkpoints(tmp_path / "run") == before
    assert _steps(again) == [0, 1]
    assert not (tmp_path / "run" / LOCK_FILE).exists()  # released on the way out


def test_overwrite_deletes_the_earlier_run(tmp_path):
    make_trainer(tmp_path / "run", "train.num_steps=3", "logging.checkpoint_every=1").train()
    again = make_trainer(tmp_path / "run", "train.num_steps=1", "logging.overwrite=true")
    again.train()
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["checkpoint-00000001"]
    assert _steps(again) == [0]


def test_resume_latest_without_a_checkpoint_starts_a_clean_run(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 7, "reward_mean": 1.0}\n')  # a run that died before saving
    trainer = make_trainer(run, "train.num_steps=1", "logging.resume=latest")
    with caplog.at_level("WARNING"):
        trainer.train()
    assert "no checkpoint" in caplog.text
    assert _steps(trainer) == [0]


def test_a_live_run_holds_the_folder(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run.mkdir()
        (run / LOCK_FILE).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
        trainer = make_trainer(run, "train.num_steps=1")
        with pytest.raises(RunFolderError, match=f"in use by a live run \\(process {holder.pid}"):
            trainer.train()
        assert not (run / "metrics.jsonl").exists()
        assert json.loads((run / LOCK_FILE).read_text())["pid"] == holder.pid  # not taken
    finally:
        holder.kill()
        holder.wait()
    # the holder is dead now: its lock is stale and taken over
    trainer.train()
    assert _steps(trainer) == [0]
    assert not (run / LOCK_FILE).exists()


def test_lock_of_another_host_is_not_taken_over(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    with pytest.raises(RunFolderError, match="host 'elsewhere'.*delete"):
        RunFolderLock(tmp_path).acquire()


def test_two_runs_racing_for_one_folder(tmp_path):
    """Two processes lock the folder at once: exactly one wins, the other fails with a message.

    Both wait until the other has imported (a fixed start time lost the race on a loaded machine:
    one import outlasted the other's whole run, and both won in turn), and the winner holds the
    lock until the loser has tried (at most 30 s, after which a broken lock lets both win)."""
    script = (
        "import pathlib, sys, time\n"
        "from genalign.trainers.run_folder import RunFolderLock, RunFolderError\n"
        "folder, signals = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])\n"
        "(signals / ('ready-' + sys.argv[3])).touch()\n"
        "while len(list(signals.glob('ready-*'))) < 2:\n"
        "    time.sleep(0.01)\n"
        "try:\n"
        "    lock = RunFolderLock(folder); lock.acquire()\n"
        "except RunFolderError as error:\n"
        "    print(error); (signals / 'lost').touch(); sys.exit(3)\n"
        "deadline = time.time() + 30\n"
        "while not (signals / 'lost').exists() and time.time() < deadline:\n"
        "    time.sleep(0.01)\n"
        "lock.release()\n"
    )
    folder, signals = tmp_path / "run", tmp_path / "signals"
    folder.mkdir()
    signals.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(folder), str(signals), str(i)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    codes = sorted(run.wait(timeout=120) for run in runs)
    assert codes == [0, 3]
    assert "in use by a live run" in "".join(run.stdout.read() for run in runs)  # the loser's one line
    assert not (folder / LOCK_FILE).exists()
