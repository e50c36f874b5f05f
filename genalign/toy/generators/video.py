"""toy-ar-video's parts and its autoencoder: a ``SkyReelsV2DiffusionForcingPipeline`` of the toy
video world (issue #26), the ``ar_video`` family's layout at toy size.

- :func:`video_tokenizer`: the toy ``CLIPTokenizer`` over the video grammar's words (each one token);
- :func:`build_video_vae`: a small ``AutoencoderKLWan`` without temporal compression, 4x spatial
  (48 px frames -> 12 x 12 x 8 latents; 8 frames -> 8 latent frames);
- :func:`build_video_transformer`: a small block-causal ``SkyReelsV2Transformer3DModel`` whose
  4 x 4 latent patches make a frame 9 tokens (a video 72);
- :func:`train_video_vae`: the autoencoder trained on toy video frames.

The transformer's recipe (diffusion forcing on these latents) is
:mod:`genalign.toy.generators.video_train`.

**How frames are encoded.** Wan's ``_encode`` reads a video as its first frame then chunks of 4
(``1 + 4k`` frames); the toy videos have 8. Here every frame is encoded on its own, as a one-frame
video (``encode_frames``): latent frame ``t`` depends on pixel frame ``t`` only. Decoding is
Wan's own: causal in time, frame by frame with its feature cache, which equals one pass of
``vae.decoder`` over the whole latent sequence (``decode_for_training``; checked in the tests). The
pipeline only decodes, so the saved folder is a plain ``AutoencoderKLWan``; its ``latents_mean`` /
``latents_std`` are the per-channel statistics of the training latents, which the ``ar_video``
policy undoes before decoding.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genalign.toy.generators.budget import TrainBudget, recipe_budget
from genalign.toy.generators.build import toy_tokenizer
from genalign.toy.generators.data import random_crop
from genalign.toy.training import TrainingLog, optimise_module, parameter_count
from genalign.toy.video.captions import VIDEO_CATEGORIES
from genalign.toy.video.data import toy_video_dataset
from genalign.toy.video.prompts import all_video_prompts, sample_video_for_prompt
from genalign.toy.video.scenes import render_videos
from genalign.toy.video.verifier import evaluate_videos

VIDEO_TOKEN_LENGTH = 16  # the longest video caption: 11 words and a comma, + BOS + EOS = 14 tokens
VAE_DIM_MULT = (1, 2, 2)  # two 2x spatial downsamplings: 48 px -> 12 x 12
VAE_Z_DIM = 8
VIDEO_KL_WEIGHT = 1e-6  # Stable Diffusion's autoencoder KL weight, as the image VAE's
WHITE = 0.9  # in [-1, 1]: a pixel with a channel below it is part of a shape (the background is 1)
# train_video_vae's default budget (the fields: TrainBudget; num_examples: its num_videos)
VIDEO_VAE_BUDGET = TrainBudget(steps=600, batch_size=6, lr=1e-3, num_examples=1500, log_every=50)


# -- parts ------------------------------------------------------------------------------------------


def video_words() -> list[str]:
    """Every word of the video grammar's captions (the comma split off, as CLIP's tokenizer does)."""
    return sorted({w for p in all_video_prompts() for w in p.caption.replace(",", " ,").split()})


def video_tokenizer(model_max_length: int = VIDEO_TOKEN_LENGTH):
    """The toy ``CLIPTokenizer`` (:func:`toy_tokenizer`) with every video word as one token."""
    return toy_tokenizer(model_max_length, words=video_words())


def build_video_vae(z_dim: int = VAE_Z_DIM, base_dim: int = 8, dim_mult: Sequence[int] = VAE_DIM_MULT):
    """A small ``AutoencoderKLWan`` with ``2 ** (len(dim_mult) - 1)``x spatial and no temporal
    compression (identity latent normalisation until :func:`set_latent_statistics`)."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=base_dim,
        z_dim=z_dim,
        dim_mult=list(dim_mult),
        num_res_blocks=1,
        temperal_downsample=[False] * (len(dim_mult) - 1),
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    )


def build_video_transformer(
    text_dim: int,
    latent_channels: int = VAE_Z_DIM,
    width: int = 128,
    num_layers: int = 4,
    head_dim: int = 32,
    block_size: int = 2,
    patch: int = 4,
    rope_max_seq_len: int = 64,
):
    """A small block-causal ``SkyReelsV2Transformer3DModel``: patches of 1 x ``patch`` x ``patch``
    latents (a 12 x 12 latent frame is 9 tokens), ``width / head_dim`` heads, blocks of
    ``block_size`` latent frames; rotary positions for up to ``rope_max_seq_len`` latent frames."""
    from diffusers import SkyReelsV2Transformer3DModel

    if width % head_dim:
        raise ValueError(f"width {width} must be a multiple of head_dim {head_dim}")
    return SkyReelsV2Transformer3DModel(
        patch_size=(1, patch, patch),
        num_attention_heads=width // head_dim,
        attention_head_dim=head_dim,
        in_channels=latent_channels,
        out_channels=latent_channels,
        text_dim=text_dim,
        freq_dim=64,
        ffn_dim=2 * width,
        num_layers=num_layers,
        cross_attn_norm=True,
        rope_max_seq_len=rope_max_seq_len,
        num_frame_per_block=block_size,
    )


