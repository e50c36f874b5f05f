"""Rendering: pixels, backends agreeing, batches equal single renders, and hostile input.

The worker-process tests share one small pool (the first start pays for the forkserver importing
torch once, a few seconds); the timeout tests use their own pools so killed workers are theirs.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest
import torch

from genalign.rewards.svg.pool import SVGRenderPool, render_batch, render_svg
from genalign.rewards.svg.render import (
    RenderLimits,
    _make_fetcher,
    _rasterize_cairosvg,
    render_local,
)

NS = 'xmlns="http://www.w3.org/2000/svg"'


def svg(body: str, attributes: str = 'viewBox="0 0 100 100"') -> str:
    return f'<svg {NS} xmlns:xlink="http://www.w3.org/1999/xlink" {attributes}>{body}</svg>'


def random_color(rng: random.Random) -> str:
    return "#" + "".join(f"{rng.randrange(256):02x}" for _ in range(3))


def random_svg(rng: random.Random, shapes: int = 6) -> str:
    """Random rects, rounded rects, circles, ellipses, polygons and Bezier paths with strokes
    (joins, caps), opacity, fill-opacity, rotations and linear/radial gradients."""
    defs, body = [], []
    for i in range(shapes):
        paint = random_color(rng)
        if rng.random() < 0.25:
            kind = rng.choice(["linearGradient", "radialGradient"])
            stops = "".join(f'<stop offset="{o}" stop-color="{random_color(rng)}"/>' for o in (0, 0.5, 1))
            defs.append(f'<{kind} id="g{i}">{stops}</{kind}>')
            paint = f"url(#g{i})"
        style = f'fill="{paint}"'
        if rng.random() < 0.5:
            join, cap = rng.choice(["miter", "round", "bevel"]), rng.choice(["butt", "round", "square"])
            style += f' stroke="{random_color(rng)}" stroke-width="{rng.uniform(0.5, 6):.2f}"'
            style += f' stroke-linejoin="{join}" stroke-linecap="{cap}"'
        if rng.random() < 0.3:
            style += f' opacity="{rng.uniform(0.3, 0.9):.2f}"'
        if rng.random() < 0.2:
            style += f' fill-opacity="{rng.uniform(0.3, 0.9):.2f}"'
        if rng.random() < 0.3:
            style += f' transform="rotate({rng.uniform(-45, 45):.1f} 50 50)"'
        x, y, w, h = rng.uniform(0, 70), rng.uniform(0, 70), rng.uniform(5, 50), rng.uniform(5, 50)
        kind = rng.choice(["rect", "rrect", "circle", "ellipse", "polygon", "path"])
        if kind == "rect":
            body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" {style}/>')
        elif kind == "rrect":
            body.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{min(w, h) / 4:.1f}" {style}/>'
            )
        elif kind == "circle":
            body.append(
                f'<circle cx="{x + w / 2:.1f}" cy="{y + h / 2:.1f}" r="{min(w, h) / 2:.1f}" {style}/>'
            )
        elif kind == "ellipse":
            body.append(
                f'<ellipse cx="{x + w / 2:.1f}" cy="{y + h / 2:.1f}" rx="{w / 2:.1f}" ry="{h / 2:.1f}" {style}/>'
            )
        else:
            points = [f"{rng.uniform(0, 100):.1f} {rng.uniform(0, 100):.1f}" for _ in range(7)]
            if kind == "polygon":
                body.append(
                    f'<polygon points="{" ".join(p.replace(" ", ",") for p in points[:5])}" {style}/>'
                )
            else:
                d = f"M{points[0]} C{points[1]} {points[2]} {points[3]} Q{points[4]} {points[5]} L{points[6]} Z"
                body.append(f'<path d="{d}" {style}/>')
    return svg(f"<defs>{''.join(defs)}</defs>{''.join(body)}")


SCENE = svg(
    '<rect x="10" y="10" width="40" height="30" fill="#ff0000"/>'
    '<circle cx="70" cy="70" r="20" fill="#0000ff" stroke="#000" stroke-width="2"/>'
)


@pytest.fixture(scope="module")
def pool():
    with SVGRenderPool(workers=2) as pool:
        yield pool


# -- pixels ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["cairosvg", "skia"])
def test_pixels_land_where_the_viewbox_says(backend):
    result = render_local(SCENE, 50, 50, backend)
    assert result.ok and result.backend == backend
    image = result.image
    assert image.shape == (3, 50, 50) and image.dtype == torch.float32
    assert 0.0 <= image.min() and image.max() <= 1.0
    assert torch.allclose(image[:, 12, 12], torch.tensor([1.0, 0.0, 0.0]))  # inside the red rect (x 5..25)
    assert torch.allclose(image[:, 35, 35], torch.tensor([0.0, 0.0, 1.0]))  # blue circle centre
    assert torch.allclose(image[:, 2, 45], torch.ones(3))  # white background


def test_output_size_is_the_callers_never_the_declared_one():
    huge = svg('<rect width="50000" height="50000" fill="#00ff00"/>', 'width="100000" height="100000"')
    start = time.perf_counter()
    result = render_local(huge, 40, 30, limits=RenderLimits(max_declared_size=1e6))
    assert result.ok and result.image.shape == (3, 30, 40)
    assert time.perf_counter() - start < 2.0
    # 100000x100000 user units fitted into 40x30 (meet, centred: x 5..35); the rect is its top-left quarter
    assert torch.allclose(result.image[:, 7, 12], torch.tensor([0.0, 1.0, 0.0]))
    assert torch.allclose(result.image[:, 7, 2], torch.ones(3)) and torch.allclose(
        result.image[:, 20, 25], torch.ones(3)
    )
    assert render_local(huge, 40, 30).error == "too_large"  # default cap on declared size


def test_transparency_composites_on_white_and_uniform_is_blank():
    half = render_local(svg('<rect width="50" height="100" fill="black" fill-opacity="0.5"/>'), 20, 20)
    assert half.ok
    assert torch.allclose(half.image[:, 10, 2], torch.full((3,), 0.5), atol=1 / 255)
    assert torch.allclose(half.image[:, 10, 18], torch.ones(3))
    for document in (
        svg(""),
        svg('<rect width="100" height="100" fill="#123456"/>'),
        svg('<rect width="1" height="1" opacity="0"/>'),
    ):
        result = render_local(document, 20, 20)
        assert result.error == "blank" and result.image is None
    assert render_local(svg(""), 20, 20, reject_blank=False).image.eq(1).all()


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="backend"):
        render_local(SCENE, 8, 8, backend="inkscape")
    with pytest.raises(ValueError, match="output size"):
        render_local(SCENE, 0, 8)
    with pytest.raises(TypeError, match="single string"):
        render_batch(SCENE, 8, 8)


# -- backends --------------------------------------------------------------------------------------


def test_backends_agree():
    """skia vs cairosvg on random documents: the tolerance stated in render.py's docstring."""
    rng = random.Random(0)
    used, worst_mean, worst_p99, worst_share = 0, 0.0, 0.0, 0.0
    for _ in range(40):
        document = random_svg(rng)
        reference, fast = render_local(document, 96, 96, "cairosvg"), render_local(document, 96, 96, "skia")
        assert reference.ok and fast.ok, (reference.detail, fast.detail)
        if fast.backend != "skia":  # fell back (curved path painted by a gradient): identical by construction
            assert torch.equal(reference.image, fast.image)
            continue
        used += 1
        difference = (reference.image - fast.image).abs()
        worst_mean = max(worst_mean, difference.mean().item())
        worst_p99 = max(worst_p99, difference.flatten().quantile(0.99).item())
        worst_share = max(worst_share, (difference > 0.1).float().mean().item())
    assert used >= 10
    assert worst_mean <= 0.006, worst_mean
    assert worst_p99 <= 0.12, worst_p99
    assert worst_share <= 0.015, worst_share


