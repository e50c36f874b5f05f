"""SVG rendering throughput: cairosvg vs skia, and worker-pool parallelism, measured side by side.

Renders the same random documents (filled and stroked rects, circles, ellipses, polygons, Bezier
paths, opacity, rotations, gradients on straight-edged shapes: the subset skia renders itself)
in alternating rounds:

- in this process (``render_local``: sanitise + rasterise, no isolation) with each backend;
- through :class:`SVGRenderPool` with 1 and 2 worker processes (timeouts, IPC included).

A second table measures the pool **under RL load** (issue #25 item 7): a GRPO step renders
``inputs x G`` completions in one call (G = 8, 16, 32, 64 rollouts per input; RLRF uses 64), one in
eight of them malformed as sampled SVG often is, at the reward's render size; it prints renders/s
and seconds per step's batch for each G with 1 and 2 workers (``--rl-workers``).

Ratios are the numbers to read: ``skia / cairosvg`` is what the fast backend buys per core,
``2 workers / 1 worker`` what a second process buys (bounded by free cores), ``pool / in-process``
what isolation costs. Absolute rates depend on the machine; the parallel ratio needs free cores
(the parent process also works: it hands out tasks and converts results), so the CPU count and
load average are printed with the table.

    python benchmarks/svg_render.py                      # 48 documents, 256 px, 3 rounds, ~20 s
    python benchmarks/svg_render.py --size 512 --documents 96
    python benchmarks/svg_render.py --rl-only --rl-inputs 4 --rl-size 224   # only the RL-load table
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable

from genalign.rewards.svg import SVGRenderPool, render_local


def random_color(rng: random.Random) -> str:
    return "#" + "".join(f"{rng.randrange(256):02x}" for _ in range(3))


def random_document(rng: random.Random, shapes: int = 12) -> str:
    defs, body = [], []
    for i in range(shapes):
        kind = rng.choice(["rect", "circle", "ellipse", "polygon", "path"])
        paint = random_color(rng)
        if kind in ("rect", "circle", "polygon") and rng.random() < 0.3:
            stops = "".join(f'<stop offset="{o}" stop-color="{random_color(rng)}"/>' for o in (0, 1))
            defs.append(f'<linearGradient id="g{i}">{stops}</linearGradient>')
            paint = f"url(#g{i})"
        style = f'fill="{paint}"'
        if rng.random() < 0.5:
            style += f' stroke="{random_color(rng)}" stroke-width="{rng.uniform(0.5, 4):.1f}" stroke-linejoin="round"'
        if rng.random() < 0.3:
            style += f' opacity="{rng.uniform(0.3, 0.9):.2f}"'
        if rng.random() < 0.3:
            style += f' transform="rotate({rng.uniform(-45, 45):.1f} 50 50)"'
        x, y, w, h = rng.uniform(0, 70), rng.uniform(0, 70), rng.uniform(5, 40), rng.uniform(5, 40)
        points = [f"{rng.uniform(0, 100):.1f} {rng.uniform(0, 100):.1f}" for _ in range(7)]
        if kind == "rect":
            body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" {style}/>')
        elif kind == "circle":
            body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{w / 2:.1f}" {style}/>')
        elif kind == "ellipse":
            body.append(f'<ellipse cx="{x:.1f}" cy="{y:.1f}" rx="{w / 2:.1f}" ry="{h / 2:.1f}" {style}/>')
        elif kind == "polygon":
            body.append(f'<polygon points="{" ".join(p.replace(" ", ",") for p in points[:5])}" {style}/>')
        else:
            d = f"M{points[0]} C{points[1]} {points[2]} {points[3]} Q{points[4]} {points[5]} L{points[6]} Z"
            body.append(f'<path d="{d}" {style}/>')
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 100">'
        f"<defs>{''.join(defs)}</defs>{''.join(body)}</svg>"
    )


def rate(fn: Callable[[], object], count: int) -> float:
    start = time.perf_counter()
    fn()
    return count / (time.perf_counter() - start)


def rl_batch(rng: random.Random, inputs: int, group: int, shapes: int) -> list[str]:
    """``inputs x group`` sampled completions: ``group`` documents per input, one in eight cut off
    mid-element (malformed, as a truncated or broken sample is)."""
    documents = []
    for _ in range(inputs * group):
        document = random_document(rng, shapes)
        if rng.random() < 1 / 8:
            document = document[: rng.randrange(20, len(document) - 10)]
        documents.append(document)
    return documents


def rl_load(args: argparse.Namespace) -> None:
    """Renders/s of one GRPO step's batch (``inputs x G`` documents in one ``render`` call)."""
    rng = random.Random(1)
    groups = (8, 16, 32, 64)
    batches = {g: rl_batch(rng, args.rl_inputs, g, args.rl_shapes) for g in groups}
    size = args.rl_size
    rates: dict[tuple[int, int], list[float]] = {}
    for workers in args.rl_workers:
        with SVGRenderPool(workers=workers) as pool:
            pool.render(batches[8][:4], size, size)  # start the workers
            for _ in range(args.rounds):
                for g in groups:
                    count = len(batches[g])
                    rates.setdefault((workers, g), []).append(
                        rate(lambda b=batches[g]: pool.render(b, size, size, args.rl_backend), count)
                    )
    print(
        f"\nunder RL load: {args.rl_inputs} inputs x G completions of {args.rl_shapes} shapes at "
        f"{size}x{size}, {args.rl_backend}, 1 in 8 malformed, {args.rounds} rounds (median)"
    )
    print(
        f"{'G':>4}{'batch':>7}"
        + "".join(f"{f'renders/s x{w}':>16}{f's/step x{w}':>12}" for w in args.rl_workers)
    )
    for g in groups:
        row = f"{g:>4}{len(batches[g]):>7}"
        for workers in args.rl_workers:
            median = statistics.median(rates[(workers, g)])
            row += f"{median:>16.1f}{len(batches[g]) / median:>12.2f}"
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--documents", type=int, default=48)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", type=int, default=16, help="shapes per document")
    parser.add_argument("--rl-only", action="store_true", help="only the RL-load table")
    parser.add_argument("--rl-inputs", type=int, default=4, help="RL load: inputs (images) per step")
    parser.add_argument("--rl-size", type=int, default=224, help="RL load: render size")
    parser.add_argument("--rl-shapes", type=int, default=8, help="RL load: shapes per document")
    parser.add_argument("--rl-workers", type=int, nargs="+", default=[1, 2], help="RL load: pool sizes")
    parser.add_argument("--rl-backend", default="cairosvg", choices=["cairosvg", "skia"])
    args = parser.parse_args()
    if not args.rl_only:
        throughput(args)
    rl_load(args)