def video_pipeline(vae, text_encoder, tokenizer, transformer):
    """The ``SkyReelsV2DiffusionForcingPipeline`` of toy-ar-video's modules (the scheduler is
    diffusers' default for it; the ``ar_video`` policy samples with its own Self-Forcing steps)."""
    from diffusers import SkyReelsV2DiffusionForcingPipeline, UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0
    )
    pipe = SkyReelsV2DiffusionForcingPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae, scheduler=scheduler
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def small_video_pipeline(clip_text: str | Path, seed: int = 0):
    """toy-ar-video's layout at a fraction of its size, with random weights (an autoencoder with 4
    latent channels, a one-layer transformer 32 wide) and toy-clip's text tower read from
    ``clip_text``: for tests and quick checks of the toy video tools. The weights are drawn from
    ``seed`` without touching the global random state."""
    from genalign.toy.generators.build import clip_text_encoder

    tokenizer = video_tokenizer()
    text_encoder = clip_text_encoder(clip_text, tokenizer).requires_grad_(False).eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = build_video_vae(z_dim=4, base_dim=4).eval()
        transformer = build_video_transformer(
            text_encoder.config.hidden_size, 4, width=32, num_layers=1, head_dim=16
        )
    return video_pipeline(vae, text_encoder, tokenizer, transformer)


# -- encoding and decoding ----------------------------------------------------------------------------


def to_video_model_range(videos: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, F, 3, H, W]`` (or floats in [0, 1]) -> float ``[N, 3, F, H, W]`` in [-1, 1]."""
    scale = 255.0 if videos.dtype == torch.uint8 else 1.0
    return (videos.float() / scale * 2 - 1).transpose(1, 2)


def encode_frames(vae, videos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior ``(mean, std)`` ``[N, C, F, h, w]`` of videos ``[N, 3, F, H, W]`` in [-1, 1], every
    frame encoded on its own (module docstring). Unnormalised (before ``latents_mean`` / ``_std``)."""
    batch, _, frames = videos.shape[:3]
    single = videos.transpose(1, 2).flatten(0, 1)[:, :, None]  # (N F, 3, 1, H, W)
    posterior = vae.encode(single).latent_dist

    def unflatten(x: torch.Tensor) -> torch.Tensor:
        return x[:, :, 0].unflatten(0, (batch, frames)).transpose(1, 2)

    return unflatten(posterior.mean), unflatten(posterior.std)


def decode_for_training(vae, latents: torch.Tensor) -> torch.Tensor:
    """Videos ``[N, 3, F, H, W]`` (unclamped) from unnormalised latents ``[N, C, F, h, w]``: one pass
    of the causal decoder, equal to ``vae.decode`` before its clamp to [-1, 1]."""
    return vae.decoder(vae.post_quant_conv(latents))


def latent_statistics(vae) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, std)`` ``[1, C, 1, 1, 1]`` of the VAE's latent normalisation."""
    shape = (1, -1, 1, 1, 1)
    return (
        torch.tensor(vae.config.latents_mean).view(shape),
        torch.tensor(vae.config.latents_std).view(shape),
    )