def test_skia_falls_back_to_cairosvg_where_they_differ():
    text = svg('<text x="10" y="50" font-size="30">Hi</text>')
    result = render_local(text, 64, 64, "skia")
    assert result.ok and result.backend == "cairosvg"
    assert torch.equal(result.image, render_local(text, 64, 64, "cairosvg").image)


def test_leaf_opacity_and_ellipse_gradients_match_cairosvg():
    gradient = '<linearGradient id="g"><stop offset="0" stop-color="yellow"/><stop offset="1" stop-color="purple"/></linearGradient>'
    for body in (
        '<rect x="10" y="10" width="50" height="40" fill="#a52" opacity="0.5" stroke="#25a" stroke-width="6"/>',
        gradient + '<ellipse cx="50" cy="50" rx="40" ry="20" fill="url(#g)"/>',
    ):
        reference, fast = render_local(svg(body), 64, 64, "cairosvg"), render_local(svg(body), 64, 64, "skia")
        assert fast.backend == "skia"
        assert (reference.image - fast.image).abs().mean() < 0.004


# -- worker pool -----------------------------------------------------------------------------------


def test_batch_equals_single_renders(pool):
    rng = random.Random(1)
    documents = [random_svg(rng) for _ in range(6)] + ["<svg", SCENE]
    for backend in ("cairosvg", "skia"):
        batch = pool.render(documents, 48, 40, backend)
        for document, result in zip(documents, batch):
            single = render_local(document, 48, 40, backend)
            assert result.error == single.error and result.backend == single.backend
            if single.ok:
                assert torch.equal(result.image, single.image)
    assert render_svg(SCENE, 48, 40).ok  # the module-level API (shared pool)
    assert torch.equal(render_batch([SCENE], 48, 40, workers=1)[0].image, render_local(SCENE, 48, 40).image)


