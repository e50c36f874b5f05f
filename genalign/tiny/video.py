"""A tiny, randomly initialised block-causal video pipeline (the ``ar_video`` family), built offline.

:func:`ar_video_pipeline` returns diffusers' real ``SkyReelsV2DiffusionForcingPipeline`` made of
tiny real components, so :class:`genalign.policies.ARVideoPolicy` runs its real code paths on CPU:

* ``SkyReelsV2Transformer3DModel``: 2 layers, 2 heads x 12, patch (1, 2, 2), 4 latent channels,
  ``num_frame_per_block = 2`` (the block-causal mask), text features 32;
* ``AutoencoderKLWan``: 4 latent channels, 4x spatial and 2x temporal compression (latent
  frames F decode to 2F - 1 frames), identity latent normalisation;
* ``UMT5EncoderModel`` (2 layers, 32 features) with the character-level T5 tokenizer of
  :func:`genalign.tiny.diffusion.t5_tokenizer` (32 tokens per prompt).

Weights are seeded by ``seed``; the global torch RNG is left as it was. 32 x 32 px videos of 6
latent frames (3 blocks) take a fraction of a second per rollout step.
"""

from __future__ import annotations

from pathlib import Path

from diffusers import (
    AutoencoderKLWan,
    SkyReelsV2DiffusionForcingPipeline,
    SkyReelsV2Transformer3DModel,
    UniPCMultistepScheduler,
)
from transformers import UMT5Config, UMT5EncoderModel

from genalign.tiny.diffusion import _finish, _seeded, t5_tokenizer

__all__ = ["ar_video_pipeline"]

TEXT_DIM = 32
TEXT_TOKENS = 32


def _umt5_encoder(vocab_size: int) -> UMT5EncoderModel:
    """A tiny UMT5 encoder (Wan's text encoder family) over the character-level T5 vocabulary."""
    config = UMT5Config(
        vocab_size=vocab_size,
        d_model=TEXT_DIM,
        d_kv=8,
        d_ff=2 * TEXT_DIM,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return UMT5EncoderModel(config)


def ar_video_pipeline(
    seed: int = 0, save_to: str | Path | None = None, num_frame_per_block: int = 2
) -> SkyReelsV2DiffusionForcingPipeline:
    """The tiny block-causal video pipeline of the module docstring (blocks of
    ``num_frame_per_block`` latent frames)."""
    tokenizer = t5_tokenizer(model_max_length=TEXT_TOKENS)
    with _seeded(seed):
        transformer = SkyReelsV2Transformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            text_dim=TEXT_DIM,
            freq_dim=32,
            ffn_dim=32,
            num_layers=2,
            cross_attn_norm=True,
            rope_max_seq_len=64,
            num_frame_per_block=num_frame_per_block,
        )
        vae = AutoencoderKLWan(
            base_dim=8,
            z_dim=4,
            dim_mult=[1, 1, 1],
            num_res_blocks=1,
            temperal_downsample=[False, True],
            latents_mean=[0.0] * 4,
            latents_std=[1.0] * 4,
        )
        text_encoder = _umt5_encoder(len(tokenizer))
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0
    )
    pipe = SkyReelsV2DiffusionForcingPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae, scheduler=scheduler
    )
    return _finish(pipe, save_to)
