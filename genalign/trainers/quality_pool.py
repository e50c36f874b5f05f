"""Image-quality prompt pools for IQA judges: images with MOS labels and their degraded copies.

Q-Hawkeye (Xie et al. 2026, arXiv 2601.22920) trains a VLM judge on images with mean opinion
scores (KonIQ with DeQA-Score's meta files in the official run) and, for its perception loss, a
degraded copy of each image (:func:`genalign.utils.degradations.degradation_pair`: one of noise,
blur, repeated JPEG, darkening, then a second, different one). :func:`quality_pool` reads any
folder of images with MOS labels from a JSON-lines file (``{"image": "file.png", "mos": 3.2,
...}``, paths relative to the file, as ``assets/eval/quality/mos.jsonl``: the toy world's renders
degraded at known levels) and returns a :class:`~genalign.trainers.prompt_pool.PromptPool` whose
prompts are the judge's question and whose columns are ``images``, ``degraded_images``, ``mos``,
``first_degradation`` and ``second_degradation``. Recipes name it as a prompt source::

    prompts:
      source: genalign.trainers.quality_pool:quality_pool
      source_kwargs: {records: assets/eval/quality/mos.jsonl, size: 64}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from genalign.algorithms.q_hawkeye import QHAWKEYE_PROMPT, SHORT_PROMPT
from genalign.trainers.prompt_pool import PromptPool, _load_image
from genalign.utils.degradations import DEGRADATION_KINDS, degradation_pair

__all__ = ["QHAWKEYE_PROMPT", "SHORT_PROMPT", "quality_pool", "quality_pool_of", "read_mos_records"]


def _resolve(path: str | Path) -> Path:
    """``path`` as given, else relative to the repository holding this package (shipped assets)."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    shipped = Path(__file__).resolve().parents[2] / path
    return shipped if shipped.exists() else path


def read_mos_records(
    path: str | Path, size: int | None = None, limit: int | None = None
) -> tuple[torch.Tensor, list[float], list[dict[str, Any]]]:
    """``(images [N, 3, S, S] in [0, 1], mos [N], records)`` from a JSON-lines file of
    ``{"image", "mos", ...}`` (image paths relative to the file; blank lines skipped; the first
    ``limit`` records). Images are resized (bilinear, antialiased) to ``size`` x ``size``, or must
    share one size when ``size`` is None. A record without an image or a numeric ``mos`` fails
    naming its line."""
    path = _resolve(path)
    if not path.is_file():
        raise FileNotFoundError(f"MOS records not found: {path}")
    records, images, mos = [], [], []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            score = float(record["mos"])
            image_path = Path(record["image"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"{path}:{number}: need a JSON record with 'image' and a numeric 'mos' ({error})"
            ) from error
        image = _load_image(image_path if image_path.is_absolute() else path.parent / image_path)
        if size is not None and tuple(image.shape[1:]) != (size, size):
            image = F.interpolate(image[None], size=(size, size), mode="bilinear", antialias=True)[0].clamp(
                0, 1
            )
        records.append(record)
        images.append(image)
        mos.append(score)
        if limit is not None and len(records) >= limit:
            break
    if not records:
        raise ValueError(f"{path} holds no MOS records")
    if len({tuple(image.shape) for image in images}) > 1:
        raise ValueError(f"{path}: images differ in size; pass size to resize them")
    return torch.stack(images), mos, records


def quality_pool(
    records: str,
    prompt: str = QHAWKEYE_PROMPT,
    size: int | None = None,
    limit: int | None = None,
    seed: int = 0,
    kinds: tuple[str, ...] | list[str] = DEGRADATION_KINDS,
) -> PromptPool:
    """A judge's prompt pool (module docstring) from the MOS records at ``records``.

    Every image gets the question ``prompt``; its degraded copy is
    ``degradation_pair(image, seed + index, kinds)``, so the pool is a function of its arguments
    (and part of the recipe fingerprint)."""
    images, mos, _ = read_mos_records(records, size, limit)
    return quality_pool_of(images, mos, prompt, seed, kinds)


def quality_pool_of(
    images: torch.Tensor,
    mos: list[float] | torch.Tensor,
    prompt: str = QHAWKEYE_PROMPT,
    seed: int = 0,
    kinds: tuple[str, ...] | list[str] = DEGRADATION_KINDS,
    **columns: Any,
) -> PromptPool:
    """:func:`quality_pool` of images already in memory (``[N, 3, H, W]`` in [0, 1]) with their
    ``mos`` ``[N]``; ``columns`` are extra per-image metadata (``completions``: SFT targets)."""
    if len(images) != len(mos):
        raise ValueError(f"got {len(images)} images but {len(mos)} MOS values")
    degraded, first, second = [], [], []
    for index, image in enumerate(images):
        copy, first_kind, second_kind = degradation_pair(image, seed + index, tuple(kinds))
        degraded.append(copy)
        first.append(first_kind)
        second.append(second_kind)
    metadata = {
        "images": images,
        "degraded_images": torch.stack(degraded),
        "mos": torch.as_tensor(mos, dtype=torch.float32),
        "first_degradation": first,
        "second_degradation": second,
        **columns,
    }
    return PromptPool([prompt] * len(images), metadata)
