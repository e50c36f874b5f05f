"""The unit of RLRF's length term: characters, or tokens of a tokenizer named in a recipe.

RLRF (arXiv 2505.20793, Sec. 3.2) measures an SVG's length in the tokens of the model that writes
it. A Python callable cannot travel in a YAML recipe, so the SVG rewards take ``length_tokenizer``
(a tokenizer folder or hub id; a model folder holds one) and count
``len(tokenizer(svg, add_special_tokens=False).input_ids)``; without it they count characters.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from genalign.utils.hub import require_local_path

__all__ = ["length_function"]


def length_function(
    length_tokenizer: str | Path | None, length_fn: Callable[[str], int] | None = None, owner: str = "svg"
) -> Callable[[str], int]:
    """``length_fn`` if given, else a token counter of ``length_tokenizer``, else ``len``.

    Raises:
        ValueError: both are given (one unit only).
        FileNotFoundError: ``length_tokenizer`` is a local path that does not exist or holds no
            tokenizer (named in the message).
    """
    if length_tokenizer is None:
        return length_fn or len
    if length_fn is not None:
        raise ValueError(f"{owner}: give length_fn or length_tokenizer, not both")
    path = str(length_tokenizer)
    require_local_path(path, what=f"{owner}: length_tokenizer")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise FileNotFoundError(f"{owner}: length_tokenizer {path} holds no tokenizer ({first})") from None

    def count_tokens(svg: str) -> int:
        return len(tokenizer(svg, add_special_tokens=False)["input_ids"])

    return count_tokens
