"""The sanitiser: what passes, how it is canonicalised, and the reason code of what does not."""

from __future__ import annotations

import base64
import io
import struct
import time
import zlib

import pytest
from PIL import Image

from genalign.rewards.svg.sanitize import (
    SVG_NAMESPACE,
    RenderLimits,
    SVGRejected,
    parse_length,
    parse_viewbox,
    sanitize_svg,
)

NS = 'xmlns="http://www.w3.org/2000/svg"'
XLINK = 'xmlns:xlink="http://www.w3.org/1999/xlink"'


def svg(body: str, attributes: str = 'viewBox="0 0 10 10"') -> str:
    return f"<svg {NS} {XLINK} {attributes}>{body}</svg>"


def png_data_uri(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (255, 0, 0)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height`` (a decompression-bomb header, no pixel data)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def reason(document: str, limits: RenderLimits | None = None) -> str:
    with pytest.raises(SVGRejected) as info:
        sanitize_svg(document, 32, 32, limits)
    return info.value.reason


# -- what passes -----------------------------------------------------------------------------------


def test_canonical_root_takes_the_output_size_and_an_explicit_viewbox():
    document = sanitize_svg(svg('<rect width="5" height="5"/>', 'width="300" height="150"'), 64, 48)
    root = document.root
    assert (root.get("width"), root.get("height")) == ("64", "48")
    assert document.viewbox == (0.0, 0.0, 300.0, 150.0)  # declared size becomes the user space
    assert root.get("viewBox") == "0 0 300 150"
    text = document.to_string()
    assert text.startswith("<svg ") and f'xmlns="{SVG_NAMESPACE}"' in text


@pytest.mark.parametrize(
    ("attributes", "viewbox"),
    [
        ('viewBox="1 2 30 40" width="5" height="5"', (1.0, 2.0, 30.0, 40.0)),
        ('viewBox="0,0,8,4"', (0.0, 0.0, 8.0, 4.0)),
        ('width="1in" height="72pt"', (0.0, 0.0, 96.0, 96.0)),
        ('width="50%" height="20"', (0.0, 0.0, 32.0, 20.0)),  # percentage -> output pixels
        ('viewBox="0 0 0 10" width="8" height="8"', (0.0, 0.0, 8.0, 8.0)),  # invalid viewBox ignored
        ("", (0.0, 0.0, 32.0, 32.0)),  # nothing declared: one unit per output pixel
    ],
)
def test_viewbox_derivation(attributes, viewbox):
    assert sanitize_svg(svg("", attributes), 32, 32).viewbox == viewbox


def test_parse_helpers():
    assert parse_length("12") == 12.0 and parse_length(" 2.5e1px ") == 25.0
    assert parse_length("1cm") == pytest.approx(96 / 2.54)
    assert parse_length("10%") is None and parse_length("-3") is None and parse_length("abc") is None
    assert parse_viewbox("0 0 10 5") == (0.0, 0.0, 10.0, 5.0)
    assert (
        parse_viewbox("0 0 10") is None
        and parse_viewbox("0 0 -1 5") is None
        and parse_viewbox("0 0 nan 1") is None
    )


def test_dangerous_or_foreign_content_is_dropped_not_passed_on():
    body = (
        '<script>alert(1)</script><foreignObject><div xmlns="http://www.w3.org/1999/xhtml">x</div>'
        '</foreignObject><!-- comment --><?xml-stylesheet href="file:///etc/passwd"?>'
        '<rect onload="evil()" xml:base="file:///" width="4" height="4" fill="red"/>'
        '<inkscape:thing xmlns:inkscape="http://www.inkscape.org/namespaces/inkscape"/>'
    )
    text = sanitize_svg(svg(body), 16, 16).to_string()
    for banned in (
        "script",
        "foreignObject",
        "comment",
        "stylesheet",
        "onload",
        "xml:base",
        "inkscape",
        "passwd",
    ):
        assert banned not in text
    assert '<rect width="4" height="4" fill="red"' in text


def test_fragment_references_and_inline_rasters_pass():
    body = (
        '<defs><linearGradient id="g"><stop offset="0" stop-color="red"/></linearGradient>'
        '<rect id="r" width="2" height="2"/></defs>'
        '<use xlink:href="#r"/><use href="#r" x="3"/><rect width="4" height="4" fill="url(#g)" '
        "style=\"stroke: url( '#g' )\"/>"
        f'<image width="4" height="4" href="{png_data_uri(4, 4)}"/>'
    )
    document = sanitize_svg(svg(body), 16, 16)
    assert document.to_string().count('xlink:href="#r"') == 2  # both spellings -> xlink:href
    assert document.features == {"image"}
    assert (
        document.element_count == 1 + 1 + 2 + 1 + 2 * (1 + 1) + 1 + 1
    )  # svg defs gradient+stop r use*2 rect image


def test_use_expansion_is_counted():
    group = "".join('<rect width="1" height="1"/>' for _ in range(10))
    body = f'<defs><g id="a">{group}</g></defs>' + '<use xlink:href="#a"/>' * 5
    document = sanitize_svg(svg(body), 8, 8)
    assert document.element_count == 1 + 1 + 11 + 5 * (1 + 11)


# -- what does not -------------------------------------------------------------------------------

BILLION_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY a "lol"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
    '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">'
    '<!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;"><!ENTITY f "&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;">'
    '<!ENTITY g "&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;"><!ENTITY h "&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;">'
    '<!ENTITY i "&h;&h;&h;&h;&h;&h;&h;&h;&h;&h;">]>'
    f'<svg {NS}><text x="0" y="10">&i;</text></svg>'
)


def external_entity(path: str) -> str:
    return f'<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY x SYSTEM "file://{path}">]><svg {NS}><text>&x;</text></svg>'


