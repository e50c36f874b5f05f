"""Prompt pools whose prompts carry per-sample metadata (target images, reference SVGs, SFT targets).

A recipe's prompt pool has always been a list of strings. Tasks such as RLRF's image-to-SVG
(Rodriguez et al. 2025, arXiv 2505.20793) need more per prompt: the image the policy is shown and
the reward compares with, the ground-truth SVG whose length the reward measures, the text a
supervised stage imitates. A :class:`PromptPool` is still a ``list[str]`` of the prompts (so every
strategy that draws prompts works unchanged) plus :attr:`PromptPool.metadata`, a dict of
per-prompt columns, each with one entry per prompt:

* ``images``: float ``[N, 3, H, W]`` in [0, 1] (a VLM's input image and the reward's target);
* ``reference_svgs``: N ground-truth SVG strings;
* ``completions``: N target texts for supervised fine-tuning;
* anything else a plug-in strategy reads.

Strategies that know about metadata (``svg``, ``sft``) take the rows of the prompts they drew with
:meth:`PromptPool.rows`. Pools come from a JSON-lines file (:func:`read_prompt_records`) or from a
Python function named in the recipe (``prompts.source: "package.module:function"``), which is how
the toy world's SVG tasks (:mod:`genalign.toy.svg_tasks`) are built without a file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from genalign.config import ConfigError

__all__ = ["PromptPool", "read_prompt_records", "records_to_pool"]

# JSON-lines keys and the metadata column each fills
RECORD_KEYS = {"image": "images", "svg": "reference_svgs", "completion": "completions"}


class PromptPool(list):
    """A list of prompts with per-prompt metadata columns (module docstring).

    Args:
        prompts: the N prompts.
        metadata: column name -> N entries (a list, or a tensor whose first dimension is N).
    """

    def __init__(self, prompts: Sequence[str], metadata: dict[str, Any] | None = None) -> None:
        super().__init__(str(p) for p in prompts)
        self.metadata: dict[str, Any] = {}
        for name, column in (metadata or {}).items():
            size = column.shape[0] if torch.is_tensor(column) else len(column)
            if size != len(self):
                raise ValueError(f"prompt metadata {name!r} has {size} entries for {len(self)} prompts")
            self.metadata[name] = column if torch.is_tensor(column) else list(column)

    def rows(self, indices: Sequence[int] | torch.Tensor) -> dict[str, Any]:
        """The metadata of the prompts at ``indices`` (repeats allowed): tensors indexed, lists picked."""
        index = torch.as_tensor(indices, dtype=torch.long).flatten()
        return {
            name: column[index] if torch.is_tensor(column) else [column[i] for i in index.tolist()]
            for name, column in self.metadata.items()
        }

    def require(self, name: str, why: str) -> Any:
        """The column ``name``, or a ValueError saying which task needed it."""
        if name not in self.metadata:
            raise ValueError(
                f"{why} needs prompt metadata {name!r}; the prompt pool has {sorted(self.metadata) or 'none'}"
            )
        return self.metadata[name]

    def digest(self) -> str:
        """A hash of prompts and metadata (the recipe fingerprint: a resume with other data refuses)."""
        hasher = hashlib.sha256("\n".join(self).encode())
        for name in sorted(self.metadata):
            column = self.metadata[name]
            hasher.update(name.encode())
            if torch.is_tensor(column):
                hasher.update(column.detach().cpu().contiguous().numpy().tobytes())
            else:
                hasher.update(json.dumps(column, default=str).encode())
        return hasher.hexdigest()


def _load_image(path: Path) -> torch.Tensor:
    from PIL import Image

    with Image.open(path) as image:
        pixels = torch.frombuffer(bytearray(image.convert("RGB").tobytes()), dtype=torch.uint8)
        return pixels.view(image.height, image.width, 3).permute(2, 0, 1).float() / 255.0


def records_to_pool(records: Sequence[dict[str, Any]], base_dir: Path | None = None) -> PromptPool:
    """A :class:`PromptPool` from dicts with ``prompt`` and optional ``image`` (a file path,
    relative to ``base_dir``), ``svg`` and ``completion``; other keys become list columns.

    A key must be in every record or in none; images must share one size (they are stacked).
    """
    if not records:
        raise ValueError("no prompt records")
    keys = [k for k in records[0] if k != "prompt"]
    for number, record in enumerate(records):
        if "prompt" not in record:
            raise ValueError(f"prompt record {number} has no 'prompt'")
        if sorted(k for k in record if k != "prompt") != sorted(keys):
            raise ValueError(
                f"prompt record {number} has keys {sorted(record)}; record 0 has {sorted(records[0])}"
            )
    metadata: dict[str, Any] = {}
    for key in keys:
        column = [record[key] for record in records]
        if key == "image":
            paths = [Path(p) if Path(p).is_absolute() or base_dir is None else base_dir / p for p in column]
            images = [_load_image(path) for path in paths]
            if len({tuple(image.shape) for image in images}) > 1:
                raise ValueError("prompt record images differ in size; resize them to one size")
            metadata["images"] = torch.stack(images)
        else:
            metadata[RECORD_KEYS.get(key, key)] = column
    return PromptPool([record["prompt"] for record in records], metadata)


def read_prompt_file(path: Path) -> list[str]:
    """``prompts.file``: one prompt per line, blank lines and ``#`` comments skipped; a missing,
    non-UTF-8 or empty file raises naming it."""
    if not path.is_file():
        raise FileNotFoundError(f"prompts.file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"prompts.file {path} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from error
    prompts = [line.strip() for line in text.splitlines()]
    prompts = [line for line in prompts if line and not line.startswith("#")]
    if not prompts:
        raise ConfigError(f"prompts.file {path} holds no prompts")
    return prompts


def read_prompt_records(path: str | Path) -> PromptPool:
    """A :class:`PromptPool` from a JSON-lines file, one record per line (:func:`records_to_pool`;
    image paths relative to the file's folder). Blank lines are skipped."""
    path = Path(path)
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON: {error}") from error
        if not isinstance(records[-1], dict) or "prompt" not in records[-1]:
            raise ValueError(f"{path}:{number}: a prompt record needs a 'prompt' key")
    try:
        return records_to_pool(records, base_dir=path.parent)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from error
