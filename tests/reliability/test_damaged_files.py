"""Damaged files do not block a run: checksums, fallback to an intact checkpoint, torn metrics,
JSON errors that name their file, a failed write (issue 23.4)."""

from __future__ import annotations

import errno
import json

import pytest
import torch

from genalign.trainers import checkpoint as checkpoint_module
from genalign.trainers.checkpoint import (
    CorruptCheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_latest_intact,
    save_checkpoint,
)

from .conftest import make_trainer, params


def _save(run, step: int, value: float = 1.0):
    return save_checkpoint(
        run,
        step,
        tensors={"trainable": {"w": torch.full((64,), value)}},
        optimizer_state={"lr": 0.1, "m": torch.zeros(4)},
    )


def test_flipped_bytes_fail_the_checksum(tmp_path):
    path = _save(tmp_path, 1)
    assert set(json.loads((path / "meta.json").read_text())["sha256"]) == {
        "weights.trainable.safetensors",
        "optimizer.json",
        "optimizer.safetensors",
    }
    file = path / "weights.trainable.safetensors"
    data = bytearray(file.read_bytes())
    data[-3] ^= 0xFF  # a tensor byte: safetensors alone would load it silently
    file.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="weights.trainable.safetensors fails its sha256"):
        load_checkpoint(path)


@pytest.mark.parametrize("damage", ["truncate", "bad_json", "missing", "no_meta", "emptied"])
def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, damage, caplog):
    _save(tmp_path, 1, 1.0)
    newest = _save(tmp_path, 2, 2.0)
    if damage == "truncate":
        file = newest / "weights.trainable.safetensors"
        file.write_bytes(file.read_bytes()[:40])
    elif damage == "bad_json":
        (newest / "optimizer.json").write_text('{"lr": 0.1, "m"')
    elif damage == "missing":
        (newest / "optimizer.safetensors").unlink()
    else:  # the meta file (written last) or everything gone: damage, not a checkpoint being written
        for file in newest.iterdir() if damage == "emptied" else [newest / "meta.json"]:
            file.unlink()
    with caplog.at_level("WARNING"):
        checkpoint = load_latest_intact(tmp_path)
    assert checkpoint.step == 1 and torch.equal(checkpoint.tensors["trainable"]["w"], torch.full((64,), 1.0))
    assert "skipping damaged checkpoint checkpoint-00000002" in caplog.text


def test_a_run_whose_only_checkpoint_lost_its_meta_file_is_not_started_afresh(tmp_path):
    # resume=latest must not read this as "no checkpoint yet" and overwrite the run's progress
    path = _save(tmp_path, 3)
    (path / "meta.json").unlink()
    with pytest.raises(
        CorruptCheckpointError, match=r"every checkpoint .* is damaged: checkpoint-00000003: .*meta\.json"
    ):
        load_latest_intact(tmp_path)


def test_damaged_json_error_names_its_file(tmp_path):
    path = _save(tmp_path, 1)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(CorruptCheckpointError, match=r"meta\.json is not valid JSON"):
        load_checkpoint(path)
    with pytest.raises(CorruptCheckpointError, match="every checkpoint .* is damaged"):
        load_latest_intact(tmp_path)


def test_trainer_resumes_past_a_truncated_latest_checkpoint(tmp_path, caplog):
    run = tmp_path / "run"
    make_trainer(run, "train.num_steps=2", "logging.checkpoint_every=1").train()
    latest = latest_checkpoint(run)
    file = latest / "weights.trainable.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    resumed = make_trainer(run, "train.num_steps=3", "logging.resume=latest", "logging.checkpoint_every=1")
    with caplog.at_level("WARNING"):
        resumed.train()
    assert "skipping damaged checkpoint checkpoint-00000002" in caplog.text
    assert [m["step"] for m in resumed.history] == [0, 1, 2]


def test_torn_metrics_line_is_dropped_on_resume(tmp_path, caplog):
    run = tmp_path / "run"
    make_trainer(run, "train.num_steps=2", "logging.checkpoint_every=1").train()
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 2, "reward_me')  # a write cut short by a full disk
    resumed = make_trainer(run, "train.num_steps=3", "logging.resume=latest")
    with caplog.at_level("WARNING"):
        resumed.train()
    assert "torn last line" in caplog.text and "metrics.jsonl" in caplog.text
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]


def test_damaged_metrics_line_in_the_middle_names_file_and_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "rew\n{"step": 2}\n')
    trainer = make_trainer(run, "train.num_steps=1", "logging.resume=latest")
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 2"):
        trainer.train()


def test_disk_full_during_a_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    """ENOSPC in the middle of a save: the error surfaces, the previous checkpoint stays the latest
    and intact, and no partial directory is left to be picked up."""
    run = tmp_path / "run"
    trainer = make_trainer(run, "train.num_steps=2", "logging.checkpoint_every=1")
    original = checkpoint_module._save_safetensors

    def disk_full_on_second_save(tensors, path, metadata):
        if "checkpoint-00000002" in str(path) and "optimizer" in path.name:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        original(tensors, path, metadata)

    monkeypatch.setattr(checkpoint_module, "_save_safetensors", disk_full_on_second_save)
    with pytest.raises(OSError, match="No space left"):
        trainer.train()
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-00000001"]
    assert not list((run / "checkpoints").glob("*.tmp"))
    monkeypatch.setattr(checkpoint_module, "_save_safetensors", original)
    resumed = make_trainer(run, "train.num_steps=2", "logging.resume=latest", "logging.checkpoint_every=1")
    resumed.train()
    assert resumed.step == 2 and all(torch.isfinite(p).all() for p in params(resumed).values())
