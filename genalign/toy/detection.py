"""ShapesEval's detector: read a toy-world scene back from pixels (see :mod:`genalign.toy.shapes_eval`
for the checks and the measured accuracy).

Detection (:func:`detect_objects`), on an image ``[3, H, W]`` in [0, 1]:

1. White balance: divide by the median border colour (undoes global colour casts), then smooth
   with a small Gaussian (``smoothing`` px) against noise and JPEG blocking.
2. Ink: ``1 - min(r, g, b)``, how far a pixel is from white in its strongest channel; every
   palette colour has ink >= 0.9. Foreground = ink above ``foreground_threshold``; objects are
   its 8-connected components (``scipy.ndimage.label``) larger than ``min_area``.
3. Colour, white-blend aware: a pixel ``p`` drawn in colour ``c`` with coverage ``a`` (anti-
   aliasing, blur) is ``1 - p = a (1 - c)``, so for each palette colour the coverage ``a`` is
   fitted by least squares (clipped to [0, 1]) and the colour with the smallest residual wins.
   An object's colour is that of the mean of its core pixels (the most-inked ones); it is
   ``None`` when the residual exceeds ``colour_tolerance`` or the fitted coverage is below
   ``min_coverage`` (off-palette colours such as pink are not read as a faint red). A component
   whose core has two colours with a large share each is split by colour (touching objects).
4. Shape, at sub-pixel precision: the object's ink, normalised by its own peak, is upsampled
   ``upsample`` x bilinearly and thresholded at one half (the true outline of an anti-aliased
   or blurred edge). From that mask (:func:`classify_shape`): the vertical offset of the
   centroid from the box centre in box heights (an apex-up triangle +1/6, every other shape 0),
   the fill ratio of the bounding box (square 1, circle pi/4, triangle and diamond 1/2) and the
   width along the diagonals over the width along the axes (square sqrt 2, circle 1, diamond
   1/sqrt 2; straight edges stay put under blur while corners round off, so this ratio holds up
   where the fill ratio drifts), plus aspect ratio and solidity (area over convex-hull area)
   to turn away what is no toy-world shape. Such shapes are ``None``, as are components that
   touch the image border or cover more than ``max_area`` of it (a canvas painted red is not
   "a red square").

"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from scipy import ndimage

from genalign.toy.scenes import PALETTE, POSITION_THRESHOLD, json_record

_COLOUR_NAMES = tuple(PALETTE)
_INK = 1.0 - np.array([PALETTE[name] for name in _COLOUR_NAMES])  # (K, 3): each colour's ink on white
_INK_NORM2 = (_INK**2).sum(axis=1)  # (K,)
_EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)


@dataclass(frozen=True)
class ShapesEvalConfig:
    """Thresholds of the detector (module docstring, steps 1-4), set on renders at 48 and 64 px
    with and without blur, noise, JPEG and colour shifts.

    Attributes:
        smoothing: Gaussian sigma in pixels applied before thresholding.
        foreground_threshold: ink (``1 - min(r, g, b)``) above which a pixel is foreground.
        min_area: smallest object, fraction of the image (the smallest toy object is about 0.016).
        max_area: largest object, fraction of the image (the largest is about 0.13).
        upsample: factor of the bilinear upsampling used to measure shapes.
        colour_tolerance: largest residual of the white-blend colour fit (RGB units).
        min_coverage: smallest fitted coverage of an object's core for its colour to count.
        split_share: share of a component's core a second colour needs to split the component.
        position_threshold: GenEval's margin for relations, in summed box sizes.
        aspect_range: accepted width / height of a shape.
        min_solidity: smallest area / convex-hull area of a shape.
        triangle_offset: centroid offset (box heights) beyond which a shape is a triangle, and
            below which (in magnitude) it is centred.
        diamond_roundness: ``fill + diagonal`` below this is a diamond ...
        circle_roundness: ... below this a circle, above it a square.
    """

    smoothing: float = 0.5
    foreground_threshold: float = 0.3
    min_area: float = 0.004
    max_area: float = 0.3
    upsample: int = 4
    colour_tolerance: float = 0.15
    min_coverage: float = 0.6
    split_share: float = 0.2
    position_threshold: float = POSITION_THRESHOLD
    aspect_range: tuple[float, float] = (0.75, 1.33)
    min_solidity: float = 0.88
    triangle_offset: float = 0.045
    diamond_roundness: float = 1.70
    circle_roundness: float = 1.92


@dataclass
class DetectedObject:
    """One object read from pixels.

    Attributes:
        shape: a name from ``scenes.SHAPES``, or None when no class fits.
        colour: a name from ``scenes.PALETTE``, or None when no colour fits.
        box: sub-pixel bounding box ``(x0, y0, x1, y1)`` in pixels of the image, y down.
        area: area as a fraction of the image.
        rgb: mean colour of the object's core (after white balance).
        features: the measurements behind shape and colour (``fill``, ``aspect``, ``offset``,
            ``solidity``, ``diagonal``, ``size`` in pixels, ``colour_residual``, ``coverage``).
    """

    shape: str | None
    colour: str | None
    box: tuple[float, float, float, float]
    area: float
    rgb: tuple[float, float, float]
    features: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return json_record(self, "shape", "colour", "box", "area", "rgb", "features")


# -- pixels ------------------------------------------------------------------------------------------


def _as_hwc(image: torch.Tensor | np.ndarray) -> np.ndarray:
    """``[3, H, W]`` tensor or array in [0, 1] -> float64 ``(H, W, 3)``."""
    if torch.is_tensor(image):
        image = image.detach().float().cpu().numpy()
    array = np.asarray(image, dtype=np.float64)
    if array.ndim != 3 or array.shape[0] != 3:
        raise ValueError(f"expected an image [3, H, W], got shape {array.shape}")
    return np.clip(array.transpose(1, 2, 0), 0.0, 1.0)


def _white_balance(pixels: np.ndarray) -> np.ndarray:
    """Divide by the median border colour when it is whitish (a global cast), else leave as is."""
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])  # (N, 3)
    background = np.median(border, axis=0)
    if background.min() < 0.6:
        return pixels
    return np.clip(pixels / background, 0.0, 1.0)


def _fit_colours(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """White-blend fit of every palette colour to every pixel.

    ``1 - p = a (1 - c)``: ``a`` by least squares, clipped to [0, 1]. Returns for ``(..., 3)``
    pixels the best colour index ``(...)``, its residual ``(...)`` and its coverage ``(...)``.
    """
    ink = 1.0 - pixels  # (..., 3)
    dot = ink @ _INK.T  # (..., K)
    coverage = np.clip(dot / _INK_NORM2, 0.0, 1.0)  # (..., K)
    # |ink - a c|^2 = |ink|^2 - 2 a <ink, c> + a^2 |c|^2
    squared = (ink**2).sum(axis=-1, keepdims=True) - 2 * coverage * dot + coverage**2 * _INK_NORM2
    residual = np.sqrt(np.maximum(squared, 0.0))  # (..., K)
    best = residual.argmin(axis=-1)
    take = np.expand_dims(best, -1)
    return (
        best,
        np.take_along_axis(residual, take, -1)[..., 0],
        np.take_along_axis(coverage, take, -1)[..., 0],
    )


def _quantile(values: np.ndarray, q: float) -> float:
    """The ``q`` quantile (lower order statistic) of a 1-D array, by partial sort."""
    k = int(q * (len(values) - 1))
    return float(np.partition(values, k)[k])


# -- shape ---------------------------------------------------------------------------------------------


def _convex_hull(points: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Convex hull of points sorted lexicographically (Andrew's monotone chain), counter-clockwise."""
    chains = []
    for ordered in (points, points[::-1]):
        chain: list[tuple[int, int]] = []
        for x, y in ordered:
            # pop while the last two points and this one do not turn counter-clockwise
            while len(chain) >= 2 and (
                (chain[-1][0] - chain[-2][0]) * (y - chain[-2][1])
                - (chain[-1][1] - chain[-2][1]) * (x - chain[-2][0])
                <= 0
            ):
                chain.pop()
            chain.append((x, y))
        chains.append(chain[:-1])
    return chains[0] + chains[1]


