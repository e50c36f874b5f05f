"""Side-by-side timing shared by the benchmarks: warm-up, then alternating repeats, medians.

Two variants of the same work (the library's way and a bare baseline) are timed in one process,
interleaved A B, B A, A B ... so that a change of machine load (other processes, thermal state,
allocator growth) hits both equally. Each sample runs with the garbage collector off, as
``timeit`` does, and on CUDA between two synchronisations. The number to read is the ratio:
absolute times of tiny models say little about real ones.
"""

from __future__ import annotations

import cProfile
import ctypes
import gc
import os
import pstats
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class Comparison:
    """Seconds per call of a measured variant and its baseline, ``repeats`` samples each.

    Attributes:
        ratio: ``median(measured) / median(baseline)``, the headline number.
        paired_ratio: the median over repeats of ``measured_i / baseline_i``; the two calls of a
            pair run back to back, so load drift between pairs cancels.
        noise: half the interquartile range of the per-pair ratios; a ratio closer to its target
            than this is not resolved on this machine (repeat with more ``repeats``).
    """

    measured: list[float]
    baseline: list[float]
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def measured_median(self) -> float:
        return statistics.median(self.measured)

    @property
    def baseline_median(self) -> float:
        return statistics.median(self.baseline)

    @property
    def ratio(self) -> float:
        return self.measured_median / self.baseline_median

    @property
    def pair_ratios(self) -> list[float]:
        return [m / b for m, b in zip(self.measured, self.baseline)]

    @property
    def paired_ratio(self) -> float:
        return statistics.median(self.pair_ratios)

    @property
    def noise(self) -> float:
        """Half the interquartile range of the per-pair ratios: how far apart repeats disagree."""
        if len(self.pair_ratios) < 2:
            return float("nan")
        low, _, high = statistics.quantiles(self.pair_ratios, n=4)
        return (high - low) / 2

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            measured_median=self.measured_median,
            baseline_median=self.baseline_median,
            ratio=self.ratio,
            paired_ratio=self.paired_ratio,
            noise=self.noise,
        )
        return out


def synchronize(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str | torch.device = "cpu") -> float:
    """Seconds taken by one call of ``fn`` (GC off; CUDA work included)."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        return time.perf_counter() - start
    finally:
        if enabled:
            gc.enable()


def compare(
    measured: Callable[[], object],
    baseline: Callable[[], object],
    repeats: int = 5,
    warmup: int = 1,
    device: str | torch.device = "cpu",
) -> Comparison:
    """Time ``measured`` against ``baseline``: ``warmup`` untimed calls of each, then ``repeats``
    timed pairs whose order alternates (A B, B A, ...)."""
    if repeats <= 0:
        raise ValueError(f"repeats must be positive, got {repeats}")
    for _ in range(warmup):
        measured()
        baseline()
    measured_times, baseline_times = [], []
    for i in range(repeats):
        if i % 2 == 0:
            measured_times.append(timed(measured, device))
            baseline_times.append(timed(baseline, device))
        else:
            baseline_times.append(timed(baseline, device))
            measured_times.append(timed(measured, device))
    return Comparison(measured_times, baseline_times)


def _function_stats(fn: Callable[[], object], calls: int) -> dict[str, tuple[int, float, float]]:
    """cProfile ``calls`` calls of ``fn``: {function: (ncalls, self seconds, cumulative seconds)}."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    out = {}
    for (filename, line, name), (_, ncalls, self_time, cumulative, _) in stats.items():
        short = filename.split("site-packages/")[-1].split("/genalign/")[-1]
        out[f"{short}:{line}({name})"] = (ncalls, self_time, cumulative)
    return out


def profile_difference(
    measured: Callable[[], object], baseline: Callable[[], object], calls: int = 2, rows: int = 15
) -> str:
    """cProfile ``calls`` calls of each; the ``rows`` functions whose self time grows most from
    ``baseline`` to ``measured``, with call counts and cumulative times of both (m/b)."""
    a, b = _function_stats(measured, calls), _function_stats(baseline, calls)
    empty = (0, 0.0, 0.0)
    keys = sorted(set(a) | set(b), key=lambda k: a.get(k, empty)[1] - b.get(k, empty)[1], reverse=True)
    total_a = sum(v[1] for v in a.values())
    total_b = sum(v[1] for v in b.values())
    lines = [
        f"    cProfile, {calls} calls each: measured {total_a * 1e3:.0f} ms, baseline {total_b * 1e3:.0f} ms",
        f"    {'extra self ms':>13s} {'calls m/b':>13s} {'cum ms m/b':>15s}  function",
    ]
    for key in keys[:rows]:
        (na, ta, ca), (nb, tb, cb) = a.get(key, empty), b.get(key, empty)
        lines.append(
            f"    {(ta - tb) * 1e3:13.1f} {f'{na}/{nb}':>13s} {f'{ca * 1e3:.0f}/{cb * 1e3:.0f}':>15s}  {key}"
        )
    return "\n".join(lines)


def _resident_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _reset_peak_rss() -> bool:
    """Return freed heap to the OS and restart the kernel's RSS high-water mark (Linux >= 4.0)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def peak_memory(fn: Callable[[], object], device: str | torch.device = "cpu") -> tuple[float, float]:
    """Peak memory of one call of ``fn`` in MiB, and how far it rose above the level at the start.

    CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``. CPU: the
    process's maximum resident set size (``getrusage`` ``ru_maxrss``) after resetting its
    high-water mark; where that reset is not possible, the peak is the whole process's so far.
    """
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated() / 2**20
        fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
        return peak, peak - start
    gc.collect()
    _reset_peak_rss()
    start = _resident_mib()
    fn()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return peak, peak - start
