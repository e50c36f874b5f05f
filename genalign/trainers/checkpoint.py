"""Atomic, pickle-free training checkpoints.

A checkpoint is a directory ``<run_dir>/checkpoints/checkpoint-<step:08d>/``::

    meta.json                       step, recipe name and fingerprint, genalign version, file list,
                                    the sha256 of every file (verified at load), extra
    weights.<group>.safetensors     one file per tensor group ("trainable", "ema", ...)
    <state>.json + <state>.safetensors
                                    optimizer, scheduler, RNG and any other named state: the
                                    nested structure as JSON, its tensors and arrays as safetensors

Nothing is pickled, so loading a checkpoint never executes code from it (``torch.load`` of a
pickle can). The directory is written under a temporary name ``checkpoint-<step>-XXXX.tmp`` and
renamed into place with :func:`os.replace` only once every file is on disk, so a run that dies
mid-write leaves the previous checkpoint as the latest one and no partial directory that
:func:`latest_checkpoint` would pick up. Older checkpoints are pruned only after the new one is
complete.

The JSON encoding of a state keeps what JSON alone would lose: tuples (``{"__tuple__": [...]}``),
dicts with non-string keys such as an optimizer's integer parameter ids
(``{"__dict__": [[key, value], ...]}``), tensors (``{"__tensor__": "t3"}``) and numpy arrays
(``{"__ndarray__": "t4"}``), so ``unflatten_state(*flatten_state(x))`` rebuilds ``x`` exactly.

A damaged checkpoint (a file missing, truncated or with flipped bytes, unreadable JSON) raises
:class:`CorruptCheckpointError` naming the file; :func:`load_latest_intact` skips such
checkpoints, saying which and why, and loads the newest intact one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import genalign
from genalign.trainers.recipe_diff import recipe_changes

logger = logging.getLogger(__name__)

__all__ = [
    "Checkpoint",
    "CorruptCheckpointError",
    "RecipeMismatchError",
    "capture_rng_state",
    "flatten_state",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_latest_intact",
    "restore_rng_state",
    "save_checkpoint",
    "unflatten_state",
]

FORMAT = "genalign-checkpoint"
FORMAT_VERSION = 1
CHECKPOINTS_DIR = "checkpoints"
META_FILE = "meta.json"
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
_GROUP_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_RESERVED_STATES = ("optimizer", "scheduler", "rng")
_MARKERS = ("__tuple__", "__dict__", "__tensor__", "__ndarray__")


class RecipeMismatchError(ValueError):
    """The checkpoint was written by a run of a different recipe."""


class CorruptCheckpointError(ValueError):
    """A checkpoint file is missing, truncated, unreadable or fails its checksum."""


@dataclass
class Checkpoint:
    """A loaded checkpoint; tensors are on the CPU.

    Attributes:
        path: the checkpoint directory.
        step: the training step it was saved at.
        tensors: tensor groups, e.g. ``{"trainable": {...}, "ema": {...}}``.
        optimizer_state / scheduler_state / rng_state: as passed to :func:`save_checkpoint`, or
            ``None`` when not saved.
        states: any further named states passed as ``states=``.
        extra: the caller's JSON metadata.
        meta: the whole ``meta.json``.
    """

    path: Path
    step: int
    tensors: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    optimizer_state: Any | None = None
    scheduler_state: Any | None = None
    rng_state: Any | None = None
    states: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def recipe_fingerprint(self) -> str | None:
        return self.meta.get("recipe", {}).get("fingerprint")


# ----------------------------------------------------------------------------- state encoding
def flatten_state(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split a nested state into a JSON-serialisable structure and a flat dict of CPU tensors.

    Supported leaves: ``None``, bool, int, float, str, tensors, numpy arrays and numpy scalars;
    containers: dict, list, tuple. Anything else raises :class:`TypeError` naming its path.
    """
    tensors: dict[str, torch.Tensor] = {}

    def add(tensor: torch.Tensor) -> str:
        key = f"t{len(tensors)}"
        tensors[key] = tensor.detach().cpu()
        return key

    def encode(value: Any, path: str) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, torch.Tensor):
            return {"__tensor__": add(value)}
        if isinstance(value, np.ndarray):
            if value.dtype == object:
                raise TypeError(f"cannot store an object array at {path} without pickle")
            try:
                return {"__ndarray__": add(torch.from_numpy(np.ascontiguousarray(value)))}
            except TypeError as error:
                raise TypeError(f"cannot store a {value.dtype} array at {path}: {error}") from error
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, tuple):
            return {"__tuple__": [encode(item, f"{path}[{i}]") for i, item in enumerate(value)]}
        if isinstance(value, list):
            return [encode(item, f"{path}[{i}]") for i, item in enumerate(value)]
        if isinstance(value, Mapping):
            if all(isinstance(key, str) for key in value) and not any(key in _MARKERS for key in value):
                return {key: encode(item, f"{path}.{key}") for key, item in value.items()}
            return {
                "__dict__": [
                    [encode(key, f"{path}<key {key!r}>"), encode(item, f"{path}[{key!r}]")]
                    for key, item in value.items()
                ]
            }
        raise TypeError(f"cannot store {type(value).__name__} at {path} without pickle")

    return encode(state, "state"), tensors


