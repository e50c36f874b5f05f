"""Worker processes for SVG rendering (:class:`SVGRenderPool`) and the batch API on top of them.

Each render runs in a worker process under a per-render timeout: a worker that overruns is
killed and replaced, a worker that crashes is replaced, and the batch carries on. Failures are
values (:class:`~genalign.rewards.svg.render.RenderResult` with ``error`` set), never exceptions.
Workers start through forkserver (spawn where there is none) and never import the main module:
their code lives here, so the pool hides ``__main__`` while it starts them (:func:`_without_main`).
A script that renders therefore needs no ``if __name__ == "__main__":`` guard, and its top-level
code never runs again inside a worker (where an unguarded training script would start training
over). What a worker does per document is :mod:`genalign.rewards.svg.render`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import sys
import threading
import time
import types
from collections import deque
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from genalign.rewards.svg.render import (
    RawResult,
    RenderLimits,
    RenderResult,
    _check_backend,
    _check_output_size,
    _render_raw,
    _to_result,
    render_local,
)
from genalign.rewards.svg.sanitize import SVGRejected, check_size

logger = logging.getLogger(__name__)

__all__ = ["SVGRenderPool", "default_workers", "render_batch", "render_svg", "shared_pool"]


# -- worker processes ----------------------------------------------------------------------------


_WARM_UP = {
    "cairosvg": '<svg xmlns="http://www.w3.org/2000/svg"><rect width="4" height="4"/><text y="8">a</text></svg>',
    "skia": '<svg xmlns="http://www.w3.org/2000/svg"><rect width="4" height="4"/></svg>',  # no text: no fallback
}


def _warm_up() -> None:
    """Import both renderers and initialise fonts before taking work, so no task deadline pays
    for imports or a fontconfig start."""
    for backend, document in _WARM_UP.items():
        raw = _render_raw(document, 8, 8, backend, RenderLimits(), reject_blank=False)
        if raw[0] is not None:  # e.g. skia-python missing: shows up per task instead
            logger.debug("warm-up of %s failed: %s", backend, raw[1])


def _worker_main(connection: Connection) -> None:
    """Loop of a render worker: receive a task, send back a :data:`RawResult`; None stops it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills workers
    _warm_up()
    connection.send("ready")
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, svg, width, height, backend, limits, reject_blank = message
        connection.send((task_id, _render_raw(svg, width, height, backend, limits, reject_blank)))


_RENDERER_MODULES = ("cairosvg.parser", "cairosvg.surface", "skia")  # the forkserver skips any missing
_PRELOAD_LOCK = threading.Lock()
_PRELOAD_DONE = False


def _context(start_method: str | None) -> multiprocessing.context.BaseContext:
    """forkserver where available (fork-safe beside torch threads; fast respawns), else spawn.

    The forkserver preloads this module and the renderers once (not ``__main__``, its default:
    workers do not need the user's script), so forking a replacement worker after a timeout costs
    milliseconds instead of re-importing torch. The setting only takes effect if the forkserver
    has not been started by someone else yet; otherwise workers import on start (before they
    report ready, so no task deadline pays for it).
    """
    global _PRELOAD_DONE
    methods = multiprocessing.get_all_start_methods()
    method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        with _PRELOAD_LOCK:
            if not _PRELOAD_DONE:
                context.set_forkserver_preload([__name__, *_RENDERER_MODULES])
                _PRELOAD_DONE = True
    return context


