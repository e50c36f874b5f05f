"""toy-ar-video's second stage: reflow, so that the few-step Self-Forcing rollout draws sharp videos.

The ``ar_video`` policy samples as Self-Forcing does (Huang et al. 2025): at each step it predicts
``x0`` and re-noises it with *fresh* noise. That sampler is made for distilled models, whose ``x0``
is a sample. A model trained only with the flow-matching loss (stage 1,
:mod:`genalign.toy.generators.video_train`) predicts the posterior *mean* of ``x0``: from pure noise
the mean video of the prompt, a faint smear; re-noising keeps only that smear, and four steps end
near the blank mean (measured: 0% verifier accuracy after 1,000 steps, although the same model
denoises noised training videos well).

Reflow (Liu et al. 2023, "Flow Straight and Fast", Sec. 2.2 and Algorithm 1) straightens the flow:
draw pairs ``(eps, x0 = ODE(eps))`` with the stage-1 model's Euler ODE, block by block with the clean
earlier blocks as context (the rollout's causal order), then train on ``x_t = (1 - sigma) x0 +
sigma eps`` with the *paired* noise and the same diffusion-forcing loss. On the straightened flow
``x0(x_t)`` is the end of the ODE from ``x_t``, one sample, not a mean, so every Self-Forcing step
predicts a video and the rollout keeps it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genalign.sampling.self_forcing import self_forcing_timesteps, uniform_denoising_steps
from genalign.toy.generators.train import train_and_save
from genalign.toy.generators.video_train import (
    NUM_TRAIN_TIMESTEPS,
    minibatch_forcing_loss,
    prompt_embeddings,
)
from genalign.toy.training import AveragedTraining, TrainingLog
from genalign.toy.video.captions import VIDEO_CATEGORIES
from genalign.toy.video.prompts import video_prompts_for
from genalign.toy.video.scenes import NUM_FRAMES, VIDEO_SIZE


def train_captions(num: int, seed: int = 0) -> list[str]:
    """``num`` captions of the train split, each of a uniformly drawn category (as the data of
    stage 1, :func:`~genalign.toy.video.toy_video_dataset`, without rendering the videos)."""
    rng = np.random.default_rng(seed)
    by_category = {c: video_prompts_for("train", c) for c in VIDEO_CATEGORIES}
    captions = []
    for _ in range(num):
        prompts = by_category[VIDEO_CATEGORIES[int(rng.integers(len(VIDEO_CATEGORIES)))]]
        captions.append(prompts[int(rng.integers(len(prompts)))].caption)
    return captions


@torch.no_grad()
def ode_video_samples(
    policy,
    noise: torch.Tensor,
    prompt_embeds: torch.Tensor,
    num_steps: int = 8,
    guidance_scale: float = 1.0,
    negative_embeds: torch.Tensor | None = None,
    shift: float | None = None,
    prefix: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Euler ODE ``x <- x + (sigma_{i+1} - sigma_i) v`` of an ``ar_video`` policy from ``noise``
    ``[B, C, F, h, w]``, block by block, each block given the finished earlier blocks as clean
    context (the policy's :meth:`block_output`). Sigmas: the shifted grid of ``num_steps`` steps
    (``shift``, default the policy's), then 0. Returns the clean latents ``[B, C, F, h, w]``.

    With ``guidance_scale`` w != 1, classifier-free guidance (Ho & Salimans 2022, eq. 6, on the
    velocity): ``v = v_u + w (v_c - v_u)``, ``v_u`` conditioned on ``negative_embeds`` (``[1 or B,
    L, D]``, the empty caption's for a model trained with caption dropout) with the same clean
    context; both branches run as one batch.

    ``prefix`` (clean latents ``[B, C, F0, h, w]``, F0 a multiple of the block size) is taken as
    the first F0 frames and only the blocks after it are drawn (the rest of ``noise``): the
    teacher's continuation of a given start, e.g. the true first block of a rendered video."""
    shift = policy.timestep_shift if shift is None else shift
    timesteps = self_forcing_timesteps(uniform_denoising_steps(num_steps), shift).float()
    sigmas = torch.cat([timesteps / NUM_TRAIN_TIMESTEPS, torch.zeros(1)])
    batch, block = noise.shape[0], policy.block_size
    guided = float(guidance_scale) != 1.0
    if guided:
        if negative_embeds is None:
            raise ValueError("guidance_scale != 1 needs negative_embeds (the unconditional branch)")
        negative = negative_embeds.expand(batch, *prompt_embeds.shape[1:]).to(prompt_embeds.dtype)
        prompt_embeds = torch.cat([prompt_embeds, negative])
    conditioning = {"prompt_embeds": prompt_embeds}
    clean = noise.new_zeros(noise.shape)
    first = 0
    if prefix is not None:
        first = int(prefix.shape[2])
        if first % block or prefix.shape[:2] != noise.shape[:2] or prefix.shape[3:] != noise.shape[3:]:
            raise ValueError(
                f"prefix of shape {tuple(prefix.shape)}: expected [B, C, F0, h, w] as noise's "
                f"{tuple(noise.shape)} with F0 a multiple of the block size {block}"
            )
        clean[:, :, :first] = prefix.to(clean.dtype)
    for start in range(first, noise.shape[2], block):
        x = noise[:, :, start : start + block]
        context = clean[:, :, :start]
        if guided:
            context = torch.cat([context, context])
        for i in range(num_steps):
            rows = 2 * batch if guided else batch
            t = torch.full((rows,), float(timesteps[i]))
            velocity = policy.block_output(torch.cat([x, x]) if guided else x, t, context, conditioning)
            if guided:
                conditional, unconditional = velocity.chunk(2)
                velocity = unconditional + guidance_scale * (conditional - unconditional)
            x = x + (sigmas[i + 1] - sigmas[i]) * velocity
        clean[:, :, start : start + block] = x
    return clean