def unflatten_state(structure: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Inverse of :func:`flatten_state`."""

    def decode(value: Any) -> Any:
        if isinstance(value, list):
            return [decode(item) for item in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((marker, payload),) = value.items()
            if marker == "__tensor__":
                return tensors[payload]
            if marker == "__ndarray__":
                return tensors[payload].numpy()
            if marker == "__tuple__":
                return tuple(decode(item) for item in payload)
            if marker == "__dict__":
                return {_hashable(decode(key)): decode(item) for key, item in payload}
        return {key: decode(item) for key, item in value.items()}

    return decode(structure)


def _hashable(key: Any) -> Any:
    return tuple(_hashable(item) for item in key) if isinstance(key, (list, tuple)) else key


# ----------------------------------------------------------------------------- RNG state
def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states: Python ``random``, numpy's global RNG, torch CPU and every CUDA device."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(legacy=False),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Restore states captured by :func:`capture_rng_state` (after a checkpoint round trip)."""
    if "python" in state:
        random.setstate(state["python"])
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    cuda_states = state.get("cuda")
    if cuda_states:
        if not torch.cuda.is_available():
            logger.warning("checkpoint holds CUDA RNG states but CUDA is unavailable; not restored")
            return
        count = min(len(cuda_states), torch.cuda.device_count())
        if count != len(cuda_states):
            logger.warning(
                "checkpoint holds %d CUDA RNG states, this machine has %d devices; restoring %d",
                len(cuda_states),
                torch.cuda.device_count(),
                count,
            )
        for device in range(count):
            torch.cuda.set_rng_state(cuda_states[device], device)


# ----------------------------------------------------------------------------- writing
def _fsync(path: Path) -> None:
    """Flush a file or directory to disk (directories: where the OS allows it)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _save_safetensors(tensors: Mapping[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """Write tensors contiguously, copying only those that share storage (safetensors refuses aliases)."""
    seen: set[int] = set()
    prepared = {}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{path.name}: {name!r} is a {type(tensor).__name__}, not a tensor")
        tensor = tensor.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        if tensor.numel() and storage in seen:
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        prepared[name] = tensor
    save_file(prepared, str(path), metadata=metadata)
    _fsync(path)


def _write_json(data: Any, path: Path) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not _GROUP_NAME.match(name):
        raise ValueError(f"{kind} name {name!r} must be letters, digits, '_' or '-'")


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    tensors: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    optimizer_state: Any | None = None,
    scheduler_state: Any | None = None,
    rng_state: Any | None = None,
    extra: Mapping[str, Any] | None = None,
    *,
    states: Mapping[str, Any] | None = None,
    keep_last: int | None = None,
    recipe_name: str | None = None,
    recipe_fingerprint: str | None = None,
    recipe_data: Mapping[str, Any] | None = None,
) -> Path:
    """Write a complete checkpoint atomically and return its directory.

    Call it from one process only (the main one under ``accelerate``): a save removes the
    ``.tmp`` directories it finds, which are assumed to be left over from crashed saves.

    Args:
        run_dir: the run's output directory; checkpoints go to ``run_dir/checkpoints/``.
        step: training step; the directory is ``checkpoint-{step:08d}``. An existing checkpoint
            of the same step is replaced.
        tensors: tensor groups, each saved as ``weights.<group>.safetensors`` (loadable by any
            safetensors reader), e.g. ``{"trainable": lora_state, "ema": ema_state}``.
        optimizer_state: ``optimizer.state_dict()``.
        scheduler_state: ``lr_scheduler.state_dict()``.
        rng_state: usually :func:`capture_rng_state`; any nested structure is accepted (e.g. one
            entry per process).
        extra: JSON-serialisable metadata stored in ``meta.json``.
        states: further named non-pickled states, e.g. ``{"ema": ema.state_dict(),
            "stat_tracker": tracker.state_dict()}``.
        keep_last: keep this many checkpoints (the new one and the highest-step others); older
            ones are deleted after the new one is complete. ``None`` keeps all.
        recipe_name / recipe_fingerprint: identify the recipe; :func:`load_checkpoint` checks the
            fingerprint. recipe_data: the fingerprinted recipe (JSON data), stored so that a later
            resume can tell options added since from changed ones.

    Returns:
        The checkpoint directory.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
    tensors = dict(tensors or {})
    named_states = {
        name: value
        for name, value in (
            ("optimizer", optimizer_state),
            ("scheduler", scheduler_state),
            ("rng", rng_state),
        )
        if value is not None
    }
    for name, value in (states or {}).items():
        _check_name("state", name)
        if name in _RESERVED_STATES:
            raise ValueError(f"state name {name!r} is reserved; pass it as {name}_state=")
        named_states[name] = value
    for group in tensors:
        _check_name("tensor group", group)
    extra = dict(extra or {})
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as error:
        raise TypeError(f"extra must be JSON-serialisable: {error}") from error

    checkpoints_dir = Path(run_dir) / CHECKPOINTS_DIR
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoints_dir / f"checkpoint-{step:08d}"
    temporary = _make_temporary_dir(checkpoints_dir, final.name)
    try:
        files = _write_contents(temporary, tensors, named_states)
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "step": step,
            "recipe": _recipe_meta(recipe_name, recipe_fingerprint, recipe_data),
            "genalign_version": genalign.__version__,
            "torch_version": torch.__version__,
            "tensor_groups": sorted(tensors),
            "states": sorted(named_states),
            "files": files,
            "sha256": {name: _sha256(temporary / name) for name in files},
            "extra": extra,
        }
        _write_json(meta, temporary / META_FILE)  # written last: the checkpoint is complete
        _fsync(temporary)
        _move_into_place(temporary, final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    logger.info("saved checkpoint %s", final)
    _prune(checkpoints_dir, keep=final, keep_last=keep_last)
    return final


def _write_contents(directory: Path, tensors: Mapping[str, Mapping[str, torch.Tensor]], states: dict) -> list:
    files = []
    for group, group_tensors in tensors.items():
        name = f"weights.{group}.safetensors"
        _save_safetensors(group_tensors, directory / name, metadata={"format": "pt", "group": group})
        files.append(name)
    for state_name, state in states.items():
        structure, state_tensors = flatten_state(state)
        _write_json(structure, directory / f"{state_name}.json")
        _save_safetensors(
            state_tensors, directory / f"{state_name}.safetensors", metadata={"state": state_name}
        )
        files += [f"{state_name}.json", f"{state_name}.safetensors"]
    return files


def _make_temporary_dir(parent: Path, stem: str) -> Path:
    """Create ``parent/<stem>-XXXXXXXX.tmp`` with the umask's permissions (``mkdtemp`` would force 0o700)."""
    while True:
        path = parent / f"{stem}-{secrets.token_hex(4)}.tmp"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def _move_into_place(temporary: Path, final: Path) -> None:
    """``os.replace`` the finished directory onto its final name (atomic on POSIX)."""
    replaced = None
    if final.exists():
        # rename(2) will not overwrite a non-empty directory: move the old one aside first.
        replaced = _make_temporary_dir(final.parent, f"{final.name}-replaced")
        os.replace(final, replaced / final.name)
    os.replace(temporary, final)
    _fsync(final.parent)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)