def _solidity(mask: np.ndarray, stride: int = 1) -> float:
    """Pixel count over the area of the convex hull of the pixels (about 1 for convex shapes).

    The hull of pixel centres misses half a pixel all round: add half its perimeter and one
    pixel (Pick's theorem) so that a rasterised convex shape scores 1. The hull is taken over the
    ends of every ``stride``-th row (and the last), which lowers it by a sliver at most.
    """
    rows = np.nonzero(mask.any(axis=1))[0]
    if len(rows) < 2:
        return 0.0
    rows = np.unique(np.concatenate([rows[::stride], rows[-1:]]))  # a few rows suffice for the hull
    left = mask[rows].argmax(axis=1)
    right = mask.shape[1] - 1 - mask[rows, ::-1].argmax(axis=1)
    # the ends of each row span the same hull as all the pixels
    points = sorted(set(zip(rows.tolist(), left.tolist())) | set(zip(rows.tolist(), right.tolist())))
    hull = np.array(_convex_hull(points), dtype=float)  # (V, 2)
    if len(hull) < 3:
        return 0.0
    following = np.roll(hull, -1, axis=0)
    area = abs(np.sum(hull[:, 0] * following[:, 1] - following[:, 0] * hull[:, 1])) / 2  # shoelace
    perimeter = np.linalg.norm(following - hull, axis=1).sum()
    return float(mask.sum() / (area + perimeter / 2 + 1))


