"""Saving image tensors as PNG files and grids."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from PIL import Image


def to_pil(image: torch.Tensor) -> Image.Image:
    """``[3, H, W]`` float in [0, 1] -> RGB PIL image."""
    array = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(array)


def make_grid(images: torch.Tensor, columns: int | None = None, padding: int = 2) -> Image.Image:
    """``[B, 3, H, W]`` in [0, 1] -> one PIL image with the samples tiled row by row."""
    batch, _, height, width = images.shape
    columns = columns or math.ceil(math.sqrt(batch))
    rows = math.ceil(batch / columns)
    grid = Image.new(
        "RGB", (columns * (width + padding) + padding, rows * (height + padding) + padding), "white"
    )
    for i in range(batch):
        r, c = divmod(i, columns)
        grid.paste(to_pil(images[i]), (padding + c * (width + padding), padding + r * (height + padding)))
    return grid


def save_images(images: torch.Tensor, out_dir: str | Path, prefix: str = "sample") -> list[Path]:
    """Write each image as ``{prefix}-{i:04d}.png`` plus ``grid.png``; return the written paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, image in enumerate(images):
        path = out / f"{prefix}-{i:04d}.png"
        to_pil(image).save(path)
        paths.append(path)
    grid_path = out / "grid.png"
    make_grid(images).save(grid_path)
    return [*paths, grid_path]
