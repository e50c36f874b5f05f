"""VLM inputs of the ``language`` family that are not plain ``[B, ...]`` tensors.

Two things set Qwen2-VL / Qwen2.5-VL apart from LLaVA-style VLMs:

* **Packed images.** Their processor returns ``pixel_values`` as ``[sum of patches, D]`` (every
  image's patches concatenated) with ``image_grid_thw`` ``[num_images, 3]`` (each image's
  temporal / height / width patch grid), so the rows of ``pixel_values`` are not samples and a
  row slice of a trajectory would cut the wrong patches. :func:`split_packed_inputs` stores them
  per sample (a list of B tensors, one image per sample), which
  :meth:`~genalign.policies.TokenTrajectory.select` slices like any per-sample list, and
  :func:`pack_model_inputs` concatenates them again (in row order, as ``image_grid_thw``'s rows)
  for a forward.
* **Multimodal rotary positions (M-RoPE).** Their position ids are ``[3, B, L]`` (temporal,
  height, width), which the model computes itself from ``input_ids``, ``attention_mask`` (left
  padding is skipped), ``image_grid_thw`` and ``mm_token_type_ids`` (``get_rope_index``); ``generate``
  does the same at prefill and continues with the rope deltas. The re-scoring forward therefore
  passes no position ids to such a model when the batch has images, only ``mm_token_type_ids``
  extended over the completion (text, 0), so the model's positions are the ones sampling used;
  the 1-D ``cumsum(mask) - 1`` positions of plain LMs would be wrong (each image takes
  ``max(h, w) / merge`` positions, not its token count). A text-only batch gets the 1-D positions
  (the model expands them to three equal rows, as ``generate`` does without images).

The kind of model is found by capability (:func:`has_multimodal_positions`: a ``get_rope_index``
method on the model or its inner model), not by class name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "forward_position_inputs",
    "has_multimodal_positions",
    "inputs_to_device",
    "pack_model_inputs",
    "repeat_images",
    "split_packed_inputs",
    "stored_images",
]

# packed visual inputs and the grid that says how many of their rows each image holds
PACKED_INPUTS = {"pixel_values": "image_grid_thw", "pixel_values_videos": "video_grid_thw"}


def has_multimodal_positions(model: Any) -> bool:
    """Whether ``model`` computes its own multi-dimensional rotary positions (Qwen2-VL, Qwen2.5-VL:
    ``get_rope_index`` on the model or on its inner ``model``)."""
    owners = (model, getattr(model, "model", None))
    return any(callable(getattr(owner, "get_rope_index", None)) for owner in owners if owner is not None)


def split_packed_inputs(encoded: dict[str, Any], batch: int) -> dict[str, Any]:
    """``encoded`` with each packed visual input (``pixel_values`` beside ``image_grid_thw``) split
    into a list of ``batch`` per-sample tensors; inputs already ``[B, ...]`` pass unchanged.

    Each sample must hold exactly one image (the policy's contract: one image per prompt)."""
    out = dict(encoded)
    for name, grid_name in PACKED_INPUTS.items():
        if name not in out or grid_name not in out:
            continue
        grid = out[grid_name]
        if grid.shape[0] != batch:
            raise ValueError(f"{grid_name} holds {grid.shape[0]} images for {batch} samples (one each)")
        counts = [int(n) for n in grid.prod(dim=-1).tolist()]
        if sum(counts) != out[name].shape[0]:
            raise ValueError(f"{name} has {out[name].shape[0]} rows but {grid_name} says {sum(counts)}")
        out[name] = list(torch.split(out[name], counts, dim=0))
    return out


def pack_model_inputs(inputs: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    """The forward's inputs on ``device``: per-sample lists (:func:`split_packed_inputs`)
    concatenated back into the packed tensor, tensors moved."""
    packed = {}
    for name, value in inputs.items():
        if isinstance(value, (list, tuple)):
            packed[name] = torch.cat([v.to(device) for v in value], dim=0)
        else:
            packed[name] = value.to(device)
    return packed


def inputs_to_device(inputs: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    """``inputs`` on ``device``, per-sample lists kept as lists."""
    return {
        name: [v.to(device) for v in value] if isinstance(value, (list, tuple)) else value.to(device)
        for name, value in inputs.items()
    }


def forward_position_inputs(
    multimodal_positions: bool,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    model_inputs: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The position inputs of a full-sequence forward over ``input_ids`` ``[B, P + L]``.

    A model with multimodal positions given images gets none (it computes ``[3, B, P + L]``
    positions itself) and ``mm_token_type_ids`` extended with text (0) over the completion; any
    other forward gets position ids counted over real tokens, ``cumsum(mask) - 1``, so left padding
    changes nothing."""
    has_grid = any(model_inputs.get(grid) is not None for grid in PACKED_INPUTS.values())
    if multimodal_positions and has_grid:
        types = model_inputs.get("mm_token_type_ids")
        if types is None:
            return {}
        extra = input_ids.shape[1] - types.shape[1]
        if extra < 0:
            raise ValueError(
                f"mm_token_type_ids is {types.shape[1]} long, past the {input_ids.shape[1]} tokens"
            )
        return {"mm_token_type_ids": torch.nn.functional.pad(types, (0, extra), value=0)}
    return {"position_ids": (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)}


def repeat_images(images: Any, num_prompts: int, group_size: int) -> Any:
    """One image per sample: each prompt's image repeated ``group_size`` times. ``images`` is a
    ``[P, 3, H, W]`` tensor or a sequence of P ``[3, H, W]`` tensors (sizes may differ, for a VLM
    whose processor keeps each image's size, such as Qwen2.5-VL's); None passes."""
    if images is None:
        return None
    if len(images) != num_prompts:
        raise ValueError(f"images holds {len(images)} images for {num_prompts} prompts")
    if torch.is_tensor(images):
        return images.repeat_interleave(group_size, dim=0)
    for image in images:
        if not (torch.is_tensor(image) and image.ndim == 3):
            shape = tuple(image.shape) if torch.is_tensor(image) else type(image).__name__
            raise ValueError(f"each image of a list must be a [3, H, W] tensor, got {shape}")
    return [image for image in images for _ in range(group_size)]


def images_for_processor(images: Any) -> list[torch.Tensor]:
    """The per-sample images as the float CPU tensors a processor takes."""
    return [image.float().cpu() for image in images]


def has_images(images: Sequence[torch.Tensor] | torch.Tensor | None) -> bool:
    if images is None:
        return False
    return images.numel() > 0 if torch.is_tensor(images) else len(images) > 0


def stored_images(images: Any) -> Any:
    """The images a trajectory keeps: a float CPU ``[B, 3, H, W]`` tensor, or a list of B images."""
    if images is None:
        return None
    return images.float().cpu() if torch.is_tensor(images) else images_for_processor(images)