def slow_svg(segments: int = 40_000) -> str:
    """~0.4 MB: a self-intersecting 40k-segment polyline stroked 30 units wide with round joins;
    cairo needs tens of seconds for it, well under every size cap."""
    rng = random.Random(0)
    points = " ".join(f"L{rng.uniform(0, 100):.1f} {rng.uniform(0, 100):.1f}" for _ in range(segments))
    return svg(
        f'<path d="M0 0 {points}" fill="none" stroke="black" stroke-width="30" stroke-linejoin="round"/>'
    )


def test_timeout_kills_the_worker_and_the_pool_keeps_working():
    limits = RenderLimits(timeout=1.0)
    with SVGRenderPool(workers=2) as pool:
        pool.render([SCENE, SCENE], 32, 32)  # workers up
        before = set(pool.pids)
        start = time.perf_counter()
        results = pool.render([slow_svg(), SCENE, SCENE, SCENE], 32, 32, limits=limits)
        elapsed = time.perf_counter() - start
        assert results[0].error == "timeout" and results[0].image is None
        assert all(r.ok for r in results[1:])
        assert elapsed < 4.0, elapsed
        assert len(set(pool.pids) - before) == 1  # exactly the overrunning worker was replaced
        again = pool.render([SCENE] * 4, 32, 32, limits=limits)
        assert all(r.ok for r in again)


def test_a_worker_that_dies_is_replaced_and_reported(pool):
    pool.render([SCENE, SCENE], 32, 32)
    victims = list(pool.pids)

    def kill_soon():
        time.sleep(2.0)  # well after both renders are dispatched, even on a loaded machine
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_soon)
    killer.start()
    results = pool.render([slow_svg(), slow_svg()], 32, 32, limits=RenderLimits(timeout=20))
    killer.join()
    assert [r.error for r in results] == ["render_error", "render_error"]
    assert "died" in results[0].detail
    assert set(pool.pids).isdisjoint(victims)
    assert all(r.ok for r in pool.render([SCENE] * 3, 32, 32))


UNGUARDED_SCRIPT = """
import sys
print("top-level code ran", flush=True)
from genalign.rewards.svg.pool import SVGRenderPool
with SVGRenderPool(workers=2, start_method=sys.argv[1], startup_timeout=60) as pool:
    results = pool.render([{scene!r}] * 3, 16, 16)
print("rendered", [r.ok for r in results], flush=True)
"""


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_script_without_a_main_guard_renders_and_is_not_run_again(tmp_path, method):
    """spawn / forkserver children re-run the parent's main script unless the pool hides it: an
    unguarded script would then start the pool again inside each worker and fail (and a training
    script would train again inside the forkserver)."""
    import subprocess
    import sys

    script = tmp_path / "render_script.py"
    script.write_text(UNGUARDED_SCRIPT.format(scene=SCENE), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script), method], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["top-level code ran", "rendered [True, True, True]"]


# -- hostile input ---------------------------------------------------------------------------------