@functools.lru_cache(maxsize=512)
def _upsampling_matrix(length: int, factor: int) -> np.ndarray:
    """``(length * factor, length)`` bilinear interpolation between pixel centres, zero outside:
    ``A_h @ image @ A_w.T`` equals ``scipy.ndimage.zoom(image, factor, order=1, grid_mode=True,
    mode="grid-constant")`` at a fraction of its cost."""
    position = (np.arange(length * factor) + 0.5) / factor - 0.5  # output centres, input pixel units
    low = np.floor(position).astype(int)
    weight = position - low
    matrix = np.zeros((length * factor, length))
    rows = np.arange(length * factor)
    inside = low >= 0
    matrix[rows[inside], low[inside]] = 1 - weight[inside]
    inside = low + 1 < length
    matrix[rows[inside], low[inside] + 1] += weight[inside]
    return matrix


def _shape_features(alpha: np.ndarray, factor: int) -> tuple[dict[str, float], tuple[float, ...]] | None:
    """Features of the object whose normalised ink ``alpha (h, w)`` is given, and its sub-pixel
    box ``(x0, y0, x1, y1)`` in crop pixels; None when nothing survives the threshold."""
    height, width = alpha.shape
    up = _upsampling_matrix(height, factor) @ alpha @ _upsampling_matrix(width, factor).T  # (h*f, w*f)
    mask = up > 0.5
    if not mask.any():
        return None
    rows, cols = np.nonzero(mask)
    y0, y1, x0, x1 = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    height, width = (y1 - y0) / factor, (x1 - x0) / factor
    area = mask.sum() / factor**2
    centre_y = (rows.mean() + 0.5) / factor
    # widths along the two diagonals over widths along the axes: square sqrt 2, circle 1,
    # triangle 1.06, diamond 1 / sqrt 2; blur rounds corners but leaves straight edges in place
    diagonals = [cols + rows, cols - rows]  # projections * sqrt 2, in upsampled pixels
    diagonal_width = sum(d.max() - d.min() + 2 for d in diagonals) / (2 * np.sqrt(2) * factor)
    features = {
        "fill": float(area / (height * width)),
        "aspect": float(width / height),
        "offset": float((centre_y - (y0 + y1) / (2 * factor)) / height),
        "solidity": _solidity(mask, stride=factor),
        "diagonal": float(diagonal_width / ((height + width) / 2)),
        "size": float(max(height, width)),
    }
    return features, (x0 / factor, y0 / factor, x1 / factor, y1 / factor)


