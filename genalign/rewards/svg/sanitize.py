"""Sanitisation of untrusted SVG text before it reaches a renderer.

SVG written by a policy under RL (RLRF, Rodriguez et al. 2025, Sec. 3) is untrusted input: it can
declare entities (billion laughs), name local files or URLs (XXE, SSRF), nest ten thousand groups,
instance content exponentially through ``<use>``, or ask for a 100000-pixel canvas. This module
turns the text into a *canonical* document that renderers may see, or rejects it with a reason
code. Nothing here reads a file or opens a connection.

Policy (what passes):

- **Parsing**: ``defusedxml`` with DTDs, entities and external references forbidden; any
  ``<!DOCTYPE``/``<!ENTITY`` is rejected (``"forbidden_entity"``) before parsing.
- **References**: an ``href``/``xlink:href`` must be a same-document fragment (``#id``), except
  on ``<image>``, which must carry an inline raster ``data:image/{png,jpeg,gif,webp};base64,...``
  URI whose header decodes (PIL, no pixel decoding) to at most ``max_image_pixels`` pixels. Every
  CSS ``url(...)`` (attributes, ``style``, ``<style>``) must be a fragment; ``@import`` is refused.
  Anything else -- ``file:``, ``http(s):``, relative paths, ``data:image/svg+xml`` (a nested
  document would skip these checks), empty-looking tricks -- is ``"external_reference"``.
- **Size**: at most ``max_bytes`` of UTF-8 (``"too_large"``), ``max_elements`` elements after
  expanding ``<use>`` references (``"too_many_elements"``), tree height ``max_depth`` counting
  ``<use>`` expansion (``"too_deep"``), no ``<use>`` cycles (``"reference_cycle"``), and the root's
  declared ``width``/``height``/``viewBox`` at most ``max_declared_size`` user units
  (``"too_large"``).
- **Canonical output**: only SVG-namespace (or un-namespaced) elements; ``script``,
  ``foreignObject`` and foreign-namespace elements dropped; event handlers, ``xml:base`` and
  foreign attributes dropped; hrefs written as ``xlink:href`` (the spelling both cairosvg and
  Skia's SVGDOM read); comments, processing instructions and the prolog gone. The root gets the
  caller's pixel size as ``width``/``height`` and an explicit ``viewBox`` (the declared one, else
  ``0 0 width height`` from the declared size, else the output size), so every backend maps user
  space to pixels the same way and the declared size never chooses the canvas.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field

from defusedxml import DefusedXmlException
from defusedxml import ElementTree as DefusedET

SVG_NAMESPACE = "http://www.w3.org/2000/svg"
XLINK_NAMESPACE = "http://www.w3.org/1999/xlink"
XML_NAMESPACE = "http://www.w3.org/XML/1998/namespace"

REASONS = (
    "parse_error",
    "forbidden_entity",
    "external_reference",
    "too_large",
    "too_deep",
    "too_many_elements",
    "reference_cycle",
)
ALLOWED_IMAGE_TYPES = ("png", "jpeg", "jpg", "gif", "webp")
DROPPED_ELEMENTS = frozenset({"script", "foreignObject", "metadata"})
TEXT_ELEMENTS = frozenset({"text", "tspan", "textPath", "tref"})
FILTER_ELEMENTS = frozenset({"filter"})

_DTD_PATTERN = re.compile(rb"<!\s*(DOCTYPE|ENTITY|ELEMENT|ATTLIST|NOTATION)", re.IGNORECASE)
_CSS_URL_PATTERN = re.compile(r"url\(\s*(['\"]?)(.*?)\1\s*\)", re.IGNORECASE | re.DOTALL)
_CSS_IMPORT_PATTERN = re.compile(r"@import", re.IGNORECASE)
_CSS_OPACITY_PATTERN = re.compile(r"(?:^|[;{\s])opacity\s*:")
_DATA_IMAGE_PATTERN = re.compile(r"^data:image/([a-z0-9.+-]+)(;[^,]*)?,", re.IGNORECASE)
_LENGTH_PATTERN = re.compile(
    r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(px|pt|pc|mm|cm|in|em|ex|%)?\s*$"
)
# CSS pixels per unit at 96 dpi, the convention cairosvg uses (1em = 12pt = 16px)
_UNITS_TO_PX = {None: 1.0, "px": 1.0, "pt": 96 / 72, "pc": 16.0, "mm": 96 / 25.4, "cm": 96 / 2.54, "in": 96.0}
_UNITS_TO_PX.update(em=16.0, ex=8.0)


@dataclass(frozen=True)
class RenderLimits:
    """Caps applied to every SVG before and while it renders.

    Attributes:
        max_bytes: UTF-8 size of the SVG text.
        max_elements: elements in the document after expanding ``<use>`` references.
        max_depth: tree height, counting ``<use>`` expansion (cairosvg recurses per level).
        max_declared_size: bound on the root's declared width, height and viewBox numbers (user
            units); the output size is always the caller's.
        max_image_pixels: width x height of any embedded raster image.
        timeout: seconds one render may take in a worker before the worker is killed.
    """

    max_bytes: int = 1_000_000
    max_elements: int = 20_000
    max_depth: int = 100
    max_declared_size: float = 16_384.0
    max_image_pixels: int = 4096 * 4096
    timeout: float = 5.0

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_elements", "max_depth", "max_image_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"RenderLimits.{name} must be >= 1, got {getattr(self, name)}")
        if not self.max_declared_size > 0:
            raise ValueError(f"RenderLimits.max_declared_size must be > 0, got {self.max_declared_size}")
        if not self.timeout > 0:
            raise ValueError(f"RenderLimits.timeout must be > 0 seconds, got {self.timeout}")


class SVGRejected(ValueError):
    """An SVG that must not be rendered; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass
