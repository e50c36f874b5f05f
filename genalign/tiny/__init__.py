"""The offline tiny-model kit: architecturally real, tiny models built in code.

Each builder creates a randomly initialised model of a real architecture, small enough for CPU
tests, and can save it in the standard on-disk format so the library's normal
``from_pretrained`` path loads it. Users can write their own offline tests with these.
"""

from __future__ import annotations

from genalign.tiny.tokenizers import byte_level_clip_tokenizer, train_bpe_tokenizer

__all__ = ["byte_level_clip_tokenizer", "train_bpe_tokenizer"]