@pytest.mark.parametrize(
    ("name", "document", "expected"),
    [
        ("billion laughs", BILLION_LAUGHS, "forbidden_entity"),
        ("external entity", external_entity("/etc/hostname"), "forbidden_entity"),
        (
            "bare doctype",
            f'<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "http://x/svg11.dtd"><svg {NS}/>',
            "forbidden_entity",
        ),
        (
            "image file URI",
            svg('<image href="file:///etc/hostname" width="5" height="5"/>'),
            "external_reference",
        ),
        ("image xlink http", svg('<image xlink:href="http://example.com/a.png"/>'), "external_reference"),
        ("image relative path", svg('<image href="secret.png"/>'), "external_reference"),
        ("image nested svg", svg('<image href="data:image/svg+xml;base64,PHN2Zy8+"/>'), "external_reference"),
        ("use external", svg('<use href="other.svg#a"/>'), "external_reference"),
        ("gradient href https", svg('<linearGradient href="https://x/g.svg#g"/>'), "external_reference"),
        (
            "link href",
            svg('<a href="https://example.com"><rect width="1" height="1"/></a>'),
            "external_reference",
        ),
        (
            "fill url file",
            svg('<rect width="1" height="1" fill="url(file:///etc/passwd)"/>'),
            "external_reference",
        ),
        ("style url", svg('<rect style="fill:url(http://x/y)" width="1" height="1"/>'), "external_reference"),
        ("css import", svg("<style>@import 'file:///etc/passwd';</style>"), "external_reference"),
        ("css url", svg("<style>rect { fill: url('/etc/passwd') }</style>"), "external_reference"),
        ("data URI on use", svg('<use href="data:image/png;base64,AAAA"/>'), "external_reference"),
        ("not xml", "<svg><rect></svg>", "parse_error"),
        ("not svg", f"<html {NS}/>", "parse_error"),
        ("empty", "", "parse_error"),
        ("not text", None, "parse_error"),
        ("huge width", svg("", 'width="100000" height="100000"'), "too_large"),
        ("huge viewBox", svg("", 'viewBox="0 0 1e9 1e9"'), "too_large"),
        ("deep nesting", svg("<g>" * 10_000 + "</g>" * 10_000), "too_deep"),
        (
            "use bomb",
            svg(
                '<g id="a0"><rect width="1" height="1"/></g>'
                + "".join(f'<g id="a{k}">' + f'<use href="#a{k - 1}"/>' * 10 + "</g>" for k in range(1, 8))
            ),
            "too_many_elements",
        ),
        ("use cycle", svg('<g id="a"><use href="#b"/></g><g id="b"><use href="#a"/></g>'), "reference_cycle"),
        ("self use", svg('<g id="a"><use href="#a"/></g>'), "reference_cycle"),
        (
            "use chain",
            svg("".join(f'<g id="c{k}"><use href="#c{k + 1}"/></g>' for k in range(500)) + '<g id="c500"/>'),
            "too_deep",
        ),
        ("10 MB path", svg(f'<path d="M0 0 {"L1 1 " * 2_000_000}"/>'), "too_large"),
        (
            "image bomb header",
            svg(
                '<image href="data:image/png;base64,'
                + base64.b64encode(png_header_only(100_000, 100_000)).decode()
                + '"/>'
            ),
            "too_large",
        ),
        (
            "large image header",
            svg(
                '<image href="data:image/png;base64,'
                + base64.b64encode(png_header_only(5000, 5000)).decode()
                + '"/>'
            ),
            "too_large",
        ),
        ("garbage image", svg('<image href="data:image/png;base64,bm90IGFuIGltYWdl"/>'), "parse_error"),
    ],
)
def test_rejections(name, document, expected):
    start = time.perf_counter()
    assert reason(document) == expected, name
    assert time.perf_counter() - start < 5.0, f"{name}: sanitising took too long"


def test_limits_are_configurable():
    wide = svg("", 'width="100000" height="10"')
    assert sanitize_svg(wide, 16, 16, RenderLimits(max_declared_size=1e6)).viewbox == (0, 0, 100000.0, 10.0)
    nested = svg("<g>" * 30 + "</g>" * 30)
    assert reason(nested, RenderLimits(max_depth=10)) == "too_deep"
    assert (
        reason(svg('<rect width="1" height="1"/>' * 50), RenderLimits(max_elements=20)) == "too_many_elements"
    )
    assert reason(svg(""), RenderLimits(max_bytes=10)) == "too_large"
    with pytest.raises(ValueError, match="timeout"):
        RenderLimits(timeout=0)


def test_renderer_disagreements_are_flagged():
    def features(body: str) -> set[str]:
        return sanitize_svg(svg(body), 8, 8).features

    assert features('<text x="1" y="5">hi</text>') == {"text"}
    assert features('<filter id="f"/><rect width="1" height="1" filter="url(#f)"/>') == {"filter"}
    assert features('<path d="M0 0 L5 5" stroke="red" stroke-dasharray="1 1"/>') == {"dash"}
    assert features("<style>rect { opacity: .5 }</style>") == {"css_opacity"}
    gradient = '<linearGradient id="g"><stop offset="1" stop-color="red"/></linearGradient>'
    assert features(gradient + '<path d="M0 0 C1 5 5 5 5 0Z" fill="url(#g)"/>') == {"curve_bbox"}
    assert features(gradient + '<g fill="url(#g)"><path d="M0 0 Q1 5 5 0Z"/></g>') == {"curve_bbox"}
    assert features(gradient + '<path d="M0 0 L1 5 L5 0Z" fill="url(#g)"/>') == set()  # straight: same bbox
    assert features('<rect id="r" width="1" height="1" opacity="0.5"/><use href="#r"/>') == {"use_opacity"}
