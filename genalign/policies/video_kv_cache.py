"""A KV cache for diffusers' ``SkyReelsV2Transformer3DModel``, in our own attention processor.

Self-Forcing samples a block-causal video model block by block and keeps the keys and values of
the finished (clean) blocks, so each new block attends to them without recomputing the prefix
(Huang et al. 2025, arXiv 2506.08009, Sec. 3.3; ``CausalWanModel`` with ``kv_cache``). diffusers'
class has no cache: its forward runs the whole sequence under a block-causal mask
(``num_frame_per_block > 1``). Because that mask makes every block's hidden states depend only on
itself and earlier blocks, the prefix's keys and values at every layer are the same whether the
prefix is recomputed or cached; this module caches them.

How: :func:`block_kv_cache` swaps every block's self-attention processor (``attn1``) for
:class:`CachedSelfAttention` for the duration of a rollout and restores the originals after. The
processor is diffusers' ``SkyReelsV2AttnProcessor`` with two changes, the only reason it is
rewritten here (its projections, norms, head split and rotary embedding are copied as they are):

* queries and keys get the rotary embedding of the frames' *absolute* positions (the forward
  computes it for positions 0 .. k-1 of the block it is given; the cache supplies the block's
  true positions ``offset .. offset + k - 1``);
* keys and values of the cached frames are prepended, every cached frame visible to every query;
  when several blocks run at once their block-causal mask among themselves is kept.

Outside :meth:`VideoKVCache.run` the processor is diffusers' own, so the transformer's ordinary
forward works unchanged inside the context. Cross-attention (``attn2``) is untouched: it reads
only the text. :class:`VideoKVCache.run` runs one
block at per-frame timesteps and, with ``write=True``, appends its keys and values (the clean
block re-run at t = 0 becomes context, as Self-Forcing's ``context_noise = 0``).

Limits: no eviction (LongLive's local window with sink frames is not implemented). Gradients
flow through the frames being run but not into the cached keys and values when those were
written under ``torch.no_grad`` (a streaming window's detached history).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_skyreels_v2 import (
    SkyReelsV2AttnProcessor,
    _get_qkv_projections,
)

__all__ = ["CachedSelfAttention", "VideoKVCache", "apply_rotary_embedding", "block_kv_cache"]


def apply_rotary_embedding(
    hidden_states: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor
) -> torch.Tensor:
    """diffusers' SkyReels-V2 / Wan rotary embedding on ``[B, S, heads, D]`` (interleaved pairs)."""
    x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(hidden_states)


class VideoKVCache:
    """Per-layer keys and values ``[B, S_cached, heads, D]`` of the clean context frames.

    Attributes:
        frames: latent frames held (the next block's first absolute frame index).
        rotary: the rotary embedding ``(cos, sin)`` of the frames being run, set by :meth:`run`.
        write: whether the frames being run are appended after attending.
    """

    def __init__(self, transformer: Any) -> None:
        self.transformer = transformer
        num_layers = len(transformer.blocks)
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.frames = 0
        self.rotary: tuple[torch.Tensor, torch.Tensor] | None = None
        self.write = False

    def _rotary_for(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary ``(cos, sin)`` ``[1, S_block, 1, D]`` at absolute frames ``frames .. frames + k - 1``."""
        _, _, num_frames, height, width = latents.shape
        patch_t = self.transformer.config.patch_size[0]
        # the rope module reads only the shape of its input: a meta tensor allocates nothing
        shape_only = torch.empty(1, 1, self.frames + num_frames, height, width, device="meta")
        cos, sin = self.transformer.rope(shape_only)
        tokens = (num_frames // patch_t) * (height // self.transformer.config.patch_size[1])
        tokens *= width // self.transformer.config.patch_size[2]
        return cos[:, -tokens:], sin[:, -tokens:]

    def run(
        self, latents: torch.Tensor, timesteps: torch.Tensor, encoder_hidden_states: torch.Tensor, write: bool
    ) -> torch.Tensor:
        """The transformer's output ``[B, C, k, h, w]`` for one block ``latents`` at per-frame
        ``timesteps`` ``[B, k]``, attending to the cached frames; ``write`` appends the block."""
        self.rotary = self._rotary_for(latents)
        self.write = write
        try:
            out = self.transformer(
                hidden_states=latents,
                timestep=timesteps,
                encoder_hidden_states=encoder_hidden_states,
                enable_diffusion_forcing=True,
                return_dict=False,
            )[0]
        finally:
            self.rotary, self.write = None, False
        if write:
            self.frames += latents.shape[2]
        return out

    def attend(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of layer ``layer`` with the cached ones prepended (stored when writing)."""
        if self.keys[layer] is not None:
            key = torch.cat([self.keys[layer], key], dim=1)
            value = torch.cat([self.values[layer], value], dim=1)
        if self.write:
            self.keys[layer], self.values[layer] = key, value
        return key, value


class CachedSelfAttention(SkyReelsV2AttnProcessor):
    """``SkyReelsV2AttnProcessor`` for self-attention with a :class:`VideoKVCache` (module docstring)."""

    def __init__(self, cache: VideoKVCache, layer: int) -> None:
        super().__init__()
        self.cache, self.layer = cache, layer

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        if self.cache.rotary is None:  # a plain forward, outside VideoKVCache.run: diffusers' own
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        query, key, value = _get_qkv_projections(attn, hidden_states, None)
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))  # (B, S, heads, D)
        query = apply_rotary_embedding(query, *self.cache.rotary)
        key = apply_rotary_embedding(key, *self.cache.rotary)
        cached = self.cache.keys[self.layer]
        key, value = self.cache.attend(self.layer, key, value)  # (B, S_cached + S, heads, D)
        if attention_mask is not None and cached is not None:  # several blocks run at once: keep
            # their block-causal mask among themselves, every cached frame visible
            visible = attention_mask.new_ones(*attention_mask.shape[:-1], cached.shape[1])
            attention_mask = torch.cat([visible, attention_mask], dim=-1)
        hidden_states = dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=0.0,
            is_causal=False,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        hidden_states = attn.to_out[0](hidden_states)
        return attn.to_out[1](hidden_states)


@contextlib.contextmanager
def block_kv_cache(transformer: Any) -> Iterator[VideoKVCache]:
    """A fresh :class:`VideoKVCache` on ``transformer`` for the duration of the context: every
    block's ``attn1`` processor is swapped for :class:`CachedSelfAttention` and restored after."""
    cache = VideoKVCache(transformer)
    originals = [block.attn1.processor for block in transformer.blocks]
    for layer, block in enumerate(transformer.blocks):
        block.attn1.set_processor(CachedSelfAttention(cache, layer))
    try:
        yield cache
    finally:
        for block, processor in zip(transformer.blocks, originals):
            block.attn1.set_processor(processor)