@contextlib.contextmanager
def _without_main() -> Iterator[None]:
    """Start processes that do not import the main module.

    spawn and forkserver children re-run the parent's main script (as ``__mp_main__``) before
    their target, because the preparation data name it (``multiprocessing.spawn.
    get_preparation_data`` reads ``sys.modules["__main__"]``'s ``__spec__`` and ``__file__``). A
    render worker's target is in this module, so for the moment of ``Process.start()`` a bare
    module stands in for ``__main__``: the child gets no main to import, and an unguarded script
    is not run again (nor, inside the child, does it try to start workers of its own). The swap
    lasts only the start call; another thread that looks up ``__main__`` in that moment (to
    pickle one of the script's own classes, say) would see the stand-in.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is None:
            del sys.modules["__main__"]
        else:
            sys.modules["__main__"] = main


class _Worker:
    def __init__(self, context: multiprocessing.context.BaseContext) -> None:
        self.connection, child = context.Pipe(duplex=True)
        self.process = context.Process(
            target=_worker_main, args=(child,), daemon=True, name="svg-render-worker"
        )
        with _without_main():
            self.process.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()
        self.tasks = 0

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.connection.close()

    def stop(self) -> None:
        try:
            self.connection.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=2)
        self.kill()


class SVGRenderPool:
    """Worker processes that render SVGs with a per-render timeout.

    Each worker renders one document at a time; the parent hands out work, waits on the pipes,
    kills a worker whose render outlives ``limits.timeout`` (reporting ``"timeout"``), replaces a
    worker that dies (reporting ``"render_error"``), and keeps going. Results come back in input
    order. Thread-safe (one batch at a time); use as a context manager or call :meth:`close`.

    Args:
        workers: number of processes (default ``min(4, cpu_count)``).
        start_method: multiprocessing start method (default forkserver, else spawn).
        startup_timeout: seconds a new worker may take to import and report ready.
        max_tasks_per_worker: recycle a worker after this many renders (bounds leaks); None: never.
    """

    def __init__(
        self,
        workers: int | None = None,
        start_method: str | None = None,
        startup_timeout: float = 120.0,
        max_tasks_per_worker: int | None = 2000,
    ) -> None:
        self.size = int(workers or default_workers())
        if self.size < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.context = _context(start_method)
        self.startup_timeout = startup_timeout
        self.max_tasks_per_worker = max_tasks_per_worker
        self._workers: list[_Worker] = []
        self._startup_failures = 0
        self._lock = threading.Lock()
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> SVGRenderPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def close(self) -> None:
        """Stop every worker (politely, then by force)."""
        self._closed = True
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop()

    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers (they change when workers are replaced)."""
        return [w.process.pid for w in self._workers]

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        fresh = _Worker(self.context)
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    # -- rendering -------------------------------------------------------------------------------
    def render(
        self,
        svgs: Sequence[str],
        width: int,
        height: int,
        backend: str = "cairosvg",
        limits: RenderLimits | None = None,
        reject_blank: bool = True,
    ) -> list[RenderResult]:
        """Render every SVG at ``width`` x ``height``; one :class:`RenderResult` per input, in order."""
        _check_backend(backend)
        _check_output_size(width, height)
        limits = limits or RenderLimits()
        raws: list[RawResult | None] = [None] * len(svgs)
        queue: deque[int] = deque()
        for index, svg in enumerate(svgs):
            try:
                check_size(svg, limits)  # don't ship 10 MB to a worker just to reject it
                queue.append(index)
            except SVGRejected as rejection:
                raws[index] = (rejection.reason, rejection.message, None, None, 0.0)
        with self._lock:
            if self._closed:
                raise RuntimeError("SVGRenderPool is closed")
            while len(self._workers) < self.size:
                self._workers.append(_Worker(self.context))
            self._run(svgs, width, height, backend, limits, reject_blank, queue, raws)
        return [_to_result(raw) for raw in raws]  # type: ignore[arg-type]

    def _run(self, svgs, width, height, backend, limits, reject_blank, queue, raws) -> None:
        busy: dict[_Worker, tuple[int, float]] = {}  # worker -> (input index, deadline)
        while queue or busy:
            # 1. hand work to idle, ready workers
            for worker in list(self._workers):
                if not queue:
                    break
                if not worker.ready or worker in busy:
                    continue
                index = queue.popleft()
                try:
                    worker.connection.send((index, svgs[index], width, height, backend, limits, reject_blank))
                except (BrokenPipeError, OSError):
                    queue.appendleft(index)
                    self._replace(worker)
                    continue
                busy[worker] = (index, time.monotonic() + limits.timeout)
            # 2. wait for a result, a worker becoming ready, or the nearest deadline
            now = time.monotonic()
            deadlines = [deadline for _, deadline in busy.values()]
            deadlines += [w.started + self.startup_timeout for w in self._workers if not w.ready]
            waiting = {w.connection: w for w in self._workers if w in busy or not w.ready}
            ready = wait(list(waiting), timeout=max(0.0, min(deadlines, default=now + 1.0) - now))
            for connection in ready:
                worker = waiting[connection]
                try:
                    message = connection.recv()
                except (EOFError, OSError):  # the worker died (e.g. a renderer segfault)
                    code = worker.process.exitcode
                    if worker in busy:
                        index, _ = busy.pop(worker)
                        raws[index] = (
                            "render_error",
                            f"render worker died (exit code {code})",
                            None,
                            backend,
                            0.0,
                        )
                        logger.warning(
                            "SVG render worker died on input %d (exit code %s); replaced", index, code
                        )
                    elif not worker.ready:
                        self._startup_failures += 1
                        if self._startup_failures > 3 * self.size:
                            failure = f"SVG render workers keep dying on start (last exit code {code})"
                            raise RuntimeError(failure) from None
                    self._replace(worker)
                    continue
                if message == "ready":
                    worker.ready = True
                    self._startup_failures = 0
                    continue
                index, raw = message
                busy.pop(worker, None)
                raws[index] = raw
                worker.tasks += 1
                if self.max_tasks_per_worker and worker.tasks >= self.max_tasks_per_worker:
                    worker.stop()
                    self._replace(worker)
            # 3. kill whatever overran
            now = time.monotonic()
            for worker, (index, deadline) in list(busy.items()):
                if now >= deadline:
                    busy.pop(worker)
                    raws[index] = (
                        "timeout",
                        f"render took more than {limits.timeout:g} s",
                        None,
                        backend,
                        limits.timeout,
                    )
                    logger.warning(
                        "SVG render of input %d timed out after %.3g s; worker replaced",
                        index,
                        limits.timeout,
                    )
                    self._replace(worker)
            for worker in list(self._workers):
                if not worker.ready and now - worker.started > self.startup_timeout:
                    raise RuntimeError(
                        f"an SVG render worker did not start within {self.startup_timeout:g} s"
                    )