def throughput(args: argparse.Namespace) -> None:
    """The backend and pool comparison (module docstring)."""

    rng = random.Random(0)
    documents = [random_document(rng, args.shapes) for _ in range(args.documents)]
    size, count = args.size, len(documents)
    skia_share = sum(render_local(d, size, size, "skia").backend == "skia" for d in documents) / count

    with SVGRenderPool(workers=1) as one, SVGRenderPool(workers=2) as two:
        one.render(documents[:2], size, size)  # start the workers (forkserver, imports)
        two.render(documents[:4], size, size)
        modes: dict[str, Callable[[], object]] = {}
        for backend in ("cairosvg", "skia"):
            modes[f"{backend}, in-process"] = lambda b=backend: [
                render_local(d, size, size, b) for d in documents
            ]
            modes[f"{backend}, pool x1"] = lambda b=backend: one.render(documents, size, size, b)
            modes[f"{backend}, pool x2"] = lambda b=backend: two.render(documents, size, size, b)
        rates: dict[str, list[float]] = {name: [] for name in modes}
        for _ in range(args.rounds):  # alternate, so drift in machine load hits every mode alike
            for name, fn in modes.items():
                rates[name].append(rate(fn, count))
    median = {name: statistics.median(values) for name, values in rates.items()}

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{count} documents of {args.shapes} shapes at {size}x{size}, {args.rounds} rounds (median); "
        f"skia rendered {skia_share:.0%} itself; {os.cpu_count()} CPUs, load average {load:.1f}"
    )
    print(f"{'mode':<24}{'renders/s':>12}")
    for name, value in median.items():
        print(f"{name:<24}{value:>12.1f}")
    print()
    print(f"{'ratio':<40}{'cairosvg':>10}{'skia':>10}")
    rows = [
        ("2 workers / 1 worker", lambda b: median[f"{b}, pool x2"] / median[f"{b}, pool x1"]),
        (
            "pool x1 / in-process (isolation cost)",
            lambda b: median[f"{b}, pool x1"] / median[f"{b}, in-process"],
        ),
    ]
    for label, fn in rows:
        print(f"{label:<40}{fn('cairosvg'):>10.2f}{fn('skia'):>10.2f}")
    for mode in ("in-process", "pool x1", "pool x2"):
        ratio = median[f"skia, {mode}"] / median[f"cairosvg, {mode}"]
        print(f"{'skia / cairosvg, ' + mode:<40}{ratio:>10.2f}")


if __name__ == "__main__":
    main()
