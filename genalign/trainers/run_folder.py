"""A run folder belongs to one run: a lock file, a fresh-run check and the metrics file.

Two runs writing into one folder delete each other's in-progress checkpoints and interleave
``metrics.jsonl`` and ``recipe.json``; a fresh run into a used folder keeps the earlier run's
checkpoints, which ``resume=latest`` then continues (issue 23.2). So:

* :class:`RunFolderLock` — ``run.lock`` in the folder holds the owner's process id and host. A
  second live run fails with :class:`RunFolderError`; a lock whose process is gone (same host)
  is taken over with a warning. A lock from another host is never taken over: its process cannot
  be checked from here, so the message says how to remove it.
* :func:`check_fresh_run` — a run without ``logging.resume`` into a folder that holds another
  run's checkpoints or metric lines refuses, offering ``logging.resume=latest`` or a new folder;
  with ``logging.overwrite=true`` the earlier run's outputs (:data:`RUN_OUTPUTS`) are deleted
  first. Deleting, not moving aside: an explicit overwrite is what the option says, and moved
  copies of checkpoints would fill the disk unnoticed.
* :func:`read_metrics` / :func:`rewrite_metrics` — the metrics file, read with a torn last line
  (a write cut short by a full disk or a kill) dropped with a warning, and every JSON error
  naming the file and line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "LOCK_FILE",
    "RUN_OUTPUTS",
    "RunFolderError",
    "RunFolderLock",
    "check_fresh_run",
    "read_metrics",
    "rewrite_metrics",
]

LOCK_FILE = "run.lock"
METRICS_FILE = "metrics.jsonl"
# what a run writes into its folder; `logging.overwrite=true` deletes exactly these
RUN_OUTPUTS = ("checkpoints", METRICS_FILE, "recipe.json", "final", "samples", "reward_curve.png")


class RunFolderError(RuntimeError):
    """The run folder cannot be used by this run (owned by a live run, or holds another run)."""


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


class RunFolderLock:
    """``<run_dir>/run.lock``: held by one live process for the duration of a run.

    Use as a context manager, or :meth:`acquire` / :meth:`release`. The lock file is created with
    ``O_CREAT | O_EXCL``, so of two runs starting at once exactly one gets it.
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.owner = {"pid": os.getpid(), "host": socket.gethostname()}
        self.held = False

    def read(self) -> dict[str, Any] | None:
        """The current lock's contents (``None``: no lock; ``{}``: unreadable, e.g. half-written)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return {}
        return data if isinstance(data, dict) else {}

    def acquire(self) -> None:
        """Take the lock, taking over a stale one; :class:`RunFolderError` if a live run holds it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(10):
            if self._create():
                self.held = True
                return
            holder = self.read()
            if holder is None:
                continue  # released meanwhile
            pid, host = holder.get("pid"), holder.get("host")
            if not isinstance(pid, int) or host is None:
                if time.time() - self._mtime() < 5:  # being written by a run starting right now
                    time.sleep(0.2)
                    continue
                reason = f"an unreadable lock file {self.path}"
            elif host != self.owner["host"]:
                raise RunFolderError(
                    f"run folder {self.run_dir} is locked by process {pid} on host {host!r}; if that run "
                    f"is over, delete {self.path}, or choose another logging.run_dir"
                )
            elif pid == self.owner["pid"] or _process_alive(pid):
                raise RunFolderError(
                    f"run folder {self.run_dir} is in use by a live run (process {pid} on {host}, lock "
                    f"{self.path}); wait for it to end or choose another logging.run_dir"
                )
            else:
                reason = f"a stale lock of process {pid}, which is no longer running"
            self._take_over(holder, reason)
        raise RunFolderError(f"could not lock run folder {self.run_dir}: {self.path} keeps changing")

    def _mtime(self) -> float:
        try:
            return self.path.stat().st_mtime
        except FileNotFoundError:
            return 0.0

    def _create(self) -> bool:
        try:
            descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump({**self.owner, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}, handle)
        return True

    def _take_over(self, holder: dict[str, Any], reason: str) -> None:
        """Move the stale lock aside (atomic: of two runs taking over, one moves it) and delete it."""
        aside = self.path.with_name(f"{LOCK_FILE}.stale-{secrets.token_hex(4)}")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            return  # another run took it over first; the next _create decides
        moved = self.read_file(aside)
        aside.unlink(missing_ok=True)
        if moved != holder:  # a live run's fresh lock, not the stale one we judged: put it back
            self._restore(aside, moved)
            return
        logger.warning("run folder %s: taking over %s", self.run_dir, reason)

    def _restore(self, aside: Path, data: dict[str, Any] | None) -> None:
        if data is None:
            return
        with contextlib.suppress(FileExistsError):
            descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(data, handle)

    @staticmethod
    def read_file(path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else {}

    def release(self) -> None:
        """Delete the lock if this process still holds it."""
        if self.held and (self.read() or {}).get("pid") == self.owner["pid"]:
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> RunFolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def earlier_run_outputs(run_dir: Path) -> list[str]:
    """What in ``run_dir`` shows that a run already trained there (checkpoints, metric lines)."""
    from genalign.trainers.checkpoint import list_checkpoints

    found = []
    checkpoints = list_checkpoints(run_dir)
    if checkpoints:
        found.append(f"{len(checkpoints)} checkpoint(s) up to {checkpoints[-1].name}")
    metrics = run_dir / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(f"metric lines in {METRICS_FILE}")
    return found


def check_fresh_run(run_dir: str | os.PathLike, overwrite: bool) -> None:
    """Refuse a fresh run into a folder holding another run, or delete that run with ``overwrite``."""
    run_dir = Path(run_dir)
    found = earlier_run_outputs(run_dir)
    if not found:
        return
    if not overwrite:
        raise RunFolderError(
            f"run folder {run_dir} holds another run ({'; '.join(found)}): continue it with "
            "logging.resume=latest, choose another logging.run_dir, or pass logging.overwrite=true "
            "to delete it"
        )
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    logger.warning("logging.overwrite: deleted the earlier run in %s (%s)", run_dir, "; ".join(found))


# ----------------------------------------------------------------------------- metrics file
def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``; a torn last line is dropped with a warning.

    A line that is not valid JSON anywhere but at the end is damage this function cannot judge:
    :class:`ValueError` naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "step" not in row:
                raise ValueError("not an object with a 'step'")
        except ValueError as error:
            if number == len(lines):
                logger.warning("%s: dropping its torn last line %d (%s)", path, number, error)
                continue
            raise ValueError(f"{path}, line {number}: not a metrics row ({error})") from error
        rows.append(row)
    return rows


def rewrite_metrics(path: str | os.PathLike, rows: list[dict[str, Any]]) -> None:
    """Replace the metrics file with ``rows`` atomically (a temporary file renamed into place)."""
    path = Path(path)
    temporary = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


@contextlib.contextmanager
def owned_run_folder(run_dir: str | os.PathLike, main_process: bool = True) -> Iterator[None]:
    """Hold the run folder's lock for the block (the main process only)."""
    if not main_process:
        yield
        return
    with RunFolderLock(run_dir):
        yield