def default_workers() -> int:
    """``min(4, cpu_count)``: rendering is CPU-bound, one process per core."""
    return max(1, min(4, os.cpu_count() or 1))


_SHARED_POOLS: dict[int, SVGRenderPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(workers: int | None = None) -> SVGRenderPool:
    """A process-wide pool per worker count, created on first use and closed at exit.

    ``workers=None`` reuses any existing shared pool (else makes one of ``default_workers()``).
    """
    with _SHARED_LOCK:
        if workers is None:
            for pool in _SHARED_POOLS.values():
                if not pool._closed:
                    return pool
            workers = default_workers()
        pool = _SHARED_POOLS.get(workers)
        if pool is None or pool._closed:
            pool = _SHARED_POOLS[workers] = SVGRenderPool(workers)
        return pool


@atexit.register
def _close_shared_pools() -> None:
    for pool in list(_SHARED_POOLS.values()):
        pool.close()
    _SHARED_POOLS.clear()


def render_batch(
    svgs: Sequence[str],
    width: int,
    height: int,
    backend: str = "cairosvg",
    limits: RenderLimits | None = None,
    workers: int | None = None,
    *,
    pool: SVGRenderPool | None = None,
    reject_blank: bool = True,
) -> list[RenderResult]:
    """Render a batch in parallel worker processes with a per-render timeout.

    Args:
        svgs: SVG documents (str); B of them.
        width, height: output size in pixels (the declared size never decides it).
        backend: "cairosvg" (reference) or "skia" (fast; falls back per document, see module doc).
        limits: sanitisation caps and the per-render ``timeout``.
        workers: processes of the shared pool to use (see :func:`shared_pool`); ignored if
            ``pool`` is given.
        pool: an explicit :class:`SVGRenderPool`.
        reject_blank: report a uniform render as ``"blank"`` (no image) instead of returning it.

    Returns:
        B :class:`RenderResult` in input order; failures carry a reason code, never raise.
    """
    if isinstance(svgs, str):
        raise TypeError("render_batch expects a sequence of SVG strings, not a single string")
    pool = pool or shared_pool(workers)
    return pool.render(list(svgs), width, height, backend, limits, reject_blank)


def render_svg(
    svg: str,
    width: int,
    height: int,
    backend: str = "cairosvg",
    limits: RenderLimits | None = None,
    *,
    isolate: bool = True,
    reject_blank: bool = True,
) -> RenderResult:
    """Render one SVG at ``width`` x ``height``: ``RenderResult(image [3, H, W] in [0, 1] | None, error)``.

    With ``isolate=True`` (default) the render runs in a shared worker process under
    ``limits.timeout``; ``isolate=False`` renders in this process (see :func:`render_local`).
    """
    if not isolate:
        return render_local(svg, width, height, backend, limits, reject_blank)
    return render_batch([svg], width, height, backend, limits, reject_blank=reject_blank)[0]
