"""The offline tiny-model kit: architecturally real, tiny models built in code.

Each builder creates a randomly initialised model of a real architecture, small enough for CPU
tests, and can save it in the standard on-disk format so the library's normal
``from_pretrained`` path loads it. Users can write their own offline tests with these.

Builders are imported lazily, so ``import genalign.tiny.clip`` does not pull in diffusers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "sd_pipeline": "diffusion",
    "sdxl_pipeline": "diffusion",
    "sd3_pipeline": "diffusion",
    "flux_pipeline": "diffusion",
    "sana_pipeline": "diffusion",
    "lcm_pipeline": "diffusion",
    "pixart_pipeline": "diffusion",
    "ar_video_pipeline": "video",
    "t5_tokenizer": "diffusion",
    "gemma_tokenizer": "diffusion",
    "qwen2_lm": "language",
    "llava_vlm": "language",
    "qwen25_vl": "language",
    "qwen2_vl": "language",
    "qwen2_vl_base": "qwen_rm",
    "hpsv3_checkpoint": "qwen_rm",
    "videoreward_checkpoint": "qwen_rm",
    "chat_tokenizer": "language",
    "clip_model": "clip",
    "open_clip_model": "clip",
    "byte_level_clip_tokenizer": "tokenizers",
    "train_bpe_tokenizer": "tokenizers",
    "materialize": "materialize",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f"genalign.tiny.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'genalign.tiny' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