@torch.no_grad()
def video_latents(vae, videos: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """Normalised latents ``[N, C, F, h, w]`` (what the transformer sees) of uint8 videos
    ``[N, F, 3, H, W]``: posterior means, minus ``latents_mean``, over ``latents_std``."""
    device = next(vae.parameters()).device
    mean, std = (x.to(device) for x in latent_statistics(vae))
    chunks = []
    for start in range(0, len(videos), batch_size):
        chunk = to_video_model_range(videos[start : start + batch_size].to(device))
        posterior_mean, _ = encode_frames(vae, chunk)
        chunks.append((posterior_mean - mean) / std)
    return torch.cat(chunks)


@torch.no_grad()
def set_latent_statistics(vae, videos: torch.Tensor) -> None:
    """Set ``latents_mean`` / ``latents_std`` to the per-channel statistics of the posterior means
    of ``videos`` (uint8 ``[N, F, 3, H, W]``), so the transformer's latents are standardised."""
    vae.register_to_config(latents_mean=[0.0] * vae.config.z_dim, latents_std=[1.0] * vae.config.z_dim)
    raw = video_latents(vae, videos)  # identity normalisation: the raw posterior means
    dims = (0, 2, 3, 4)
    vae.register_to_config(
        latents_mean=[round(float(x), 5) for x in raw.mean(dims)],
        latents_std=[round(float(x), 5) for x in raw.std(dims)],
    )


# -- the autoencoder's training -----------------------------------------------------------------------


def train_video_vae(
    out: str | Path | None = None,
    *,
    budget: TrainBudget = VIDEO_VAE_BUDGET,
    kl_weight: float = VIDEO_KL_WEIGHT,
    crop: int = 32,
    base_dim: int = 8,
    init: str | Path | None = None,
    foreground_weight: float = 5.0,
    **budget_keywords: Any,
) -> tuple[Any, dict[str, Any]]:
    """Train the video autoencoder on toy videos of train prompts (reconstruction L1 + L2 and a
    small KL term: the Stable Diffusion autoencoder objective of Rombach et al. 2022, Sec. 3.1,
    without perceptual and adversarial terms, which flat shapes on white do not need; pixels of
    shapes weigh ``foreground_weight`` times the white background's). Each step
    encodes every frame of ``batch_size`` videos, cropped to a random ``crop`` x ``crop`` window on
    the latent grid, and decodes them causally in time (module docstring).

    Then sets the latent normalisation (:func:`set_latent_statistics`) and measures the
    reconstruction error and the verifier's accuracy on reconstructions
    (:func:`reconstruction_accuracy`). With ``init`` (a folder it wrote) training continues from
    that autoencoder. Returns ``(vae, info)``.

    The budget (default :data:`VIDEO_VAE_BUDGET`) and its keywords ``steps``, ``batch_size``,
    ``lr``, ``num_videos``, ``seed``, ``log_every`` and ``max_minutes`` are
    :class:`~genalign.toy.generators.budget.TrainBudget`'s.
    """
    from diffusers import AutoencoderKLWan

    budget = recipe_budget(
        "train_video_vae", budget, budget_keywords, data="num_videos", unused=("ema_decay", "snapshot_every")
    )
    torch.manual_seed(budget.seed)
    start = time.time()
    videos, _ = toy_video_dataset(budget.num_examples, seed=budget.seed)
    vae = AutoencoderKLWan.from_pretrained(str(init)) if init else build_video_vae(base_dim=base_dim)
    factor = 2 ** (len(vae.config.dim_mult) - 1)  # the spatial compression
    generator = torch.Generator().manual_seed(budget.seed)
    log = TrainingLog(budget.log_every, budget.steps, "video-vae")

    def loss_fn(step: int) -> torch.Tensor:
        index = torch.randint(len(videos), (budget.batch_size,), generator=generator)
        x = random_crop(to_video_model_range(videos[index]), crop, factor, generator)  # (B, 3, F, H, W)
        mean, std = encode_frames(vae, x)
        z = mean + std * torch.randn(mean.shape, generator=generator)
        reconstruction = decode_for_training(vae, z)
        kl = 0.5 * (mean**2 + std**2 - 1 - 2 * std.log()).flatten(1).sum(1).mean()  # KL to N(0, I)
        # shapes cover a few percent of a frame: their pixels weigh foreground_weight, the white
        # background 1, so the decoder learns colours and outlines before polishing the background
        weight = 1 + (foreground_weight - 1) * (x < WHITE).any(dim=1, keepdim=True).float()
        error = (reconstruction - x).abs()
        return (weight * (error + error**2)).mean() / weight.mean() + kl_weight * kl

    done = optimise_module(
        vae, loss_fn, budget.lr, budget.steps, log, max_warmup=50, max_minutes=budget.max_minutes
    )
    set_latent_statistics(vae, videos[:256])
    info = {
        "steps": done,
        "loss_history": log.history,
        "parameters": parameter_count(vae),
        "kl_weight": kl_weight,
        "foreground_weight": foreground_weight,
        "train_seconds": round(time.time() - start, 1),
        **reconstruction_accuracy(vae, seed=budget.seed + 1),
    }
    if out is not None:
        vae.save_pretrained(str(out))
    return vae, info


@torch.no_grad()
def reconstruction_accuracy(vae, num_per_category: int = 16, seed: int = 1) -> dict[str, float]:
    """The verifier on renders of train prompts and on their reconstructions (encode, normalise,
    undo, decode as the policy does): ``reconstruction_mae`` (pixels in [0, 1]),
    ``render_accuracy`` and ``reconstruction_accuracy`` (mean over categories)."""
    rng = np.random.default_rng(seed)
    drawn = [sample_video_for_prompt(c, rng) for c in VIDEO_CATEGORIES for _ in range(num_per_category)]
    videos = render_videos([scene for scene, _, _ in drawn])  # (N, F, 3, H, W) in [0, 1]
    specs = [spec for _, _, spec in drawn]
    mean, std = latent_statistics(vae)
    latents = video_latents(vae, (videos * 255).round().to(torch.uint8))
    decoded = vae.decode(latents * std + mean).sample  # (N, 3, F, H, W) in [-1, 1]
    reconstructions = (decoded / 2 + 0.5).clamp(0, 1).transpose(1, 2)
    return {
        "reconstruction_mae": round(float((reconstructions - videos).abs().mean()), 5),
        "render_accuracy": evaluate_videos(videos, specs)["overall"],
        "reconstruction_accuracy": evaluate_videos(reconstructions, specs)["overall"],
    }
