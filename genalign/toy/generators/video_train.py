"""toy-ar-video's transformer recipe: diffusion forcing on toy video latents, block-causal.

The model is sampled by the ``ar_video`` policy Self-Forcing style (Huang et al. 2025): block by
block, each block denoised from pure noise with the previous blocks as clean context at timestep
0, and every step predicting ``x0 = x_t - sigma v``. Training therefore follows diffusion forcing
(Chen et al. 2024, "Diffusion Forcing", Sec. 3: an independent noise level per token, here per
block, under a causal mask) with the context Self-Forcing's sampler gives: per video a frontier
block ``k`` is drawn uniformly; the blocks before it are clean (timestep 0, the sampler's context,
no loss), block ``k`` and the later ones each draw their own noise level. The loss is the
flow-matching (rectified-flow) velocity loss on the noisy blocks (Lipman et al. 2023; Esser et al.
2024, eqs. 1-3): ``x_t = (1 - sigma) x0 + sigma eps``, target ``v = eps - x0``, the convention the
policy's ``x0 = x_t - sigma v`` undoes. Noise levels are ``sigma = s u / (1 + (s - 1) u)``,
``u ~ U(0, 1)``, ``s = 5``: the shifted density whose uniform grid the policy's 4-step rollout
samples (1000, 937.5, 833.3, 625).

The text encoder is frozen (toy-clip's text tower, :func:`clip_text_encoder`), so each caption's
embeddings are computed once, by the pipeline's own ``encode_prompt``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from genalign.policies.video_kv_cache import causal_forward
from genalign.toy.generators.budget import TrainBudget, recipe_budget
from genalign.toy.generators.build import clip_text_encoder
from genalign.toy.generators.train import train_and_save
from genalign.toy.generators.video import (
    VIDEO_TOKEN_LENGTH,
    build_video_transformer,
    video_latents,
    video_pipeline,
    video_tokenizer,
)
from genalign.toy.training import AveragedTraining, TrainingLog
from genalign.toy.video.data import toy_video_dataset

NUM_TRAIN_TIMESTEPS = 1000
TIMESTEP_SHIFT = 5.0  # the ar_video policy's (Self-Forcing's) schedule shift
# train_ar_video's default budget (the fields: TrainBudget; num_examples: its num_videos)
# the training videos of seed s are toy_video_dataset(num_videos, s + this) (video-pack writes the same)
VIDEO_DATA_SEED_OFFSET = 3000
AR_VIDEO_BUDGET = TrainBudget(steps=4000, batch_size=16, lr=1e-3, num_examples=3000, ema_decay=0.995)


def diffusion_forcing_timesteps(
    batch: int,
    num_frames: int,
    block_size: int,
    generator: torch.Generator | None = None,
    shift: float = TIMESTEP_SHIFT,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-frame model timesteps ``[B, F]`` in [0, 1000] and the mask ``[B, F]`` of noisy frames.

    Per video: a frontier block ``k ~ U{0, ..., F / block_size - 1}``; blocks before it at timestep
    0 (clean context), each block from ``k`` on at its own ``1000 sigma``, ``sigma = shift u / (1 +
    (shift - 1) u)`` with ``u ~ U(0, 1)``. All frames of a block share its timestep.
    """
    if num_frames % block_size:
        raise ValueError(f"num_frames {num_frames} is not a multiple of the block size {block_size}")
    num_blocks = num_frames // block_size
    frontier = torch.randint(0, num_blocks, (batch, 1), generator=generator)
    u = torch.rand(batch, num_blocks, generator=generator)
    sigma = shift * u / (1 + (shift - 1) * u)
    noisy = torch.arange(num_blocks)[None] >= frontier  # (B, blocks)
    sigma = torch.where(noisy, sigma, torch.zeros(()))
    timesteps = (NUM_TRAIN_TIMESTEPS * sigma).repeat_interleave(block_size, dim=1)
    return timesteps, noisy.repeat_interleave(block_size, dim=1)


