"""The one progress-bar helper library code uses (tqdm, to stderr)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def progress_bar(iterable: Iterable[Any], desc: str = "", disable: bool = False, **kwargs: Any):
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, disable=disable, dynamic_ncols=True, **kwargs)
