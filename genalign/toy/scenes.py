"""Scenes of the toy world: 1-4 flat coloured shapes on white, written as SVG and rasterised.

The toy world (DESIGN.md, "The offline world") stands in for photographs so that a verifier can
read the scene back from pixels exactly (``shapes_eval.py``). A :class:`Scene` is a tuple of
:class:`SceneObject` s, each ``(shape, colour, x, y, size)``:

- ``shape`` in :data:`SHAPES` -- ``circle``, ``square`` (axis-aligned), ``triangle`` (isosceles,
  apex up, base = height = size) and ``diamond`` (a square standing on a corner, both diagonals =
  size). No rotations: the verifier tells triangle from diamond by where the mass sits.
- ``colour`` in :data:`PALETTE`: seven saturated colours named as in GenEval (Ghosh et al. 2023)
  and chosen far apart in RGB (smallest pairwise distance 0.40); pink, brown and white are left
  out because pink is what red looks like blended with the white background, brown is dark
  orange and white is the background.
- ``x, y``: the centre of the object's bounding box as fractions of the canvas, ``y`` pointing
  down (SVG and image convention): ``(0, 0)`` is the top-left corner.
- ``size``: the side of the object's (square) bounding box as a fraction of the canvas side.

Geometry is in fractions of the canvas, so one scene renders at any resolution;
``scene.to_svg(64)`` writes pixel coordinates for a 64 x 64 canvas. Relative positions follow
GenEval's rule (:func:`relative_position`), shared by the scene sampler and the verifier.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond")

# Fill colours as RGB in [0, 1]. Every colour has a channel at or below 0.1, so each one is at
# least 0.9 away from white in its strongest channel (the verifier's "ink" measure).
PALETTE: dict[str, tuple[float, float, float]] = {
    "red": (0.90, 0.10, 0.10),
    "orange": (1.00, 0.50, 0.00),
    "yellow": (1.00, 0.90, 0.10),
    "green": (0.10, 0.65, 0.15),
    "blue": (0.10, 0.25, 0.95),
    "purple": (0.55, 0.10, 0.75),
    "black": (0.10, 0.10, 0.10),
}
COLOURS: tuple[str, ...] = tuple(PALETTE)
BACKGROUND: tuple[float, float, float] = (1.0, 1.0, 1.0)

RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
POSITION_THRESHOLD = 0.1  # GenEval's default ``position_threshold``
RENDER_BACKENDS = ("cairosvg", "skia")

Box = tuple[float, float, float, float]  # (x0, y0, x1, y1), y down


def hex_colour(rgb: Sequence[float]) -> str:
    """``(r, g, b)`` in [0, 1] -> ``"#rrggbb"``."""
    return "#" + "".join(f"{round(255 * float(c)):02x}" for c in rgb)


@dataclass(frozen=True)
class SceneObject:
    """One flat shape. ``x, y`` (bounding-box centre) and ``size`` (bounding-box side) are
    fractions of the canvas; ``y`` points down."""

    shape: str
    colour: str
    x: float
    y: float
    size: float

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; shapes are {SHAPES}")
        if self.colour not in PALETTE:
            raise ValueError(f"unknown colour {self.colour!r}; colours are {COLOURS}")
        if not 0 < self.size <= 1:
            raise ValueError(f"size must be in (0, 1], got {self.size}")

    @property
    def box(self) -> Box:
        """Bounding box ``(x0, y0, x1, y1)`` in canvas fractions."""
        half = self.size / 2
        return (self.x - half, self.y - half, self.x + half, self.y + half)

    def svg_element(self, canvas: int) -> str:
        """The SVG element drawing this object on a ``canvas`` x ``canvas`` pixel grid."""
        x, y, half = self.x * canvas, self.y * canvas, self.size * canvas / 2
        fill = hex_colour(PALETTE[self.colour])
        if self.shape == "circle":
            return f'<circle cx="{x:.2f}" cy="{y:.2f}" r="{half:.2f}" fill="{fill}"/>'
        if self.shape == "square":
            side = 2 * half
            return f'<rect x="{x - half:.2f}" y="{y - half:.2f}" width="{side:.2f}" height="{side:.2f}" fill="{fill}"/>'
        points = " ".join(f"{px:.2f},{py:.2f}" for px, py in polygon_corners(self.shape, x, y, half))
        return f'<polygon points="{points}" fill="{fill}"/>'


def json_record(obj: Any, *names: str) -> dict[str, Any]:
    """``{name: obj.name}`` for each of ``names``, ready for JSON: tuples and lists become new lists
    and dicts are copied (shallowly), so the record shares no container with ``obj``."""
    record = {}
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, (tuple, list)):
            value = list(value)
        elif isinstance(value, dict):
            value = dict(value)
        record[name] = value
    return record


def polygon_corners(shape: str, x: float, y: float, half: float) -> list[tuple[float, float]]:
    """The corners of a ``"triangle"`` (apex up) or ``"diamond"`` centred at ``(x, y)`` whose
    bounding box has half-side ``half``, in SVG order."""
    if shape == "triangle":
        return [(x, y - half), (x + half, y + half), (x - half, y + half)]
    if shape == "diamond":
        return [(x, y - half), (x + half, y), (x, y + half), (x - half, y)]
    raise ValueError(f"{shape!r} is not a polygon shape (triangle, diamond)")


@dataclass(frozen=True)
class Scene:
    """A toy-world image: objects drawn in order on a white canvas."""

    objects: tuple[SceneObject, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "objects", tuple(self.objects))

    def __len__(self) -> int:
        return len(self.objects)

    def to_svg(self, size: int = 64) -> str:
        """SVG text for a ``size`` x ``size`` pixel canvas (coordinates in pixels)."""
        body = "".join(obj.svg_element(size) for obj in self.objects)
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size}" '
            f'viewBox="0 0 {size} {size}"><rect width="{size}" height="{size}" '
            f'fill="{hex_colour(BACKGROUND)}"/>{body}</svg>'
        )

    def to_dict(self) -> dict[str, Any]:
        return {"objects": [vars(obj).copy() for obj in self.objects]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scene:
        return cls(tuple(SceneObject(**obj) for obj in data["objects"]))


# -- rasterisation -------------------------------------------------------------------------------


def _rasterize_cairosvg(svg: str, size: int) -> np.ndarray:
    """cairosvg straight to a cairo surface (no PNG round trip, as ``rewards/svg/render.py``)."""
    from cairosvg.parser import Tree
    from cairosvg.surface import PNGSurface

    surface = PNGSurface(
        Tree(bytestring=svg.encode("utf-8")), None, 96, output_width=size, output_height=size
    )
    cairo_surface = surface.cairo
    cairo_surface.flush()
    stride = cairo_surface.get_stride()
    data = np.frombuffer(cairo_surface.get_data(), dtype=np.uint8).reshape(size, stride // 4, 4)[:, :size]
    # ARGB32 in native byte order (B, G, R, A on little-endian); the opaque background makes the
    # premultiplied colours equal the straight ones
    return (data[..., 2::-1] if sys.byteorder == "little" else data[..., 1:4]).copy()


def _rasterize_skia(svg: str, size: int) -> np.ndarray:
    import skia

    dom = skia.SVGDOM.MakeFromStream(skia.MemoryStream(svg.encode("utf-8"), True))
    dom.setContainerSize(skia.Size(size, size))
    surface = skia.Surface(size, size)
    with surface as canvas:
        canvas.clear(skia.ColorWHITE)
        dom.render(canvas)
    rgba = surface.makeImageSnapshot().toarray(colorType=skia.kRGBA_8888_ColorType)
    return rgba[..., :3]


def render_scene(scene: Scene, size: int = 64, backend: str = "cairosvg") -> torch.Tensor:
    """Rasterise ``scene.to_svg(size)``: float32 ``[3, size, size]`` in [0, 1] (uint8-exact).

    Scenes are our own trusted SVG, so they are drawn in this process without the sandbox of
    ``genalign.rewards.svg.render``. ``backend``: ``"cairosvg"`` (the reference) or ``"skia"``
    (skia-python, about 10x faster at 64 px; identical interiors, edges within a few levels).
    """
    if backend not in RENDER_BACKENDS:
        raise ValueError(f"backend must be one of {RENDER_BACKENDS}, got {backend!r}")
    rasterize = _rasterize_cairosvg if backend == "cairosvg" else _rasterize_skia
    pixels = rasterize(scene.to_svg(size), size)  # (H, W, 3) uint8
    return torch.from_numpy(np.array(pixels, dtype=np.uint8)).permute(2, 0, 1).float() / 255.0


def render_scenes(scenes: Sequence[Scene], size: int = 64, backend: str = "cairosvg") -> torch.Tensor:
    """Rasterise a batch: ``[B, 3, size, size]`` in [0, 1]."""
    if not scenes:
        return torch.empty(0, 3, size, size)
    return torch.stack([render_scene(scene, size, backend) for scene in scenes])


# -- relative position (GenEval) -------------------------------------------------------------------


def relative_position(
    box_a: Sequence[float], box_b: Sequence[float], threshold: float = POSITION_THRESHOLD, cutoff: float = 0.5
) -> set[str]:
    """Relations of A to B by GenEval's rule (Ghosh et al. 2023, ``evaluate_images.py``).

    The offset between bounding-box centres is shrunk towards zero by ``threshold`` times the
    summed box sizes on each axis, then divided by the length of the raw offset; A is "left of" B
    when that x component is below ``-cutoff``, "right of" when above ``cutoff``, and "above" /
    "below" likewise on y (y points down). Objects closer than the margin have no relation;
    a diagonal offset can give two. Boxes are ``(x0, y0, x1, y1)`` in any one unit.
    """
    a, b = np.asarray(box_a, dtype=float), np.asarray(box_b, dtype=float)
    offset = (a[:2] + a[2:]) / 2 - (b[:2] + b[2:]) / 2  # (dx, dy)
    dims = (a[2:] - a[:2]) + (b[2:] - b[:2])
    revised = np.maximum(np.abs(offset) - threshold * dims, 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    relations = set()
    if dx < -cutoff:
        relations.add("left of")
    if dx > cutoff:
        relations.add("right of")
    if dy < -cutoff:
        relations.add("above")
    if dy > cutoff:
        relations.add("below")
    return relations


# -- random layouts ---------------------------------------------------------------------------------

MIN_SIZE = 0.18
MAX_SIZE = {1: 0.36, 2: 0.34, 3: 0.28, 4: 0.25}  # largest object for a scene of n objects
MARGIN = 0.03  # empty border around the canvas, fraction of the side
GAP = 0.06  # smallest gap between two bounding boxes
# The sampler draws "A <relation> B" only when it holds with twice GenEval's margin and a
# clearly dominant direction, so the verifier's reading of it is not a coin flip.
SAMPLER_POSITION_THRESHOLD = 2 * POSITION_THRESHOLD
SAMPLER_POSITION_CUTOFF = 0.7


def as_generator(rng: int | np.random.Generator | None) -> np.random.Generator:
    """A seed (or None) or a numpy Generator -> a numpy Generator."""
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def _boxes_apart(a: Box, b: Box, gap: float) -> bool:
    return a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1]


def place_object(
    rng: np.random.Generator,
    shape: str,
    colour: str,
    max_size: float,
    others: Sequence[SceneObject],
    attempts: int = 50,
) -> SceneObject | None:
    """One ``(shape, colour)`` object at a random size in ``[MIN_SIZE, max_size]`` and a random
    place inside the canvas margin, no closer than :data:`GAP` to any of ``others``; None when no
    draw of ``attempts`` fits."""
    for _ in range(attempts):
        size = float(rng.uniform(MIN_SIZE, max_size))
        low, high = MARGIN + size / 2, 1 - MARGIN - size / 2
        x, y = (float(v) for v in rng.uniform(low, high, size=2))
        candidate = SceneObject(shape, colour, round(x, 4), round(y, 4), round(size, 4))
        if all(_boxes_apart(candidate.box, other.box, GAP) for other in others):
            return candidate
    return None


def layout_objects(
    rng: int | np.random.Generator | None,
    items: Sequence[tuple[str, str]],
    relation: tuple[int, str, int] | None = None,
    max_attempts: int = 500,
) -> Scene:
    """Place ``(shape, colour)`` items at random sizes and positions, no two boxes closer than
    :data:`GAP`, all inside the canvas margin.

    ``relation = (i, "left of", j)`` additionally requires item i to stand in that relation to
    item j, with the sampler's stricter margin (:data:`SAMPLER_POSITION_THRESHOLD`, cutoff
    :data:`SAMPLER_POSITION_CUTOFF`). Rejection sampling; deterministic given ``rng``.
    """
    rng = as_generator(rng)
    count = len(items)
    if not 1 <= count <= 4:
        raise ValueError(f"a scene holds 1-4 objects, got {count}")
    max_size = MAX_SIZE[count]
    for _ in range(max_attempts):
        objects: list[SceneObject] = []
        for shape, colour in items:
            placed = place_object(rng, shape, colour, max_size, objects)
            if placed is None:
                break  # this object did not fit: start the layout again
            objects.append(placed)
        if len(objects) < count:
            continue
        if relation is not None:
            i, name, j = relation
            found = relative_position(
                objects[i].box, objects[j].box, SAMPLER_POSITION_THRESHOLD, SAMPLER_POSITION_CUTOFF
            )
            if name not in found:
                continue
        return Scene(tuple(objects))
    raise RuntimeError(f"could not lay out {count} objects (relation {relation}) in {max_attempts} attempts")


def sample_scene(
    rng: int | np.random.Generator | None,
    num_objects: int | None = None,
    shapes: Sequence[str] = SHAPES,
    colours: Sequence[str] = COLOURS,
) -> Scene:
    """A random scene of ``num_objects`` (default: uniform in 1-4) random shapes and colours."""
    rng = as_generator(rng)
    count = int(rng.integers(1, 5)) if num_objects is None else num_objects
    items = [(str(rng.choice(shapes)), str(rng.choice(colours))) for _ in range(count)]
    return layout_objects(rng, items)


def min_palette_distance() -> float:
    """Smallest RGB distance between two palette colours (0.40 for :data:`PALETTE`)."""
    values = list(PALETTE.values())
    return min(math.dist(a, b) for i, a in enumerate(values) for b in values[i + 1 :])
