from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, safe_open

from genalign.trainers import checkpoint as checkpoint_module
from genalign.trainers.checkpoint import (
    CorruptCheckpointError,
    RecipeMismatchError,
    capture_rng_state,
    flatten_state,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
    unflatten_state,
)


def _weights(value: float = 1.0) -> dict[str, torch.Tensor]:
    return {"layer.weight": torch.full((2, 3), value), "layer.bias": torch.arange(2.0)}


def _steps(run_dir) -> list[int]:
    return [int(path.name.split("-")[1]) for path in list_checkpoints(run_dir)]


def test_round_trip_of_tensors_states_and_meta(tmp_path):
    path = save_checkpoint(
        tmp_path,
        7,
        tensors={"trainable": _weights(1.0), "ema": _weights(0.5)},
        extra={"epoch": 2, "note": "hello"},
        states={"stat_tracker": {"buffer_size": 4, "stats": {"a cat": [1.0, 2.0]}}},
        recipe_name="toy/ddpo",
        recipe_fingerprint="abc123",
    )
    assert path == tmp_path / "checkpoints" / "checkpoint-00000007"
    loaded = load_checkpoint(path, expected_recipe="abc123")
    assert loaded.step == 7 and loaded.extra == {"epoch": 2, "note": "hello"}
    assert loaded.recipe_fingerprint == "abc123"
    assert loaded.meta["recipe"] == {"name": "toy/ddpo", "fingerprint": "abc123"}
    assert loaded.meta["genalign_version"]
    for group, value in (("trainable", 1.0), ("ema", 0.5)):
        for name, tensor in _weights(value).items():
            assert torch.equal(loaded.tensors[group][name], tensor)
    assert loaded.states == {"stat_tracker": {"buffer_size": 4, "stats": {"a cat": [1.0, 2.0]}}}
    assert loaded.optimizer_state is None and loaded.scheduler_state is None and loaded.rng_state is None
    # weights are plain safetensors files that other tools read
    with safe_open(str(path / "weights.trainable.safetensors"), framework="pt") as handle:
        assert handle.metadata()["format"] == "pt"
    assert set(load_file(str(path / "weights.ema.safetensors"))) == {"layer.weight", "layer.bias"}
    assert not list(path.glob("*.pkl")) and not list(path.glob("*.pt")) and not list(path.glob("*.bin"))
    (tmp_path / "plain").mkdir()  # permissions follow the umask, like any directory the run makes
    assert path.stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777


def test_state_encoding_preserves_types():
    state = {
        0: {"betas": (0.9, 0.999), "step": torch.tensor(3.0), "flag": None, "ok": True},
        "arrays": [np.arange(4, dtype=np.uint32), np.float64(2.5), np.int64(7)],
        (1, "a"): "tuple key",
        "__tensor__": "a key that looks like a marker",
        "nan": float("inf"),
    }
    structure, tensors = flatten_state(state)
    restored = unflatten_state(json.loads(json.dumps(structure)), tensors)
    assert set(restored) == {0, "arrays", (1, "a"), "__tensor__", "nan"}
    assert restored[0]["betas"] == (0.9, 0.999) and isinstance(restored[0]["betas"], tuple)
    assert torch.equal(restored[0]["step"], torch.tensor(3.0))
    assert restored[0]["flag"] is None and restored[0]["ok"] is True
    array = restored["arrays"][0]
    assert isinstance(array, np.ndarray) and array.dtype == np.uint32 and array.tolist() == [0, 1, 2, 3]
    assert restored["arrays"][1:] == [2.5, 7]
    assert restored[(1, "a")] == "tuple key"
    assert restored["__tensor__"] == "a key that looks like a marker"
    assert restored["nan"] == float("inf")
    with pytest.raises(TypeError, match=r"set at state\.bad"):
        flatten_state({"bad": {1, 2}})


def _train(model, optimizer, scheduler, steps: int, start: int) -> None:
    for index in range(start, start + steps):
        inputs = torch.linspace(-1, 1, 12).view(4, 3) * (index + 1)
        loss = (model(inputs) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def _make_training():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return model, optimizer, scheduler


def test_optimizer_and_scheduler_resume_gives_identical_updates(tmp_path):
    model, optimizer, scheduler = _make_training()
    _train(model, optimizer, scheduler, steps=3, start=0)
    path = save_checkpoint(
        tmp_path,
        3,
        tensors={"trainable": model.state_dict()},
        optimizer_state=optimizer.state_dict(),
        scheduler_state=scheduler.state_dict(),
    )
    _train(model, optimizer, scheduler, steps=2, start=3)

    resumed, resumed_optimizer, resumed_scheduler = _make_training()
    _train(resumed, resumed_optimizer, resumed_scheduler, steps=1, start=10)  # unrelated history
    loaded = load_checkpoint(path)
    resumed.load_state_dict(loaded.tensors["trainable"])
    resumed_optimizer.load_state_dict(loaded.optimizer_state)
    resumed_scheduler.load_state_dict(loaded.scheduler_state)
    assert resumed_optimizer.state_dict()["param_groups"][0]["betas"] == (0.9, 0.999)
    _train(resumed, resumed_optimizer, resumed_scheduler, steps=2, start=3)

    for name, tensor in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], tensor), name
    assert resumed_scheduler.get_last_lr() == scheduler.get_last_lr()