def _prune(checkpoints_dir: Path, keep: Path, keep_last: int | None) -> None:
    for stale in checkpoints_dir.glob("checkpoint-*.tmp"):
        logger.info("removing incomplete checkpoint %s", stale)
        shutil.rmtree(stale, ignore_errors=True)
    if keep_last is None:
        return
    others = [path for path in _complete_checkpoints(checkpoints_dir) if path != keep]
    for old in others[: max(0, len(others) - (keep_last - 1))]:
        logger.info("removing old checkpoint %s (keep_last=%d)", old, keep_last)
        shutil.rmtree(old, ignore_errors=True)


# ----------------------------------------------------------------------------- finding and loading
def _complete_checkpoints(checkpoints_dir: Path, complete: bool = True) -> list[Path]:
    """Checkpoint folders by step; ``complete``: only those with their meta file (written last)."""
    found = []
    if checkpoints_dir.is_dir():
        for path in checkpoints_dir.iterdir():
            match = _CHECKPOINT_NAME.match(path.name)
            if match and path.is_dir() and (not complete or (path / META_FILE).is_file()):
                found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run, oldest step first; ``.tmp`` directories are never listed."""
    return _complete_checkpoints(Path(run_dir) / CHECKPOINTS_DIR)


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The highest-step complete checkpoint of a run, or ``None``."""
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def _require(path: Path, name: str) -> Path:
    file = path / name
    if not file.is_file():
        raise CorruptCheckpointError(f"checkpoint {path} is missing {name}")
    return file


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_json(path: Path) -> Any:
    """Parse a checkpoint's JSON file; a damaged one raises naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptCheckpointError(f"{path} is not valid JSON ({error})") from error


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path), device="cpu")
    except Exception as error:  # safetensors raises its own SafetensorError on a damaged header
        raise CorruptCheckpointError(f"{path} cannot be read ({type(error).__name__}: {error})") from error


def load_checkpoint(
    path: str | os.PathLike,
    expected_recipe: str | None = None,
    expected_data: Mapping[str, Any] | None = None,
) -> Checkpoint:
    """Read a checkpoint directory written by :func:`save_checkpoint`.

    Args:
        path: the ``checkpoint-XXXXXXXX`` directory.
        expected_recipe: the current recipe's fingerprint; a different one raises
            :class:`RecipeMismatchError`, unless ``expected_data`` (the current recipe's
            fingerprinted data) differs from the data the checkpoint stored only by options the
            stored recipe did not have (added by a later genalign): then a warning names them.

    Raises:
        FileNotFoundError: ``path`` is not a directory.
        CorruptCheckpointError: ``meta.json`` or a file it lists is missing, unreadable or fails
            its sha256 (the message names the file).
        RecipeMismatchError: the checkpoint comes from another recipe.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint directory at {path}")
    meta = _read_json(_require(path, META_FILE))
    if not isinstance(meta, dict):
        raise CorruptCheckpointError(f"{path / META_FILE} is not a JSON object")
    if meta.get("format") != FORMAT or meta.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{path / META_FILE} is not a genalign checkpoint of a supported version "
            f"(format {meta.get('format')!r}, version {meta.get('format_version')!r})"
        )
    recipe = meta.get("recipe") or {}
    if expected_recipe is not None and recipe.get("fingerprint") != expected_recipe:
        _check_recipe_changes(path, recipe, expected_recipe, expected_data)
    checksums = meta.get("sha256", {})  # absent in checkpoints written before checksums
    for name in meta["files"]:
        file = _require(path, name)
        if name in checksums and _sha256(file) != checksums[name]:
            raise CorruptCheckpointError(f"{file} fails its sha256 checksum (damaged after it was written)")

    tensors = {group: _load_tensors(path / f"weights.{group}.safetensors") for group in meta["tensor_groups"]}
    states = {}
    for name in meta["states"]:
        structure = _read_json(path / f"{name}.json")
        states[name] = unflatten_state(structure, _load_tensors(path / f"{name}.safetensors"))
    return Checkpoint(
        path=path,
        step=int(meta["step"]),
        tensors=tensors,
        optimizer_state=states.pop("optimizer", None),
        scheduler_state=states.pop("scheduler", None),
        rng_state=states.pop("rng", None),
        states=states,
        extra=meta.get("extra", {}),
        meta=meta,
    )


