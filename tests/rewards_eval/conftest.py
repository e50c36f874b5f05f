"""Tiny image files and tables for the evaluation tests."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def png_bytes(value: int, size: int = 8) -> bytes:
    """A flat grey PNG (``value`` in 0..255) as bytes."""
    buffer = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), value, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def image_dir(tmp_path) -> Path:
    """``tmp/img{k}.png`` for k in 0..5, grey levels 0, 50, ..., 250."""
    for k in range(6):
        (tmp_path / f"img{k}.png").write_bytes(png_bytes(50 * k))
    return tmp_path