class SanitizedSVG:
    """A canonical SVG document, safe to hand to a renderer.

    Attributes:
        root: the canonical element tree (root ``<svg>`` sized to the output pixels).
        viewbox: the ``(min_x, min_y, width, height)`` put on the root.
        element_count: elements after ``<use>`` expansion.
        features: constructs renderers disagree on, found in the document (``"text"``,
            ``"image"``, ``"filter"``, ``"marker"``, ``"dash"``, ``"css_opacity"``, ``"use_opacity"``,
            ``"curve_bbox"``: a Bezier path painted through a ``url(...)``); backends use it to
            pick a fallback.
    """

    root: ET.Element
    viewbox: tuple[float, float, float, float]
    element_count: int
    features: set[str] = field(default_factory=set)

    def to_string(self) -> str:
        """Serialise the canonical tree (no prolog, UTF-8 text)."""
        return ET.tostring(self.root, encoding="unicode")


def check_size(svg: str | bytes, limits: RenderLimits) -> bytes:
    """Encode to UTF-8 and apply the byte cap (cheap; done before any parsing or IPC)."""
    if isinstance(svg, str):
        data = svg.encode("utf-8", errors="replace")
    elif isinstance(svg, bytes | bytearray):
        data = bytes(svg)
    else:
        raise SVGRejected("parse_error", f"expected SVG text, got {type(svg).__name__}")
    if len(data) > limits.max_bytes:
        raise SVGRejected("too_large", f"{len(data)} bytes > max_bytes={limits.max_bytes}")
    return data