@pytest.fixture
def secret_files(tmp_path):
    """A regular file holding a secret, and a FIFO: opening a FIFO for reading blocks until a
    writer appears, so any attempt to read it would turn into a timeout instead of the expected
    rejection."""
    secret = "TOP-SECRET-4a1f9c"
    regular = tmp_path / "secret.txt"
    regular.write_text(secret)
    fifo = tmp_path / "secret.fifo"
    os.mkfifo(fifo)
    return secret, regular, fifo


def hostile_documents(regular, fifo) -> dict[str, tuple[str, str]]:
    laughs = "".join(f'<!ENTITY l{k} "{f"&l{k - 1};" * 10}">' for k in range(1, 10))
    return {
        "billion laughs": (
            f'<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY l0 "lol">{laughs}]><svg {NS}><text>&l9;</text></svg>',
            "forbidden_entity",
        ),
        "external entity (file)": (
            f'<!DOCTYPE svg [<!ENTITY x SYSTEM "file://{regular}">]><svg {NS}><text>&x;</text></svg>',
            "forbidden_entity",
        ),
        "external entity (fifo)": (
            f'<!DOCTYPE svg [<!ENTITY x SYSTEM "{fifo}">]><svg {NS}><text>&x;</text></svg>',
            "forbidden_entity",
        ),
        "image file URI": (
            svg(f'<image href="file://{regular}" width="50" height="50"/>'),
            "external_reference",
        ),
        "image fifo path": (
            svg(f'<image xlink:href="{fifo}" width="50" height="50"/>'),
            "external_reference",
        ),
        "use file URI": (svg(f'<use href="file://{fifo}#a"/>'), "external_reference"),
        "css import": (
            svg(f"<style>@import url(file://{fifo});</style><rect width='9' height='9'/>"),
            "external_reference",
        ),
        "fill url": (svg(f'<rect width="9" height="9" fill="url(file://{fifo}#g)"/>'), "external_reference"),
        "width 100000": (svg('<rect width="5" height="5"/>', 'width="100000" height="100000"'), "too_large"),
        "10000-deep nesting": (
            svg("<g>" * 10_000 + '<rect width="5" height="5"/>' + "</g>" * 10_000),
            "too_deep",
        ),
        "10 MB path": (svg(f'<path d="M0 0 {"L1 1 " * 2_000_000}"/>'), "too_large"),
        "use bomb": (
            svg(
                '<g id="a0"><rect width="1" height="1"/></g>'
                + "".join(f'<g id="a{k}">' + f'<use href="#a{k - 1}"/>' * 10 + "</g>" for k in range(1, 9))
            ),
            "too_many_elements",
        ),
        "use cycle": (svg('<g id="a"><use href="#a"/></g>'), "reference_cycle"),
        "truncated": (SCENE[:-10], "parse_error"),
        "blank": (svg('<rect width="100" height="100" fill="white"/>'), "blank"),
    }


@pytest.mark.parametrize("backend", ["cairosvg", "skia"])
def test_hostile_batch_is_handled_without_reading_files(pool, secret_files, backend):
    secret, regular, fifo = secret_files
    hostile = hostile_documents(regular, fifo)
    documents = [SCENE]
    for document, _ in hostile.values():
        documents += [document]
    documents.append(SCENE)
    start = time.perf_counter()
    results = pool.render(documents, 32, 32, backend, limits=RenderLimits(timeout=3.0))
    assert time.perf_counter() - start < 10.0
    assert results[0].ok and results[-1].ok
    for (name, (_, expected)), result in zip(hostile.items(), results[1:-1]):
        assert result.error == expected, (name, result.error, result.detail)
        assert result.image is None
        assert secret not in result.detail


def test_cairosvg_url_fetcher_refuses_files_even_without_sanitising(secret_files):
    """Defence in depth: the fetcher handed to cairosvg refuses anything but vetted data URIs."""
    secret, regular, _ = secret_files
    fetch = _make_fetcher(RenderLimits())
    for url in (f"file://{regular}", "http://127.0.0.1/x.png", str(regular)):
        with pytest.raises(PermissionError):
            fetch(url, "image/*")
    unsanitised = svg(f'<image xlink:href="file://{regular}" width="50" height="50"/>')
    with pytest.raises(PermissionError) as info:
        _rasterize_cairosvg(unsanitised, 16, 16, RenderLimits())
    assert secret not in str(info.value)
