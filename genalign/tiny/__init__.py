"""The offline tiny-model kit: architecturally real, tiny models built in code.

Each builder creates a randomly initialised model of a real architecture, small enough for CPU
tests, and can save it in the standard on-disk format so the library's normal
``from_pretrained`` path loads it. Users can write their own offline tests with these.
"""

from __future__ import annotations

from genalign.tiny.diffusion import (
    flux_pipeline,
    gemma_tokenizer,
    lcm_pipeline,
    sana_pipeline,
    sd3_pipeline,
    sd_pipeline,
    sdxl_pipeline,
    t5_tokenizer,
)
from genalign.tiny.language import chat_tokenizer, llava_vlm, qwen2_lm
from genalign.tiny.tokenizers import byte_level_clip_tokenizer, train_bpe_tokenizer

__all__ = [
    "byte_level_clip_tokenizer",
    "chat_tokenizer",
    "flux_pipeline",
    "gemma_tokenizer",
    "lcm_pipeline",
    "llava_vlm",
    "qwen2_lm",
    "sana_pipeline",
    "sd3_pipeline",
    "sd_pipeline",
    "sdxl_pipeline",
    "t5_tokenizer",
    "train_bpe_tokenizer",
]