def classify_shape(features: dict[str, float], config: ShapesEvalConfig) -> str | None:
    """Shape class from the features of :func:`_shape_features`, or None when none fits.

    An apex-up triangle is the only shape whose centroid sits below its box centre. The centred
    shapes are ordered by ``fill + diagonal`` (roundness: diamond about 1.4, circle 1.8, square
    2.3 on clean renders; blur pulls diamond and square towards the circle, so the cuts sit where
    the classes stay apart at Gaussian blur of 1 px), with loose per-class ranges of each feature
    so that shapes outside the toy world (ellipses, blobs, stars) are None rather than a guess.
    """
    low, high = config.aspect_range
    if not low <= features["aspect"] <= high or features["solidity"] < config.min_solidity:
        return None
    fill, diagonal, offset = features["fill"], features["diagonal"], features["offset"]
    if offset > config.triangle_offset:
        return "triangle" if fill <= 0.8 and 0.95 <= diagonal <= 1.15 else None
    if abs(offset) > config.triangle_offset:
        return None
    roundness = fill + diagonal
    if roundness < config.diamond_roundness:
        return "diamond" if fill <= 0.78 and diagonal <= 1.0 else None
    if roundness < config.circle_roundness:
        return "circle" if 0.7 <= fill <= 0.88 and 0.95 <= diagonal <= 1.12 else None
    return "square" if fill >= 0.82 and diagonal >= 1.08 else None


# -- detection ---------------------------------------------------------------------------------------


def _split_by_colour(
    mask: np.ndarray, core: np.ndarray, labels: np.ndarray, min_pixels: float, config: ShapesEvalConfig
) -> list[np.ndarray]:
    """One mask per object in a component: the component itself, or its colour regions when its
    core holds two or more colours with at least ``split_share`` of the core each."""
    counts = np.bincount(labels[core], minlength=len(_COLOUR_NAMES))
    major = np.nonzero(counts >= max(config.split_share * counts.sum(), 2))[0]
    if len(major) < 2:
        return [mask]
    pieces = []
    for colour in major:
        region = ndimage.binary_opening(mask & (labels == colour))  # drops 1-px seams of blends
        parts, count = ndimage.label(region, structure=_EIGHT_CONNECTED)
        sizes = np.bincount(parts.ravel())
        pieces += [parts == k for k in range(1, count + 1) if sizes[k] >= min_pixels]
    return pieces or [mask]


def _measure(
    mask: np.ndarray,
    ink: np.ndarray,
    pixels: np.ndarray,
    others: np.ndarray,
    origin: tuple[int, int],
    image_area: int,
    config: ShapesEvalConfig,
) -> DetectedObject | None:
    """Colour and shape of the object ``mask`` (crop coordinates, crop ``ink`` and ``pixels``;
    ``others`` marks foreground that belongs to other objects)."""
    peak = _quantile(ink[mask], 0.95)
    region = ndimage.binary_dilation(mask, iterations=2) & ~others  # own partial-coverage rim
    alpha = np.where(region, np.clip(ink / peak, 0.0, 1.0), 0.0)  # (h, w) coverage estimate
    measured = _shape_features(alpha, config.upsample)
    if measured is None:
        return None
    features, (x0, y0, x1, y1) = measured
    core = mask & (alpha >= 0.85)
    if core.sum() < 1:
        core = mask & (alpha >= _quantile(alpha[mask], 0.75))
    rgb = pixels[core].mean(axis=0)  # (3,)
    best, residual, coverage = _fit_colours(rgb)
    colour_ok = residual <= config.colour_tolerance and coverage >= config.min_coverage
    features |= {"colour_residual": float(residual), "coverage": float(coverage)}
    top, left = origin
    return DetectedObject(
        shape=classify_shape(features, config),
        colour=_COLOUR_NAMES[int(best)] if colour_ok else None,
        box=(float(left + x0), float(top + y0), float(left + x1), float(top + y1)),
        area=float(alpha.sum() / image_area),
        rgb=tuple(float(v) for v in rgb),
        features=features,
    )


