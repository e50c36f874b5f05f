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

**LongLive's local window with sink frames** (:class:`LocalWindow`; Yang et al. 2025, arXiv
2509.22622, "short window attention" and "frame sink"; official ``CausalWanSelfAttention`` with
``local_attn_size`` 12 and ``sink_size`` 3 latent frames): every query of a block sees the first
``sink_frames`` frames of the video and the last ``local_frames - sink_frames`` frames up to its
own block's end (the block itself included), nothing else. With a window the cache evicts every
frame no later block can see, so it holds at most ``local_frames - k`` frames whatever the video's
length; rotary positions stay absolute (keys are stored rotated at their own frames, as the
official cache does). The recompute path applies the same window as a mask over the whole
sequence (:meth:`VideoKVCache.run` on an empty cache), so both paths give the same videos.

**Framewise models** (``num_frame_per_block = 1``, Causal Forcing's framewise variant): diffusers
builds its block-causal mask only for blocks of 2 or more frames and runs a framewise model
bidirectionally. Here the cache supplies the frame-causal mask itself whenever several frames run
at once (:meth:`VideoKVCache.run`), and :func:`causal_forward` routes a framewise model's
whole-sequence forward through an empty cache, so every path is causal.

Limits: gradients flow through the frames being run but not into the cached keys and values when
those were written under ``torch.no_grad`` (a streaming window's detached history). LongLive's
``global_sink`` option (the sink region protected during KV recomputation after a prompt switch)
has no counterpart: prompts do not change within a rollout here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_skyreels_v2 import (
    SkyReelsV2AttnProcessor,
    _get_qkv_projections,
)

__all__ = [
    "CachedSelfAttention",
    "LocalWindow",
    "VideoKVCache",
    "apply_rotary_embedding",
    "block_kv_cache",
    "causal_forward",
    "forcing_forward",
]


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


def forcing_forward(
    transformer: Any, latents: torch.Tensor, timesteps: torch.Tensor, encoder_hidden_states: torch.Tensor
) -> torch.Tensor:
    """The block-causal transformer's output ``[B, C, F, h, w]`` for ``latents`` at per-frame
    timesteps ``[B, F]`` (diffusers' diffusion-forcing forward, ``enable_diffusion_forcing=True``):
    what the ``ar_video`` policy samples with, the KV cache runs and toy-ar-video trains."""
    return transformer(
        hidden_states=latents,
        timestep=timesteps,
        encoder_hidden_states=encoder_hidden_states,
        enable_diffusion_forcing=True,
        return_dict=False,
    )[0]


def causal_forward(
    transformer: Any,
    latents: torch.Tensor,
    timesteps: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    window: LocalWindow | None = None,
) -> torch.Tensor:
    """:func:`forcing_forward` made causal for every model: blocks of 2 or more frames without a
    window run diffusers' forward (its block-causal mask); a framewise model (blocks of 1), or
    any model under a LongLive ``window``, runs through an empty :class:`VideoKVCache`, which
    applies the mask itself."""
    if window is None and int(transformer.config.num_frame_per_block) > 1:
        return forcing_forward(transformer, latents, timesteps, encoder_hidden_states)
    with block_kv_cache(transformer, window) as cache:
        return cache.run(latents, timesteps, encoder_hidden_states, write=False)


@dataclass(frozen=True)
class LocalWindow:
    """LongLive's attention span in latent frames (module docstring): the queries of a block
    ending at frame ``e`` (exclusive) see frames ``j < sink_frames`` and ``e - (local_frames -
    sink_frames) <= j < e``. LongLive-1.3B: ``LocalWindow(12, 3)``."""

    local_frames: int
    sink_frames: int = 0

    def __post_init__(self) -> None:
        if self.sink_frames < 0 or self.local_frames <= self.sink_frames:
            raise ValueError(
                f"local window: local_frames {self.local_frames} must exceed sink_frames {self.sink_frames} >= 0"
            )

    def check_block(self, block_size: int) -> None:
        """A block must see itself: ``local_frames - sink_frames >= block_size``."""
        if self.local_frames - self.sink_frames < block_size:
            raise ValueError(
                f"local window: local_frames {self.local_frames} - sink_frames {self.sink_frames} is below "
                f"the block size {block_size}, so a block would not see itself"
            )

    def visible(self, query_block_end: torch.Tensor, key_frames: torch.Tensor) -> torch.Tensor:
        """bool ``[Fq, Fk]``: may a query whose block ends at ``query_block_end`` ``[Fq]`` (exclusive
        absolute frame) see the key at absolute frame ``key_frames`` ``[Fk]``?"""
        end, key = query_block_end[:, None], key_frames[None, :]
        recent = key >= end - (self.local_frames - self.sink_frames)
        return (key < end) & ((key < self.sink_frames) | recent)

    def kept_after(self, frames: int, block_size: int, key_frames: torch.Tensor) -> torch.Tensor:
        """bool ``[Fk]``: the cached frames that a later block (the next one ends at ``frames +
        block_size``) can still see; the others are evicted."""
        return (key_frames < self.sink_frames) | (
            key_frames >= frames + block_size - (self.local_frames - self.sink_frames)
        )


class VideoKVCache:
    """Per-layer keys and values ``[B, S_cached, heads, D]`` of the clean context frames.

    Attributes:
        frames: latent frames written so far (the next block's first absolute frame index).
        cached_frames: LongTensor ``[F_cached]``, the absolute frames whose keys are held (all
            of ``range(frames)`` without a window; the sink and the recent ones with one).
        window: a :class:`LocalWindow`, or None for full block-causal attention.
        rotary: the rotary embedding ``(cos, sin)`` of the frames being run, set by :meth:`run`.
        mask: the attention mask ``[1, 1, S, S_cached + S]`` of the frames being run under a
            window (None: diffusers' own block-causal mask, every cached frame visible).
        write: whether the frames being run are appended after attending.
    """

    def __init__(self, transformer: Any, window: LocalWindow | None = None) -> None:
        self.transformer = transformer
        num_layers = len(transformer.blocks)
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.frames = 0
        self.cached_frames = torch.zeros(0, dtype=torch.long)
        self.window = window
        self.block_size = int(transformer.config.num_frame_per_block)
        if window is not None:
            window.check_block(self.block_size)
        self.rotary: tuple[torch.Tensor, torch.Tensor] | None = None
        self.mask: torch.Tensor | None = None
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
        # copies: views would keep the whole length's table alive in the graph a streaming window
        # saves for backward (memory growing with the detached history, #26 item 8)
        return cos[:, -tokens:].clone(), sin[:, -tokens:].clone()

    def _window_mask(
        self, num_frames: int, tokens_per_frame: int, device: torch.device
    ) -> torch.Tensor | None:
        """The token mask ``[1, 1, S, S_cached + S]`` of ``num_frames`` frames run from
        ``self.frames`` under the window; without one, the frame-causal mask of a framewise model
        running several frames (diffusers builds none for blocks of 1); else None (diffusers'
        own block-causal mask, every cached frame visible)."""
        if self.window is None and (self.block_size > 1 or num_frames == 1):
            return None
        new = torch.arange(self.frames, self.frames + num_frames)
        block_end = (new // self.block_size + 1) * self.block_size
        keys = torch.cat([self.cached_frames, new])
        if self.window is None:
            frames = keys[None, :] < block_end[:, None]
        else:
            frames = self.window.visible(block_end, keys)
        tokens = frames.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1)
        return tokens[None, None].to(device)

    def _evict(self, tokens_per_frame: int) -> None:
        """Drop the frames no later block can see (a window only)."""
        if self.window is None:
            return
        kept = self.window.kept_after(self.frames, self.block_size, self.cached_frames)
        if bool(kept.all()):
            return
        rows = kept.repeat_interleave(tokens_per_frame).nonzero().squeeze(1)
        for layer, (key, value) in enumerate(zip(self.keys, self.values)):
            if key is not None:
                self.keys[layer] = key[:, rows.to(key.device)]
                self.values[layer] = value[:, rows.to(value.device)]
        self.cached_frames = self.cached_frames[kept]

    def run(
        self, latents: torch.Tensor, timesteps: torch.Tensor, encoder_hidden_states: torch.Tensor, write: bool
    ) -> torch.Tensor:
        """The transformer's output ``[B, C, k, h, w]`` for one block ``latents`` at per-frame
        ``timesteps`` ``[B, k]``, attending to the cached frames; ``write`` appends the block.
        Several blocks may run at once (the block-causal mask among them is kept); on an empty
        cache that is the recompute path, under the window when there is one."""
        num_frames = latents.shape[2]
        if num_frames % self.block_size:
            raise ValueError(
                f"{num_frames} latent frames is not a whole number of blocks of {self.block_size}"
            )
        self.rotary = self._rotary_for(latents)
        tokens_per_frame = self.rotary[0].shape[1] // num_frames
        self.mask = self._window_mask(num_frames, tokens_per_frame, latents.device)
        self.write = write
        try:
            out = forcing_forward(self.transformer, latents, timesteps, encoder_hidden_states)
        finally:
            self.rotary, self.mask, self.write = None, None, False
        if write:
            new = torch.arange(self.frames, self.frames + num_frames)
            self.cached_frames = torch.cat([self.cached_frames, new])
            self.frames += num_frames
            self._evict(tokens_per_frame)
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
        if self.cache.mask is not None:  # a local window or a framewise model: the whole mask
            attention_mask = self.cache.mask
        elif attention_mask is not None and cached is not None:  # several blocks run at once: keep
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
def block_kv_cache(transformer: Any, window: LocalWindow | None = None) -> Iterator[VideoKVCache]:
    """A fresh :class:`VideoKVCache` on ``transformer`` (attending within ``window`` when given)
    for the duration of the context: every block's ``attn1`` processor is swapped for
    :class:`CachedSelfAttention` and restored after."""
    cache = VideoKVCache(transformer, window)
    originals = [block.attn1.processor for block in transformer.blocks]
    for layer, block in enumerate(transformer.blocks):
        block.attn1.set_processor(CachedSelfAttention(cache, layer))
    try:
        yield cache
    finally:
        for block, processor in zip(transformer.blocks, originals):
            block.attn1.set_processor(processor)
