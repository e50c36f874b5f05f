"""Pull the SVG document out of a language model's completion.

An SVG writer under RL (RLRF, Rodriguez et al. 2025, Sec. 3) does not always answer with a bare
document: chat models wrap code in Markdown fences, add a sentence before or after it, or run out
of tokens before ``</svg>``. :func:`extract_svg` is the pure function that turns such a completion
into the text handed to the renderer:

1. If the completion holds a fenced code block (```` ```svg ````, ```` ```xml ````, ```` ``` ````) that
   contains ``<svg``, only the first such block is searched; an unterminated fence runs to the end.
2. The document starts at the first ``<svg`` tag (an XML prolog, comments or prose before it are
   dropped) and ends at the ``</svg>`` that closes it, counting nested ``<svg>`` elements; text
   after it (an explanation, a second document) is dropped.
3. A document whose root is never closed (the completion hit ``max_new_tokens``) is repaired when
   asked (``repair=True``, the default): a trailing partial tag is cut and the missing ``</svg>``
   appended; whether the rest parses is the sanitiser's business
   (:func:`genalign.rewards.svg.sanitize.sanitize_svg`), so nothing here makes an invalid document
   look valid beyond closing the root.

A completion without any ``<svg`` tag yields None: the caller scores it at the reward's floor and
counts it. Nothing here parses XML or evaluates the document, so hostile input costs linear time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SVGExtraction", "extract_svg", "extract_svg_details"]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_OPEN = re.compile(r"<svg(?=[\s>/])", re.IGNORECASE)
_TAG = re.compile(r"<(/?)svg(?=[\s>/])[^<>]*?(/?)>|</svg\s*>", re.IGNORECASE)


@dataclass(frozen=True)
class SVGExtraction:
    """What :func:`extract_svg_details` found.

    Attributes:
        svg: the extracted document, or None when the completion holds no ``<svg`` tag.
        fenced: it came from inside a Markdown code fence.
        repaired: the root was not closed and ``</svg>`` was appended.
        trailing: non-blank text followed the document (dropped).
    """

    svg: str | None
    fenced: bool = False
    repaired: bool = False
    trailing: bool = False


def _closing_end(text: str, start: int) -> int | None:
    """The index just past the ``</svg>`` that closes the ``<svg`` at ``start``, or None."""
    depth = 0
    for match in _TAG.finditer(text, start):
        token = match.group(0)
        if token.startswith("</"):
            depth -= 1
        elif not token.rstrip().endswith("/>"):
            depth += 1
        elif depth == 0:  # a self-closing root <svg .../>: the whole document
            return match.end()
        if depth == 0:
            return match.end()
    return None


def _repair(fragment: str) -> str:
    """Close an unterminated document: cut a trailing partial tag, append ``</svg>``."""
    last_open, last_close = fragment.rfind("<"), fragment.rfind(">")
    if last_open > last_close:  # a tag cut off mid-way, e.g. '<circle cx="3'
        fragment = fragment[:last_open]
    return fragment.rstrip() + "</svg>"


def extract_svg_details(text: str, repair: bool = True) -> SVGExtraction:
    """The SVG document in ``text`` and how it was found (module docstring for the rules)."""
    if not isinstance(text, str):
        return SVGExtraction(None)
    search, fenced = text, False
    for match in _FENCE.finditer(text):
        if _OPEN.search(match.group(2)):
            search, fenced = match.group(2), True
            break
    opening = _OPEN.search(search)
    if opening is None:
        return SVGExtraction(None, fenced=fenced)
    start = opening.start()
    end = _closing_end(search, start)
    if end is None:
        if not repair:
            return SVGExtraction(None, fenced=fenced)
        return SVGExtraction(_repair(search[start:]), fenced=fenced, repaired=True)
    trailing = bool(search[end:].strip()) or (fenced and bool(text.split("```")[-1].strip()))
    return SVGExtraction(search[start:end], fenced=fenced, trailing=trailing)


def extract_svg(text: str, repair: bool = True) -> str | None:
    """The SVG document in a completion, or None when it holds no ``<svg`` tag.

    >>> extract_svg('Sure! ```svg\\n<svg viewBox="0 0 8 8"><rect width="4" height="4"/></svg>\\n``` Done.')
    '<svg viewBox="0 0 8 8"><rect width="4" height="4"/></svg>'
    >>> extract_svg('<svg viewBox="0 0 8 8"><circle cx="4" cy="4" r="2"/><rect x="1')
    '<svg viewBox="0 0 8 8"><circle cx="4" cy="4" r="2"/></svg>'
    """
    return extract_svg_details(text, repair).svg
