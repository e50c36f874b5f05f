"""A later toy-ar-video stage: guidance distillation, so the unguided few-step rollout draws what the
guided teacher does.

Meng et al. 2023, "On Distillation of Guided Diffusion Models" (CVPR), stage one (their eq. 5, in
velocity form): a student ``v_s(x_t, t, c)`` regresses the teacher's classifier-free-guided output

    v_w(x_t, t, c) = v(x_t, t, empty) + w (v(x_t, t, c) - v(x_t, t, empty))   (Ho & Salimans, eq. 6)

at points ``x_t`` of the forward process, so one conditional pass of the student replaces the
teacher's two. Here the points are diffusion forcing's (:func:`~genalign.toy.generators.video_train.
diffusion_forcing_timesteps`: clean context blocks, each later block at its own noise level, the
loss on the noisy frames only) on the latents of rendered training videos, with the same share of
first-block-only steps as the teacher's training. The student starts as a copy of the teacher (a
model trained with caption dropout, so it has an unconditional branch) and keeps its architecture.

Self-Forcing's own students are distilled from guided Wan and sample at guidance 1; Astrolabe's
rollouts sample them so (``ar_video`` refuses guidance). Measured on the shipped teacher
(docs/astrolabe.md, session 46): the teacher's unguided 8-step rollout draws 6.9% correct RL-held-out
videos, its guided one (w = 3) 12.5% on 80, and :func:`train_guidance_distillation` at its
defaults for 1,000 steps (17 CPU-minutes) 12.8% unguided in 8 steps (+5.9 [+2.7, +9.2] over the
teacher, the same 320 videos).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from genalign.policies.video_kv_cache import causal_forward
from genalign.toy.generators.train import train_and_save
from genalign.toy.generators.video import video_latents
from genalign.toy.generators.video_train import (
    NUM_TRAIN_TIMESTEPS,
    VIDEO_DATA_SEED_OFFSET,
    diffusion_forcing_timesteps,
    prompt_embeddings,
)
from genalign.toy.training import AveragedTraining, TrainingLog
from genalign.toy.video.data import toy_video_dataset

__all__ = ["guidance_distillation_loss", "guided_velocity", "train_guidance_distillation"]


@torch.no_grad()
def guided_velocity(
    teacher: Any,
    noised: torch.Tensor,
    timesteps: torch.Tensor,
    prompt_embeds: torch.Tensor,
    empty_embeds: torch.Tensor,
    guidance_scale: float,
) -> torch.Tensor:
    """The teacher's guided velocity ``v_u + w (v_c - v_u)`` at ``noised`` ``[B, C, F, h, w]`` and
    per-frame ``timesteps`` ``[B, F]`` (both branches in one batch; ``empty_embeds`` ``[1, L, D]``)."""
    batch = noised.shape[0]
    velocity = causal_forward(
        teacher,
        torch.cat([noised, noised]),
        torch.cat([timesteps, timesteps]),
        torch.cat([prompt_embeds, empty_embeds.expand(batch, *prompt_embeds.shape[1:]).to(prompt_embeds)]),
    ).float()
    conditional, unconditional = velocity.chunk(2)
    return unconditional + guidance_scale * (conditional - unconditional)


def guidance_distillation_loss(
    student: Any,
    teacher: Any,
    latents: torch.Tensor,
    prompt_embeds: torch.Tensor,
    empty_embeds: torch.Tensor,
    batch_size: int,
    seed: int,
    guidance_scale: float = 3.0,
    first_block_prob: float = 0.5,
) -> Callable[[int], torch.Tensor]:
    """A training step's loss (``loss_fn(step)``): the mean squared error between the student's
    conditional velocity and :func:`guided_velocity` over the noisy frames of ``batch_size`` videos
    drawn from ``latents`` ``[N, C, F, h, w]`` / ``prompt_embeds`` ``[N, L, D]``, noised as diffusion
    forcing does; with probability ``first_block_prob`` the step takes the first block alone (as
    :func:`~genalign.toy.generators.video_train.minibatch_forcing_loss`). All draws come from one
    generator seeded with ``seed``."""
    if not 0.0 <= first_block_prob <= 1.0:
        raise ValueError(f"first_block_prob must be in [0, 1], got {first_block_prob}")
    block = int(student.config.num_frame_per_block)
    generator = torch.Generator().manual_seed(seed)

    def loss_fn(step: int) -> torch.Tensor:
        index = torch.randint(len(latents), (batch_size,), generator=generator)
        videos, embeds = latents[index], prompt_embeds[index]
        if first_block_prob > 0 and float(torch.rand((), generator=generator)) < first_block_prob:
            videos = videos[:, :, :block]
        timesteps, noisy = diffusion_forcing_timesteps(videos.shape[0], videos.shape[2], block, generator)
        sigma = (timesteps / NUM_TRAIN_TIMESTEPS)[:, None, :, None, None]
        noise = torch.randn(videos.shape, generator=generator)
        noised = (1 - sigma) * videos + sigma * noise
        target = guided_velocity(teacher, noised, timesteps, embeds, empty_embeds, guidance_scale)
        error = (
            (causal_forward(student, noised, timesteps, embeds).float() - target).pow(2).mean(dim=(1, 3, 4))
        )
        return (error * noisy).sum() / noisy.sum().clamp(min=1)

    return loss_fn


def train_guidance_distillation(
    init: str | Path,
    out: str | Path | None = None,
    guidance_scale: float = 3.0,
    num_videos: int = 4000,
    steps: int = 1000,
    batch_size: int = 16,
    lr: float = 1e-4,
    seed: int = 11,
    ema_decay: float = 0.995,
    first_block_prob: float = 0.5,
    max_minutes: float | None = None,
    log_every: int = 200,
    videos: tuple[torch.Tensor, list[str]] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Distil the guided toy-ar-video folder ``init`` into a student that samples unguided (module
    docstring): ``num_videos`` rendered training videos (``toy_video_dataset`` of seed ``seed +
    VIDEO_DATA_SEED_OFFSET``, or ``videos`` given as ``(uint8 videos, captions)``), then ``steps``
    steps of :func:`guidance_distillation_loss`, AdamW with warm-up and cosine decay, and an EMA of
    the weights (saved to ``out``). Returns ``(pipeline, info)``."""
    from genalign.policies import load_policy

    torch.manual_seed(seed)
    start = time.time()
    policy = load_policy("ar_video", str(init), train=False)
    pipe = policy.pipeline
    teacher = copy.deepcopy(pipe.transformer).float().eval().requires_grad_(False)
    student = copy.deepcopy(pipe.transformer).float().train().requires_grad_(True)
    if videos is None:
        videos = toy_video_dataset(num_videos, seed=seed + VIDEO_DATA_SEED_OFFSET)
    latents = video_latents(pipe.vae, videos[0])
    embeds = prompt_embeddings(pipe, videos[1])
    empty = prompt_embeddings(pipe, [""])
    del videos
    training = AveragedTraining.of([student], lr, steps, ema_decay, max_warmup=100)
    log = TrainingLog(log_every, steps, "toy-ar-video guidance distillation")
    loss_fn = guidance_distillation_loss(
        student, teacher, latents, embeds, empty, batch_size, seed, guidance_scale, first_block_prob
    )

    def pipeline(average) -> tuple[Any, dict[str, Any]]:
        pipe.register_modules(transformer=average)
        return pipe, {"transformer": average, "text_encoder": pipe.text_encoder, "vae": pipe.vae}

    return train_and_save(training, loss_fn, log, start, pipeline, out, max_minutes)