def detect_objects(
    image: torch.Tensor | np.ndarray, config: ShapesEvalConfig | None = None
) -> list[DetectedObject]:
    """Objects in one image ``[3, H, W]`` in [0, 1], largest first (see the module docstring)."""
    config = config or ShapesEvalConfig()
    pixels = _white_balance(_as_hwc(image))  # (H, W, 3)
    if config.smoothing > 0:
        pixels = ndimage.gaussian_filter(pixels, sigma=(config.smoothing, config.smoothing, 0))
    height, width = pixels.shape[:2]
    ink = 1.0 - pixels.min(axis=-1)  # (H, W)
    foreground = ink > config.foreground_threshold
    components, _ = ndimage.label(foreground, structure=_EIGHT_CONNECTED)
    colour_labels = np.zeros((height, width), dtype=np.int64)  # (H, W), set on the foreground
    colour_labels[foreground] = _fit_colours(pixels[foreground])[0]
    min_pixels = config.min_area * height * width
    objects = []
    for index, window in enumerate(ndimage.find_objects(components), start=1):
        if window is None:
            continue
        pad = 3
        top, left = max(window[0].start - pad, 0), max(window[1].start - pad, 0)
        crop = (slice(top, window[0].stop + pad), slice(left, window[1].stop + pad))
        mask = components[crop] == index
        if mask.sum() < min_pixels:
            continue
        crop_ink = ink[crop]
        core = mask & (crop_ink >= 0.75 * _quantile(crop_ink[mask], 0.95))
        # toy-world objects lie inside the canvas and are small; anything else is kept as an
        # object of no shape, so painting the canvas one colour is not "a red square"
        unshaped = mask.sum() > config.max_area * height * width or (
            window[0].start == 0
            or window[1].start == 0
            or window[0].stop == height
            or window[1].stop == width
        )
        for piece in _split_by_colour(mask, core, colour_labels[crop], min_pixels, config):
            others = foreground[crop] & ~piece
            found = _measure(piece, crop_ink, pixels[crop], others, (top, left), height * width, config)
            if found is not None:
                if unshaped:
                    found.shape = None
                objects.append(found)
    return sorted(objects, key=lambda obj: -obj.area)


@dataclass(frozen=True)
class SceneComparison:
    """How the objects read from an image compare with those read from its target.

    Attributes:
        match: both hold the same multiset of (shape, colour); positions are not compared
            (ShapesEval's relation checks do that).
        extra: how many more objects the image holds than the target (at least 0).
    """

    match: bool
    extra: int


def scene_objects(
    image: torch.Tensor | np.ndarray, config: ShapesEvalConfig | None = None
) -> list[tuple[str, str]]:
    """The (shape, colour) pairs :func:`detect_objects` reads from ``image``, sorted; an unread
    shape or colour is ``"?"``."""
    return sorted((o.shape or "?", o.colour or "?") for o in detect_objects(image, config))


def compare_objects(found: list[tuple[str, str]], wanted: list[tuple[str, str]]) -> SceneComparison:
    """Two :func:`scene_objects` results, an image's and its target's."""
    return SceneComparison(found == wanted, max(0, len(found) - len(wanted)))


def compare_scenes(
    image: torch.Tensor | np.ndarray,
    target: torch.Tensor | np.ndarray,
    config: ShapesEvalConfig | None = None,
) -> SceneComparison:
    """Objects of ``image`` against those of ``target`` (both ``[3, H, W]`` in [0, 1])."""
    return compare_objects(scene_objects(image, config), scene_objects(target, config))