def sanitize_svg(
    svg: str | bytes, width: int, height: int, limits: RenderLimits | None = None
) -> SanitizedSVG:
    """Parse, check and canonicalise ``svg`` for rendering at ``width`` x ``height`` pixels.

    Raises:
        SVGRejected: with the reason code when the document breaks the policy (module docstring).
    """
    limits = limits or RenderLimits()
    data = check_size(svg, limits)
    if _DTD_PATTERN.search(data):
        raise SVGRejected("forbidden_entity", "DTD declarations (DOCTYPE/ENTITY) are not allowed")
    try:
        source = DefusedET.fromstring(data, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except DefusedXmlException as error:
        raise SVGRejected("forbidden_entity", f"{type(error).__name__}: {error}") from None
    except ET.ParseError as error:
        raise SVGRejected("parse_error", f"XML: {error}") from None
    except (ValueError, RecursionError, MemoryError) as error:
        raise SVGRejected("parse_error", f"{type(error).__name__}: {error}") from None
    if _local_name(source.tag) != "svg" or _namespace(source.tag) not in ("", SVG_NAMESPACE):
        raise SVGRejected("parse_error", f"root element is {source.tag!r}, not svg")

    root, features = _canonical_tree(source, limits)
    element_count = _expanded_size(root, limits)
    viewbox = _root_viewbox(source, width, height, limits)
    _set_root_geometry(root, width, height, viewbox)
    return SanitizedSVG(root, viewbox, element_count, features)


# -- canonical tree ------------------------------------------------------------------------------


def _namespace(name: str) -> str:
    return name[1:].split("}", 1)[0] if name.startswith("{") else ""


def _local_name(name: str) -> str:
    return name.rsplit("}", 1)[-1]


def _canonical_tree(source: ET.Element, limits: RenderLimits) -> tuple[ET.Element, set[str]]:
    """Copy the SVG-namespace elements with vetted attributes; iterative (no recursion limit)."""
    features: set[str] = set()
    paint = _PaintReferences()
    root = ET.Element("svg")
    count = 1
    stack: list[tuple[ET.Element, ET.Element, int, bool]] = [(source, root, 1, False)]
    while stack:
        element, copy, depth, inherited_url = stack.pop()
        if depth > limits.max_depth:
            raise SVGRejected("too_deep", f"nesting deeper than max_depth={limits.max_depth}")
        name = _local_name(element.tag)
        _copy_attributes(element, copy, name, limits, features)
        copy.text = element.text
        if name == "style" and element.text:
            _check_css(element.text)
            features.update(_css_features(element.text))
        if name in TEXT_ELEMENTS:
            features.add("text")
        elif name in FILTER_ELEMENTS:
            features.add("filter")
        elif name == "marker":
            features.add("marker")
        elif name == "image":
            features.add("image")
        has_url = paint.visit(copy, name, inherited_url)
        for child in element:
            if not isinstance(child.tag, str):  # comments / processing instructions
                continue
            child_name = _local_name(child.tag)
            if _namespace(child.tag) not in ("", SVG_NAMESPACE) or child_name in DROPPED_ELEMENTS:
                continue
            count += 1
            if count > limits.max_elements:
                raise SVGRejected(
                    "too_many_elements", f"more than max_elements={limits.max_elements} elements"
                )
            child_copy = ET.SubElement(copy, child_name)
            child_copy.tail = child.tail
            stack.append((child, child_copy, depth + 1, has_url))
    if paint.curve_bbox_paint():
        features.add("curve_bbox")
    if paint.use and paint.opacity:  # opacity of <use>d leaves depends on the instancing context
        features.add("use_opacity")
    return root, features


class _PaintReferences:
    """Finds curved paths that may be painted, clipped or masked relative to their bounding box.

    cairosvg's bounding box of a Bezier path is the box of all its points *including control
    points*; Skia's is the tight box of the curve. Gradients, patterns, clips and masks in
    ``objectBoundingBox`` units then land differently, so such documents are flagged
    (``"curve_bbox"``) and the skia backend hands them to cairosvg. Conservative: a ``url(...)``
    on the path or an ancestor, or anywhere in a document that has ``<use>`` or a ``<style>``
    with ``url(...)``, counts.
    """

    _CURVE = re.compile(r"[CcSsQqTt]")

    def __init__(self) -> None:
        self.curved_path = self.curved_path_with_url = self.any_url = self.use = self.css_url = False
        self.opacity = False

    def visit(self, element: ET.Element, name: str, inherited_url: bool) -> bool:
        own_url = any("url(" in value.lower() for value in element.attrib.values())
        self.any_url |= own_url
        self.use |= name == "use"
        self.opacity |= "opacity" in element.attrib
        if name == "style" and element.text and "url(" in element.text.lower():
            self.css_url = True
        if name == "path" and self._CURVE.search(element.get("d", "")):
            self.curved_path = True
            self.curved_path_with_url |= own_url or inherited_url
        return own_url or inherited_url

    def curve_bbox_paint(self) -> bool:
        return self.curved_path_with_url or (
            self.curved_path and (self.css_url or (self.use and self.any_url))
        )


def _copy_attributes(
    element: ET.Element, copy: ET.Element, name: str, limits: RenderLimits, features: set[str]
) -> None:
    href = None
    for key, value in element.attrib.items():
        namespace, local = _namespace(key), _local_name(key)
        if namespace == XLINK_NAMESPACE and local == "href" or (namespace == "" and local == "href"):
            href = value if href is None or namespace == XLINK_NAMESPACE else href
            continue
        if namespace == XML_NAMESPACE:
            if local == "space":
                copy.set(key, value)
            continue  # xml:base and friends are dropped
        if namespace or local.lower().startswith("on"):
            continue  # foreign-namespace attributes, event handlers
        if "url(" in value.lower():
            _check_css_urls(value, where=f"{name}@{local}")
        if local == "style":
            _check_css(value)
            features.update(_css_features(value))
        elif local == "filter":
            features.add("filter")
        elif local.startswith("marker"):
            features.add("marker")
        elif local == "stroke-dasharray" and value.strip() not in ("", "none"):
            features.add("dash")
        copy.set(local, value)
    if href is not None and href.strip():
        copy.set("xlink:href", _check_href(href.strip(), name, limits))


def _check_href(href: str, element: str, limits: RenderLimits) -> str:
    if element == "image":
        _check_data_image(href, limits)
        return href
    if href.startswith("#") and len(href) > 1:
        return href
    raise SVGRejected("external_reference", f"<{element}> href {_preview(href)} is not a #fragment")


def _check_data_image(uri: str, limits: RenderLimits) -> None:
    """An <image> href must be an inline base64 raster of bounded pixel count."""
    match = _DATA_IMAGE_PATTERN.match(uri)
    if match is None:
        raise SVGRejected("external_reference", f"<image> href {_preview(uri)} is not a data:image URI")
    kind, parameters = match.group(1).lower(), (match.group(2) or "").lower()
    if kind not in ALLOWED_IMAGE_TYPES:
        raise SVGRejected("external_reference", f"<image> data URI of type image/{kind} is not allowed")
    if ";base64" not in parameters:
        raise SVGRejected("parse_error", "<image> data URI must be base64")
    try:
        payload = base64.b64decode(uri[match.end() :], validate=False)
    except (binascii.Error, ValueError):
        raise SVGRejected("parse_error", "<image> data URI is not valid base64") from None
    check_raster(payload, limits)


def check_raster(payload: bytes, limits: RenderLimits) -> None:
    """Embedded raster: a known format whose header (no pixel decoding) is within the pixel cap."""
    if b"<svg" in payload:  # cairosvg would parse such bytes as a nested SVG document
        raise SVGRejected("external_reference", "embedded image bytes contain an SVG document")
    from PIL import Image  # lazy: only documents with images pay for it

    try:
        with Image.open(io.BytesIO(payload)) as image:
            pixels = image.width * image.height
            kind = (image.format or "").lower()
    except Image.DecompressionBombError:
        raise SVGRejected("too_large", "embedded image is a decompression bomb") from None
    except Exception as error:  # noqa: BLE001 - PIL raises many types on garbage
        raise SVGRejected("parse_error", f"embedded image does not decode: {type(error).__name__}") from None
    if kind not in ALLOWED_IMAGE_TYPES:
        raise SVGRejected("external_reference", f"embedded image format {kind!r} is not allowed")
    if pixels > limits.max_image_pixels:
        raise SVGRejected("too_large", f"embedded image of {pixels} pixels > max_image_pixels")


def _check_css(text: str) -> None:
    if _CSS_IMPORT_PATTERN.search(text):
        raise SVGRejected("external_reference", "CSS @import is not allowed")
    _check_css_urls(text, where="CSS")


def _check_css_urls(text: str, where: str) -> None:
    lowered = text.lower()
    found = 0
    for match in _CSS_URL_PATTERN.finditer(text):
        found += 1
        target = match.group(2).strip()
        if not (target.startswith("#") and len(target) > 1):
            raise SVGRejected("external_reference", f"{where}: url({_preview(target)}) is not a #fragment")
    if lowered.count("url(") != found:
        raise SVGRejected("external_reference", f"{where}: unparseable url(...) reference")


def _css_features(text: str) -> Iterator[str]:
    lowered = text.lower()
    if "filter" in lowered:
        yield "filter"
    if "marker" in lowered:
        yield "marker"
    if "dasharray" in lowered:
        yield "dash"
    if _CSS_OPACITY_PATTERN.search(lowered):
        yield "css_opacity"


def _preview(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


# -- <use> expansion -----------------------------------------------------------------------------


def _expanded_size(root: ET.Element, limits: RenderLimits) -> int:
    """Elements drawn once every ``<use>`` is expanded; rejects cycles, overflows and deep chains.

    Iterative depth-first search over the graph "child of" + "use references": sizes and heights
    are memoised per element, so a use-bomb (10 uses of 10 uses of ...) costs O(elements) to
    detect instead of the 10^k a renderer would spend.
    """
    ids: dict[str, ET.Element] = {}
    for element in root.iter():
        identifier = element.get("id")
        if identifier and identifier not in ids:
            ids[identifier] = element

    def successors(element: ET.Element) -> list[ET.Element]:
        result = list(element)
        if element.tag == "use":
            href = element.get("xlink:href", "")
            target = ids.get(href[1:]) if href.startswith("#") else None
            if target is not None:
                result.append(target)
        return result

    size: dict[int, int] = {}
    height: dict[int, int] = {}
    on_path: set[int] = set()
    cap = limits.max_elements
    stack: list[tuple[ET.Element, list[ET.Element], int]] = [(root, successors(root), 0)]
    on_path.add(id(root))
    while stack:
        element, children, position = stack[-1]
        if position < len(children):
            stack[-1] = (element, children, position + 1)
            child = children[position]
            key = id(child)
            if key in on_path:
                raise SVGRejected("reference_cycle", f"<use> reference cycle through id={child.get('id')!r}")
            if key not in size:
                on_path.add(key)
                stack.append((child, successors(child), 0))
            continue
        stack.pop()
        on_path.discard(id(element))
        total = 1 + sum(size[id(child)] for child in children)
        tallest = 1 + max((height[id(child)] for child in children), default=0)
        if total > cap:
            raise SVGRejected(
                "too_many_elements", f"more than max_elements={cap} elements after <use> expansion"
            )
        if tallest > limits.max_depth:
            raise SVGRejected("too_deep", f"deeper than max_depth={limits.max_depth} after <use> expansion")
        size[id(element)], height[id(element)] = total, tallest
    return size[id(root)]


# -- root geometry -------------------------------------------------------------------------------


def parse_length(value: str | None) -> float | None:
    """An SVG length in CSS pixels (96 dpi), or None for missing / percentage / invalid / <= 0."""
    if value is None:
        return None
    match = _LENGTH_PATTERN.match(value)
    if match is None or match.group(2) == "%":
        return None
    number = float(match.group(1)) * _UNITS_TO_PX[match.group(2)]
    return number if math.isfinite(number) and number > 0 else None


def parse_viewbox(value: str | None) -> tuple[float, float, float, float] | None:
    """``min-x min-y width height`` (space/comma separated) or None when missing or invalid."""
    if not value:
        return None
    parts = [part for part in re.split(r"[\s,]+", value.strip()) if part]
    if len(parts) != 4:
        return None
    try:
        numbers = tuple(float(part) for part in parts)
    except ValueError:
        return None
    if not all(math.isfinite(n) for n in numbers) or numbers[2] <= 0 or numbers[3] <= 0:
        return None
    return numbers  # type: ignore[return-value]


def _root_viewbox(
    source: ET.Element, width: int, height: int, limits: RenderLimits
) -> tuple[float, float, float, float]:
    declared_width, declared_height = parse_length(source.get("width")), parse_length(source.get("height"))
    viewbox = parse_viewbox(source.get("viewBox"))
    numbers = [n for n in (declared_width, declared_height, *(viewbox or ())) if n is not None]
    if any(abs(n) > limits.max_declared_size for n in numbers):
        raise SVGRejected(
            "too_large",
            f"declared size (width={source.get('width')!r}, height={source.get('height')!r}, "
            f"viewBox={source.get('viewBox')!r}) exceeds max_declared_size={limits.max_declared_size:g}",
        )
    if viewbox is not None:
        return viewbox
    # no viewBox: user units are declared pixels; a missing dimension is one output pixel per unit
    return (0.0, 0.0, declared_width or float(width), declared_height or float(height))


def _set_root_geometry(root: ET.Element, width: int, height: int, viewbox: tuple[float, ...]) -> None:
    for key in ("x", "y", "width", "height", "viewBox"):
        root.attrib.pop(key, None)
    attributes = {
        "xmlns": SVG_NAMESPACE,
        "xmlns:xlink": XLINK_NAMESPACE,
        "width": str(int(width)),
        "height": str(int(height)),
        "viewBox": " ".join(f"{n:.10g}" for n in viewbox),
    }
    attributes.update(root.attrib)
    root.attrib.clear()
    root.attrib.update(attributes)