def reflow_pairs(
    policy,
    captions: list[str],
    seed: int = 0,
    num_steps: int = 8,
    batch_size: int = 64,
    guidance_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(noise, x0, prompt_embeds)`` of reflow: seeded noise, its ODE sample
    (:func:`ode_video_samples`, guided by ``guidance_scale`` against the empty caption when it is
    not 1) and the captions' embeddings (the pipeline's ``encode_prompt``). Trained on guided pairs,
    the student draws the guided teacher's videos without guidance, as Self-Forcing's students of
    guided Wan sample at guidance 1."""
    embeds = prompt_embeddings(policy.pipeline, captions)
    negative = prompt_embeddings(policy.pipeline, [""]) if float(guidance_scale) != 1.0 else None
    channels = int(policy.denoiser.config.in_channels)
    side = VIDEO_SIZE // int(policy.pipeline.vae_scale_factor_spatial)
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(len(captions), channels, NUM_FRAMES, side, side, generator=generator)
    x0 = torch.cat(
        [
            ode_video_samples(
                policy,
                noise[i : i + batch_size],
                embeds[i : i + batch_size],
                num_steps,
                guidance_scale,
                negative,
            )
            for i in range(0, len(captions), batch_size)
        ]
    )
    return noise, x0, embeds


def train_reflow(
    init: str | Path,
    out: str | Path | None = None,
    num_videos: int = 2000,
    ode_steps: int = 8,
    steps: int = 2000,
    batch_size: int = 16,
    lr: float = 5e-4,
    seed: int = 0,
    ema_decay: float = 0.99,
    max_minutes: float | None = None,
    log_every: int = 100,
    guidance_scale: float = 1.0,
) -> tuple[Any, dict[str, Any]]:
    """Reflow a stage-1 toy-ar-video folder ``init`` (module docstring): ``num_videos`` ODE pairs
    of train captions, then ``steps`` steps of :func:`diffusion_forcing_loss` on them with the
    paired noise, AdamW and an EMA of the weights (saved). The pairs' sampling counts in
    ``train_seconds``. ``guidance_scale``: the teacher's classifier-free guidance when drawing the
    pairs (:func:`reflow_pairs`; the stage-1 model must have been trained with caption dropout).
    Returns ``(pipeline, info)``."""
    from genalign.policies import load_policy

    torch.manual_seed(seed)
    start = time.time()
    policy = load_policy("ar_video", str(init), train=False)
    pipe, transformer = policy.pipeline, policy.denoiser
    captions = train_captions(num_videos, seed + 7000)
    noise, x0, embeds = reflow_pairs(policy, captions, seed, ode_steps, guidance_scale=guidance_scale)
    transformer.requires_grad_(True)
    training = AveragedTraining.of([transformer], lr, steps, ema_decay, max_warmup=100)
    transformer.train()
    log = TrainingLog(log_every, steps, "toy-ar-video reflow")
    loss_fn = minibatch_forcing_loss(transformer, x0, embeds, batch_size, seed, noise)

    def pipeline(average) -> tuple[Any, dict[str, Any]]:
        pipe.transformer = average
        pipe.register_modules(transformer=average)
        return pipe, {"transformer": average, "text_encoder": pipe.text_encoder, "vae": pipe.vae}

    return train_and_save(training, loss_fn, log, start, pipeline, out, max_minutes)