def test_rng_restore_reproduces_draws(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    path = save_checkpoint(tmp_path, 1, rng_state=capture_rng_state())
    expected = (random.random(), np.random.rand(3).tolist(), torch.rand(3), torch.randn(2))
    random.seed(2), np.random.seed(2), torch.manual_seed(2)

    restore_rng_state(load_checkpoint(path).rng_state)
    drawn = (random.random(), np.random.rand(3).tolist(), torch.rand(3), torch.randn(2))
    assert drawn[:2] == expected[:2]
    assert torch.equal(drawn[2], expected[2]) and torch.equal(drawn[3], expected[3])


def test_keep_last_prunes_oldest_after_the_new_one_is_complete(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, tensors={"trainable": _weights(step)}, keep_last=2)
    assert _steps(tmp_path) == [4, 5]
    # a rewound run keeps what it just wrote, plus the highest other checkpoint
    save_checkpoint(tmp_path, 3, tensors={"trainable": _weights(3)}, keep_last=2)
    assert _steps(tmp_path) == [3, 5]
    assert latest_checkpoint(tmp_path).name == "checkpoint-00000005"
    with pytest.raises(ValueError, match="keep_last"):
        save_checkpoint(tmp_path, 6, keep_last=0)


def test_same_step_is_replaced(tmp_path):
    save_checkpoint(tmp_path, 2, tensors={"trainable": _weights(1.0)})
    path = save_checkpoint(tmp_path, 2, tensors={"trainable": _weights(9.0)})
    assert torch.equal(load_checkpoint(path).tensors["trainable"]["layer.weight"], torch.full((2, 3), 9.0))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["checkpoint-00000002"]


def test_failed_write_leaves_previous_checkpoint_latest(tmp_path, monkeypatch):
    first = save_checkpoint(tmp_path, 10, tensors={"trainable": _weights()}, optimizer_state={"a": 1})
    calls = []

    def failing_write_json(data, path):
        calls.append(path.name)
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module, "_write_json", failing_write_json)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 20, tensors={"trainable": _weights()}, optimizer_state={"a": 1})
    assert calls == ["optimizer.json"]  # weights were already written when it failed
    assert latest_checkpoint(tmp_path) == first
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["checkpoint-00000010"]


def test_killed_process_leaves_no_recognised_partial_checkpoint(tmp_path):
    """A process killed mid-write (no cleanup runs) leaves only an ignored ``.tmp`` directory."""
    save_checkpoint(tmp_path, 10, tensors={"trainable": _weights()})
    script = textwrap.dedent(
        f"""
        import os, torch
        from genalign.trainers import checkpoint
        original = checkpoint._save_safetensors
        def write_then_die(tensors, path, metadata):
            original(tensors, path, metadata)
            os._exit(9)  # like SIGKILL: no except/finally blocks run
        checkpoint._save_safetensors = write_then_die
        checkpoint.save_checkpoint({str(tmp_path)!r}, 20, tensors={{"trainable": {{"w": torch.ones(3)}}}},
                                   optimizer_state={{"x": torch.zeros(2)}})
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 9, result.stderr
    leftovers = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert len(leftovers) == 2 and leftovers[0] == "checkpoint-00000010"
    assert leftovers[1].startswith("checkpoint-00000020-") and leftovers[1].endswith(".tmp")
    # a directory with the final name but no meta.json (e.g. half-copied by hand) is not complete either
    (tmp_path / "checkpoints" / "checkpoint-00000030").mkdir()
    assert latest_checkpoint(tmp_path).name == "checkpoint-00000010"
    assert _steps(tmp_path) == [10]

    # the next successful save clears the stale temporary directory
    save_checkpoint(tmp_path, 40, tensors={"trainable": _weights()})
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
    assert latest_checkpoint(tmp_path).name == "checkpoint-00000040"


def test_recipe_mismatch_and_missing_files(tmp_path):
    path = save_checkpoint(
        tmp_path,
        5,
        optimizer_state={"step": torch.tensor(1.0)},
        recipe_name="sd15/ddpo",
        recipe_fingerprint="aaa",
    )
    with pytest.raises(
        RecipeMismatchError, match=r"checkpoint from another recipe: .*'sd15/ddpo'.*'aaa'.*'bbb'"
    ):
        load_checkpoint(path, expected_recipe="bbb")
    assert load_checkpoint(path, expected_recipe="aaa").optimizer_state == {"step": torch.tensor(1.0)}

    (path / "optimizer.safetensors").unlink()
    with pytest.raises(CorruptCheckpointError, match=r"missing optimizer\.safetensors"):
        load_checkpoint(path)
    (path / "meta.json").unlink()
    with pytest.raises(CorruptCheckpointError, match=r"missing meta\.json"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        load_checkpoint(tmp_path / "nowhere")
    assert latest_checkpoint(tmp_path / "empty-run") is None


def test_argument_checks(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(tmp_path, 1, states={"optimizer": {}})
    with pytest.raises(ValueError, match="tensor group name"):
        save_checkpoint(tmp_path, 1, tensors={"../evil": {}})
    with pytest.raises(TypeError, match="extra must be JSON-serialisable"):
        save_checkpoint(tmp_path, 1, extra={"tensor": torch.zeros(1)})
    with pytest.raises(ValueError, match="step"):
        save_checkpoint(tmp_path, -1)
    assert latest_checkpoint(tmp_path) is None
    assert not list((tmp_path / "checkpoints").glob("*"))


def test_tied_and_non_contiguous_tensors(tmp_path):
    shared = torch.arange(6.0).view(2, 3)
    path = save_checkpoint(tmp_path, 1, tensors={"trainable": {"a": shared, "b": shared, "t": shared.t()}})
    loaded = load_checkpoint(path).tensors["trainable"]
    assert torch.equal(loaded["a"], shared) and torch.equal(loaded["b"], shared)
    assert torch.equal(loaded["t"], shared.t())