def diffusion_forcing_loss(
    transformer,
    latents: torch.Tensor,
    prompt_embeds: torch.Tensor,
    generator: torch.Generator | None = None,
    shift: float = TIMESTEP_SHIFT,
    noise: torch.Tensor | None = None,
    noise_generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The velocity loss of module docstring on clean latents ``[B, C, F, h, w]`` with text
    embeddings ``[B, L, D]``: the mean squared error over the noisy frames only. ``noise``: the
    noise each video is paired with (reflow); default fresh Gaussian noise, drawn with
    ``noise_generator`` on its device if given (a GPU run: no CPU draw per step), else with
    ``generator`` on the CPU."""
    batch, _, num_frames = latents.shape[:3]
    block_size = int(transformer.config.num_frame_per_block)
    timesteps, noisy = diffusion_forcing_timesteps(batch, num_frames, block_size, generator, shift)
    # drawn on the CPU generator (the same draws on every device), then moved to the latents' device
    timesteps, noisy = timesteps.to(latents.device), noisy.to(latents.device)
    sigma = (timesteps / NUM_TRAIN_TIMESTEPS)[:, None, :, None, None]
    if noise is None:
        source = generator if noise_generator is None else noise_generator
        where = "cpu" if source is None else source.device
        noise = torch.randn(latents.shape, generator=source, device=where).to(latents.device)
    noised = (1 - sigma) * latents + sigma * noise  # x_t
    velocity = causal_forward(transformer, noised, timesteps, prompt_embeds)
    error = (velocity.float() - (noise - latents)).pow(2).mean(dim=(1, 3, 4))  # (B, F)
    return (error * noisy).sum() / (noisy.sum() * 1.0).clamp(min=1.0)


def minibatch_forcing_loss(
    transformer,
    latents: torch.Tensor,
    prompt_embeds: torch.Tensor,
    batch_size: int,
    seed: int,
    noise: torch.Tensor | None = None,
    caption_dropout: float = 0.0,
    empty_embeds: torch.Tensor | None = None,
    first_block_prob: float = 0.0,
) -> Callable[[int], torch.Tensor]:
    """A training step's loss (``loss_fn(step)``): :func:`diffusion_forcing_loss` on ``batch_size``
    videos drawn at random from ``latents`` / ``prompt_embeds`` (and ``noise``, reflow's paired noise),
    drawn and noised with one generator seeded with ``seed``.

    ``caption_dropout``: each drawn video's conditioning is replaced by ``empty_embeds`` (``[1, L,
    D]``, the empty caption's) with this probability, which trains the unconditional branch of
    classifier-free guidance (Ho & Salimans 2022, Sec. 3.2). At 0 (the default) no extra draw is
    made, so runs without it are unchanged.

    ``first_block_prob``: the probability that a step trains the **first block alone** (the
    videos cut to their first ``num_frame_per_block`` latent frames, one noise level each): the
    block a rollout draws from pure noise with no context, a text-to-image problem. Under the
    block-causal mask the first block's output does not depend on the later blocks, so this is
    exactly the diffusion-forcing loss restricted to frontier 0 and block 0, at a fraction of a
    whole video's cost. Uniform diffusion forcing gives that block about a tenth of the loss
    (frontier 0 a quarter of the time, then one of four noisy blocks); measured on the toy
    teacher, given the true first block the guided ODE continues 85% of videos correctly, from
    noise 0% (docs/astrolabe.md). At 0 (the default) no extra draw is made."""
    if not 0.0 <= caption_dropout < 1.0:
        raise ValueError(f"caption_dropout must be in [0, 1), got {caption_dropout}")
    if not 0.0 <= first_block_prob <= 1.0:
        raise ValueError(f"first_block_prob must be in [0, 1], got {first_block_prob}")
    block = int(transformer.config.num_frame_per_block) if first_block_prob > 0 else None
    if caption_dropout > 0 and empty_embeds is None:
        raise ValueError("caption_dropout needs empty_embeds: the empty caption's embeddings [1, L, D]")
    generator = torch.Generator().manual_seed(seed)
    # on an accelerator the noise is drawn there (CPU runs keep their one-generator draws)
    on_device = latents.device.type != "cpu"
    noise_generator = torch.Generator(latents.device).manual_seed(seed + 1) if on_device else None

    def loss_fn(step: int) -> torch.Tensor:
        index = torch.randint(len(latents), (batch_size,), generator=generator)
        paired = None if noise is None else noise[index]
        embeds = prompt_embeds[index]
        if caption_dropout > 0:
            dropped = (torch.rand(batch_size, generator=generator) < caption_dropout).to(embeds.device)
            embeds = torch.where(dropped[:, None, None], empty_embeds.to(embeds), embeds)
        videos = latents[index]
        if first_block_prob > 0 and float(torch.rand((), generator=generator)) < first_block_prob:
            videos = videos[:, :, :block]
            paired = None if paired is None else paired[:, :, :block]
        return diffusion_forcing_loss(
            transformer, videos, embeds, generator, noise=paired, noise_generator=noise_generator
        )

    return loss_fn


def continued_transformer(init: str | Path, text_dim: int, latent_channels: int):
    """The transformer of the toy-ar-video folder ``init``, in float32 and trainable, after checking
    that it reads ``text_dim``-wide text embeddings and ``latent_channels`` latent channels (the
    text encoder and autoencoder it will train with); a mismatch names the folder and the sizes."""
    from diffusers import SkyReelsV2Transformer3DModel

    folder = Path(init) / "transformer"
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{init}: no transformer/config.json (not a toy-ar-video folder)")
    transformer = SkyReelsV2Transformer3DModel.from_pretrained(str(folder)).float()
    config = transformer.config
    if (config.text_dim, config.in_channels) != (text_dim, latent_channels):
        raise ValueError(
            f"{init}: its transformer reads text width {config.text_dim} and {config.in_channels} latent "
            f"channels; this run has {text_dim} and {latent_channels}"
        )
    return transformer.requires_grad_(True)


@torch.no_grad()
def prompt_embeddings(pipe, captions: Sequence[str], batch_size: int = 256) -> torch.Tensor:
    """The pipeline's own text conditioning ``[N, L, D]`` of ``captions`` (its ``encode_prompt``:
    the tokens' last hidden states, zero after each caption's last token)."""
    chunks = []
    for start in range(0, len(captions), batch_size):
        embeds, _ = pipe.encode_prompt(
            list(captions[start : start + batch_size]),
            do_classifier_free_guidance=False,
            max_sequence_length=VIDEO_TOKEN_LENGTH,
            device=torch.device("cpu"),
        )
        chunks.append(embeds.float())
    return torch.cat(chunks)


def train_ar_video(
    vae,
    clip_text: str | Path,
    out: str | Path | None = None,
    *,
    budget: TrainBudget = AR_VIDEO_BUDGET,
    width: int = 128,
    num_layers: int = 4,
    patch: int = 4,
    caption_dropout: float = 0.0,
    first_block_prob: float = 0.0,
    device: str | torch.device = "cpu",
    videos: tuple[torch.Tensor, list[str]] | None = None,
    init: str | Path | None = None,
    **budget_keywords: Any,
) -> tuple[Any, dict[str, Any]]:
    """Train toy-ar-video's block-causal transformer from scratch on the latents of
    ``num_videos`` toy videos of train prompts (:func:`toy_video_dataset`), conditioned on the
    frozen text tower of ``clip_text`` (an open_clip folder: toy-clip), with
    :func:`diffusion_forcing_loss`, AdamW and an EMA of the weights (saved). ``vae``: a trained
    ``AutoencoderKLWan`` (:func:`~genalign.toy.generators.video.train_video_vae`). The data's
    encoding counts in ``train_seconds``. ``caption_dropout`` > 0 trains the unconditional branch
    too (:func:`minibatch_forcing_loss`), for guided sampling; ``first_block_prob`` > 0 spends
    that fraction of the steps on the first block alone (same function). ``patch``: the transformer's
    spatial patch (4: a 12 x 12 latent frame is 9 tokens of 128 numbers; 2: 36 tokens of 32).
    ``device``: where the autoencoder encodes the data and the transformer trains (``"cuda"`` on a
    GPU: batches, timesteps and dropout are still drawn on the CPU generator, the noise on the
    device's; the saved pipeline is on the CPU). ``videos``: pre-rendered
    ``(uint8 videos, captions)`` (:func:`~genalign.toy.video.data.load_video_pack`) used instead of
    rendering ``num_videos``. ``init``: a toy-ar-video folder whose transformer (its saved EMA
    weights) this run continues, with a fresh optimiser, warm-up and schedule; its architecture
    (``width``, ``num_layers``, ``patch``) is the folder's. Returns ``(pipeline, info)``.

    The budget (default :data:`AR_VIDEO_BUDGET`) and its keywords ``steps``, ``batch_size``,
    ``lr``, ``num_videos``, ``seed``, ``log_every``, ``max_minutes``, ``ema_decay`` and
    ``snapshot_every`` are :class:`~genalign.toy.generators.budget.TrainBudget`'s.
    """
    budget = recipe_budget("train_ar_video", budget, budget_keywords, data="num_videos")
    torch.manual_seed(budget.seed)
    start = time.time()
    tokenizer = video_tokenizer()
    text_encoder = clip_text_encoder(clip_text, tokenizer).requires_grad_(False).eval()
    if init is not None:
        transformer = continued_transformer(init, text_encoder.config.hidden_size, vae.config.z_dim)
    else:
        transformer = build_video_transformer(
            text_encoder.config.hidden_size, vae.config.z_dim, width, num_layers, patch=patch
        )
    pipe = video_pipeline(vae.eval(), text_encoder, tokenizer, transformer)
    if videos is None:
        videos = toy_video_dataset(budget.num_examples, seed=budget.seed + VIDEO_DATA_SEED_OFFSET)
    videos, captions = videos
    latents = video_latents(vae.to(device), videos)  # (N, C, F, h, w), standardised
    vae.to("cpu")
    embeds = prompt_embeddings(pipe, captions).to(device)  # (N, L, D)
    del videos
    transformer.to(device)
    training = AveragedTraining.of(  # a --max-minutes run decays over its minutes (GPU runs: steps by time)
        [transformer],
        budget.lr,
        budget.steps,
        budget.ema_decay,
        max_warmup=200,
        schedule_minutes=budget.max_minutes,
    )
    transformer.train()
    log = TrainingLog(budget.log_every, budget.steps, "toy-ar-video")
    empty = prompt_embeddings(pipe, [""]).to(device) if caption_dropout > 0 else None
    loss_fn = minibatch_forcing_loss(
        transformer,
        latents,
        embeds,
        budget.batch_size,
        budget.seed,
        None,
        caption_dropout,
        empty,
        first_block_prob,
    )

    def pipeline(average) -> tuple[Any, dict[str, Any]]:
        if torch.device(device).type != "cpu":
            average = copy.deepcopy(average).to("cpu")
        parameters = {"transformer": average, "text_encoder": text_encoder, "vae": vae}
        return video_pipeline(vae, text_encoder, tokenizer, average), parameters

    return train_and_save(
        training, loss_fn, log, start, pipeline, out, budget.max_minutes, budget.snapshot_every
    )