def _recipe_meta(name: str | None, fingerprint: str | None, data: Mapping[str, Any] | None) -> dict[str, Any]:
    """``meta.json``'s recipe entry; ``data`` only when given (older readers compare the rest)."""
    return {"name": name, "fingerprint": fingerprint, **({"data": data} if data is not None else {})}


def _check_recipe_changes(
    path: Path, recipe: Mapping[str, Any], expected: str, expected_data: Mapping[str, Any] | None
) -> None:
    """A fingerprint mismatch: accept only options added since the checkpoint, else refuse."""
    message = (
        f"checkpoint from another recipe: {path} was saved by recipe {recipe.get('name')!r} "
        f"with fingerprint {recipe.get('fingerprint')!r}, but this run's recipe has fingerprint {expected!r}"
    )
    stored = recipe.get("data")
    if not isinstance(stored, Mapping) or expected_data is None:
        raise RecipeMismatchError(message)
    changes = recipe_changes(stored, expected_data)
    if not changes.compatible:
        raise RecipeMismatchError(f"{message}; changed: {changes.describe()}")
    logger.warning(
        "resuming %s, written before these options existed (they take this recipe's values): %s",
        path,
        ", ".join(changes.added),
    )


def load_latest_intact(
    run_dir: str | os.PathLike,
    expected_recipe: str | None = None,
    expected_data: Mapping[str, Any] | None = None,
) -> Checkpoint | None:
    """The newest checkpoint of a run that loads intact, or ``None`` when the run has none.

    A damaged checkpoint (:class:`CorruptCheckpointError`) is skipped with a warning that names it
    and says why; a checkpoint of another recipe is not damage and raises
    :class:`RecipeMismatchError`. When every checkpoint is damaged, the error lists them all.
    """
    skipped = []
    # every named checkpoint folder: one without its meta file cannot be a write in progress (those
    # are .tmp folders, renamed when complete), so it is damage, not "no checkpoint yet"
    for path in reversed(_complete_checkpoints(Path(run_dir) / CHECKPOINTS_DIR, complete=False)):
        try:
            checkpoint = load_checkpoint(path, expected_recipe=expected_recipe, expected_data=expected_data)
        except CorruptCheckpointError as error:
            logger.warning("skipping damaged checkpoint %s: %s", path.name, error)
            skipped.append(f"{path.name}: {error}")
            continue
        if skipped:
            logger.warning("resuming from %s, the newest intact checkpoint", path.name)
        return checkpoint
    if skipped:
        raise CorruptCheckpointError(f"every checkpoint in {run_dir} is damaged: " + "; ".join(skipped))
    return None
