"""Scenes: SVG text, rasterisation, seeded layouts and GenEval's relative-position rule."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

from genalign.toy.scenes import (
    COLOURS,
    GAP,
    MARGIN,
    PALETTE,
    SHAPES,
    Scene,
    SceneObject,
    layout_objects,
    min_palette_distance,
    relative_position,
    render_scene,
    render_scenes,
    sample_scene,
)


def test_palette_is_separable():
    assert len(COLOURS) >= 6
    assert min_palette_distance() > 0.4
    # every colour is far from white in its strongest channel (the verifier's "ink")
    assert all(1 - min(rgb) >= 0.9 for rgb in PALETTE.values())


def test_svg_is_well_formed_and_in_pixels():
    scene = Scene(
        (
            SceneObject("circle", "red", 0.25, 0.25, 0.2),
            SceneObject("square", "blue", 0.75, 0.25, 0.2),
            SceneObject("triangle", "green", 0.25, 0.75, 0.2),
            SceneObject("diamond", "black", 0.75, 0.75, 0.2),
        )
    )
    root = ET.fromstring(scene.to_svg(size=100))
    assert root.get("width") == "100" and root.get("viewBox") == "0 0 100 100"
    tags = [child.tag.split("}")[1] for child in root]
    assert tags == ["rect", "circle", "rect", "polygon", "polygon"]  # background first
    circle = root[1]
    assert (circle.get("cx"), circle.get("cy"), circle.get("r")) == ("25.00", "25.00", "10.00")
    assert circle.get("fill") == "#e61a1a"
    triangle = root[3].get("points").split()
    assert triangle == ["25.00,65.00", "35.00,85.00", "15.00,85.00"]  # apex up, base = height = 20 px


@pytest.mark.parametrize("backend", ["cairosvg", "skia"])
def test_render_colours_and_geometry(backend):
    pytest.importorskip("skia") if backend == "skia" else None
    scene = Scene((SceneObject("square", "blue", 0.5, 0.5, 0.5),))
    image = render_scene(scene, size=32, backend=backend)
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert 0 <= image.min() and image.max() <= 1
    torch.testing.assert_close(image[:, 16, 16], torch.tensor(PALETTE["blue"]), atol=1 / 255, rtol=0)
    torch.testing.assert_close(image[:, 2, 2], torch.ones(3))
    inside = (image[0] < 0.5).float().sum()  # the square covers 16 x 16 pixels exactly
    assert inside == 256


def test_backends_agree():
    pytest.importorskip("skia")
    scenes = [sample_scene(seed) for seed in range(8)]
    reference, fast = render_scenes(scenes, 48, "cairosvg"), render_scenes(scenes, 48, "skia")
    difference = (reference - fast).abs()
    assert difference.mean() < 0.005 and (difference > 0.1).float().mean() < 0.01


def test_sampling_is_deterministic():
    assert sample_scene(7) == sample_scene(7)
    assert sample_scene(np.random.default_rng(7)) == sample_scene(7)
    assert sample_scene(7) != sample_scene(8)
    scene = sample_scene(3)
    assert Scene.from_dict(scene.to_dict()) == scene


def test_layouts_fit_and_keep_apart():
    rng = np.random.default_rng(0)
    for _ in range(200):
        count = int(rng.integers(1, 5))
        items = [(str(rng.choice(SHAPES)), str(rng.choice(COLOURS))) for _ in range(count)]
        scene = layout_objects(rng, items)
        assert [(o.shape, o.colour) for o in scene.objects] == items
        for i, obj in enumerate(scene.objects):
            x0, y0, x1, y1 = obj.box
            assert min(x0, y0) >= MARGIN - 1e-6 and max(x1, y1) <= 1 - MARGIN + 1e-6
            for other in scene.objects[i + 1 :]:
                a, b = obj.box, other.box
                apart = max(b[0] - a[2], a[0] - b[2], b[1] - a[3], a[1] - b[3])
                assert apart >= GAP - 1e-3


def test_layout_with_relation():
    for seed in range(50):
        scene = layout_objects(seed, [("circle", "red"), ("square", "blue")], relation=(0, "above", 1))
        circle, square = scene.objects
        assert "above" in relative_position(circle.box, square.box)
        assert circle.y < square.y


def test_relative_position_follows_geneval():
    # GenEval: offset shrunk by 0.1 x (summed sizes), divided by the raw offset's length
    box_b = (0, 0, 10, 10)
    assert relative_position((20, 0, 30, 10), box_b) == {"right of"}  # dx = (20 - 2) / 20 = 0.9
    assert relative_position((-20, 0, -10, 10), box_b) == {"left of"}
    assert relative_position((0, -20, 10, -10), box_b) == {"above"}  # y points down
    assert relative_position((0, 20, 10, 30), box_b) == {"below"}
    assert relative_position((1, 1, 11, 11), box_b) == set()  # within the margin: no relation
    # a diagonal offset of (20, 20): components (20 - 2) / 28.28 = 0.64 > 0.5 -> two relations
    assert relative_position((20, 20, 30, 30), box_b) == {"right of", "below"}
    # (20, 12): dx = 18 / 23.3 = 0.77, dy = 10 / 23.3 = 0.43 -> right of only
    assert relative_position((20, 12, 30, 22), box_b) == {"right of"}


def test_invalid_objects_rejected():
    with pytest.raises(ValueError, match="shape"):
        SceneObject("hexagon", "red", 0.5, 0.5, 0.2)
    with pytest.raises(ValueError, match="colour"):
        SceneObject("circle", "pink", 0.5, 0.5, 0.2)
    with pytest.raises(ValueError, match="backend"):
        render_scene(sample_scene(0), backend="inkscape")
