"""extract_svg: the SVG document inside a messy completion (issue #25 item 1)."""

from __future__ import annotations

import pytest

from genalign.rewards.svg import extract_svg, extract_svg_details, sanitize_svg

DOC = '<svg viewBox="0 0 8 8"><rect x="1" y="1" width="4" height="4" fill="#ff0000"/></svg>'


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (DOC, DOC),
        (f"  \n{DOC}\n", DOC),
        (f"Here is the SVG:\n```svg\n{DOC}\n```\nIt draws a red square.", DOC),
        (f"```xml\n{DOC}\n```", DOC),
        (f"```\n{DOC}\n```", DOC),
        (f"```python\nprint(1)\n```\nthen\n```svg\n{DOC}\n```", DOC),  # the first fence with an <svg
        (f'<?xml version="1.0" encoding="UTF-8"?>\n<!-- icon -->\n{DOC}', DOC),
        (f"{DOC} This SVG shows a square. <svg><circle r='1'/></svg>", DOC),  # a second document dropped
        (
            '<SVG viewBox="0 0 4 4"><RECT width="2" height="2"/></SVG> trailing',
            '<SVG viewBox="0 0 4 4"><RECT width="2" height="2"/></SVG>',
        ),
        (
            "<svg><svg x='1'><rect/></svg><circle r='1'/></svg>!",
            "<svg><svg x='1'><rect/></svg><circle r='1'/></svg>",
        ),
        ('<svg viewBox="0 0 4 4"/> and more', '<svg viewBox="0 0 4 4"/>'),
    ],
    ids=[
        "bare",
        "blank-padded",
        "svg-fence",
        "xml-fence",
        "plain-fence",
        "second-fence",
        "prolog",
        "trailing-doc",
        "upper-case",
        "nested",
        "self-closing",
    ],
)
def test_extracts_the_document(completion, expected):
    assert extract_svg(completion) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (
            '<svg viewBox="0 0 8 8"><circle cx="4" cy="4" r="2"/>',
            '<svg viewBox="0 0 8 8"><circle cx="4" cy="4" r="2"/></svg>',
        ),
        (
            '<svg viewBox="0 0 8 8"><circle cx="4" cy="4" r="2"/><rect x="1',
            '<svg viewBox="0 0 8 8"><circle cx="4" cy="4" r="2"/></svg>',
        ),
        (
            '```svg\n<svg viewBox="0 0 8 8"><g><rect width="2" height="2"/>',
            '<svg viewBox="0 0 8 8"><g><rect width="2" height="2"/></svg>',
        ),
    ],
    ids=["unclosed", "cut-mid-tag", "unterminated-fence"],
)
def test_repairs_a_root_that_is_never_closed(completion, expected):
    found = extract_svg_details(completion)
    assert found.svg == expected and found.repaired
    assert extract_svg(completion, repair=False) is None


def test_repaired_documents_render_or_are_rejected_by_the_sanitiser():
    repaired = extract_svg('<svg viewBox="0 0 8 8"><circle cx="4" cy="4" r="2"/><rect x="1')
    sanitize_svg(repaired, 8, 8)  # closing the root makes this one valid
    half_group = extract_svg('<svg viewBox="0 0 8 8"><g><rect width="2" height="2"/>')
    with pytest.raises(Exception, match="parse_error|mismatched|not well-formed"):
        sanitize_svg(half_group, 8, 8)  # the unclosed <g> stays invalid: no silent success


@pytest.mark.parametrize(
    "completion", ["", "I cannot draw that.", "<svgfoo></svgfoo>", "```svg\n```", "< svg></svg>", None, 42]
)
def test_no_svg_gives_none(completion):
    assert extract_svg(completion) is None


def test_details_report_fence_and_trailing_text():
    found = extract_svg_details(f"```svg\n{DOC}\n```\nDone.")
    assert found.fenced and found.trailing and not found.repaired
    found = extract_svg_details(DOC)
    assert not (found.fenced or found.trailing or found.repaired)


def test_hostile_input_is_extracted_verbatim_for_the_sanitiser():
    hostile = '<!DOCTYPE svg [<!ENTITY a "aaaa">]><svg><text>&a;</text></svg>'
    assert extract_svg(hostile) == "<svg><text>&a;</text></svg>"  # the DTD is dropped with the prolog
    huge = "<svg>" + "<g>" * 50_000 + "</svg>"
    assert extract_svg(huge).startswith("<svg><g><g>")  # linear time, no recursion
