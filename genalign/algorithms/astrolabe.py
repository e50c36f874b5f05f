"""Astrolabe's forward-process loss in x0 space and its old-policy schedule (arXiv 2603.17051).

Astrolabe trains distilled autoregressive video generators (Self-Forcing, Causal Forcing,
LongLive) with DiffusionNFT's implicit positive and negative policies on the *forward* process,
so no sampler chain is replayed. This module is its pure math as the official trainer runs it
(``franklinz233/Astrolabe`` @ 35a5347, ``scripts/train_nft_wan.py``); the selective KL of its
multi-reward runs is :mod:`.selective_kl`. Per optimiser step:

* advantages ``A = clip((R - mean_prompt) / (std_batch + 1e-4), -5, 5)`` (``PerPromptStatTracker``
  with ``global_std=True``) and the optimality probability ``r = clip(A / 10 + 1/2, 0, 1)``;
* one noise level per minibatch, drawn uniformly from the rollout grid {1000, 750, 500, 250}, the
  same for every latent frame: ``t = timestep / 1000`` (not warped), ``x_t = (1 - t) x0 + t eps``;
* with x0 predictions of the trained, old and reference model at x_t,

      x0+ = beta x0_theta + (1 - beta) x0_old,      x0- = (1 + beta) x0_old - beta x0_theta
      L = mean_i[ r_i mean|x0+ - x0|^2 + (1 - r_i) mean|x0- - x0|^2 ] + lambda mean|x0_theta - x0_ref|^2

  (inner means over every non-batch dimension: channels, frames, height, width), beta = 0.1 and
  lambda = 1e-4 (1e-3 in the 16/24-GPU Self-Forcing configs); no adaptive weighting and no c/beta
  factor, unlike DiffusionNFT (both are options here, off by default);
* after each epoch the old policy moves by ``theta_old <- eta theta_old + (1 - eta) theta`` with
  ``eta = min(0.001 * optimizer_steps, 0.5)`` (``return_decay``, ``decay_type=1``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from genalign.algorithms.advantages import clip_advantages, group_advantages
from genalign.algorithms.nft import nft_loss_in_x0, nft_old_policy_decay

__all__ = [
    "ASTROLABE_TIMESTEPS",
    "astrolabe_advantages",
    "astrolabe_loss",
    "astrolabe_old_policy_decay",
    "chunked_masked_mean",
    "draw_window_start",
    "flow_forward_noise",
    "frame_timesteps",
    "masked_sample_mean",
    "sample_noise_level",
    "soft_update_",
    "window_pixel_frames",
]

# The rollout grid of every Wan config (``sample.denoising_step_list``), of which training draws one.
ASTROLABE_TIMESTEPS: tuple[int, ...] = (1000, 750, 500, 250)


def astrolabe_advantages(
    rewards: torch.Tensor,
    prompts: torch.Tensor | Sequence[Any] | int,
    eps: float = 1e-4,
    advantage_clip: float = 5.0,
) -> torch.Tensor:
    """``A = clip((R - mean_prompt) / (std_batch + eps), -c, c)`` ``[B]``.

    The official ``PerPromptStatTracker(global_std=True)`` (``astrolabe/stat_tracking.py``, cleared
    every epoch): each reward is centred on the mean of its prompt's rewards in the batch and
    divided by the population std of the whole batch plus 1e-4; the trainer clamps to
    ``train.adv_clip_max`` = 5. ``prompts`` is one prompt (or id) per sample, or a group size.
    """
    return clip_advantages(group_advantages(rewards, prompts, std="global", eps=eps), advantage_clip)


def sample_noise_level(
    generator: torch.Generator | None = None,
    timesteps: Sequence[int] = ASTROLABE_TIMESTEPS,
    num_train_timesteps: int = 1000,
) -> tuple[int, float]:
    """One minibatch's noise level: ``(timestep, t)`` with ``t = timestep / num_train_timesteps``.

    The official trainer draws an index uniformly from ``sample.denoising_step_list`` (Python's
    ``random.randint``) per minibatch, and uses the unwarped grid value both as the model's
    timestep for every frame and, over 1000, as the flow time of x_t. Here the draw comes from
    ``generator`` (a CPU ``torch.Generator``), so a run keyed by its seed replays it exactly.
    """
    if not timesteps:
        raise ValueError("timesteps must name at least one noise level")
    index = int(torch.randint(len(timesteps), (1,), generator=generator).item())
    timestep = int(timesteps[index])
    return timestep, timestep / num_train_timesteps


def draw_window_start(
    generator: torch.Generator | None, num_frames: int, window_frames: int, block_size: int
) -> int:
    """A streaming window's first latent frame, uniform over the block starts that fit.

    The window ``[start, start + window_frames)`` must lie inside ``num_frames`` latent frames and
    start at a block, so the candidates are ``0, k, 2k, ...`` up to ``num_frames - window_frames``
    (each equally likely: the released streaming config's ``window_selection = "random_choice"``).
    A window as long as the video, or longer, starts at 0.
    """
    if block_size <= 0 or window_frames <= 0:
        raise ValueError(f"block_size {block_size} and window_frames {window_frames} must be positive")
    if window_frames % block_size:
        raise ValueError(
            f"train.astrolabe.window_frames {window_frames} must be a multiple of the model's block size {block_size}"
        )
    choices = max(num_frames - window_frames, 0) // block_size + 1
    return int(torch.randint(choices, (1,), generator=generator).item()) * block_size


def window_pixel_frames(start: int, stop: int, temporal_factor: int) -> tuple[int, int]:
    """Pixel frames ``[first, end)`` decoded from latent frames ``[start, stop)`` of a causal video
    VAE that keeps the first frame alone and packs ``temporal_factor`` frames into each later
    latent frame (Wan: 4, so 21 latent frames are 81 pixel frames; a VAE without temporal
    compression: 1, the identity)."""
    if not 0 <= start < stop or temporal_factor < 1:
        raise ValueError(
            f"latent frames [{start}, {stop}) and temporal factor {temporal_factor} are not a window"
        )
    first = 0 if start == 0 else 1 + (start - 1) * temporal_factor
    return first, 1 + (stop - 1) * temporal_factor


def frame_timesteps(
    timestep: int | Sequence[int] | torch.Tensor,
    batch_size: int,
    num_frames: int,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The model's per-frame timesteps ``[B, F]`` (long), every frame of a sample at one level (the
    official ``torch.ones([B, F], dtype=long) * current_t``): ``timestep`` one level for the whole
    batch, or ``[B]`` levels, one a sample."""
    if isinstance(timestep, int):
        return torch.full((batch_size, num_frames), int(timestep), dtype=torch.long, device=device)
    per_sample = torch.as_tensor(timestep, dtype=torch.long, device=device).reshape(-1)
    if per_sample.shape[0] != batch_size:
        raise ValueError(f"{per_sample.shape[0]} levels for {batch_size} samples")
    return per_sample[:, None].expand(batch_size, num_frames).contiguous()


def flow_forward_noise(x0: torch.Tensor, noise: torch.Tensor, t: float | torch.Tensor) -> torch.Tensor:
    """Rectified-flow forward process ``x_t = (1 - t) x0 + t eps`` (``[B, ...]``): ``t`` one time for
    all, or a ``[B]`` tensor of times, one a sample."""
    if torch.is_tensor(t) and t.ndim == 1:
        t = t.to(device=x0.device, dtype=x0.dtype).reshape(-1, *([1] * (x0.ndim - 1)))
    return (1 - t) * x0 + t * noise


def masked_sample_mean(per_sample: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of ``per_sample`` ``[B]`` over the samples where ``mask`` ``[B]`` (bool) is true.

    No mask: the plain mean. An all-false mask gives 0 that still belongs to the graph, as the
    official selective KL does (``(...).mean(dims) * 0``).
    """
    if mask is None:
        return per_sample.mean()
    mask = mask.to(device=per_sample.device, dtype=torch.bool).reshape(-1)
    if mask.shape[0] != per_sample.shape[0]:
        raise ValueError(f"mask has {mask.shape[0]} entries for {per_sample.shape[0]} samples")
    if not bool(mask.any()):
        return (per_sample * 0).mean()
    return per_sample[mask].mean()


def chunked_masked_mean(
    per_sample: torch.Tensor, mask: torch.Tensor | None = None, chunk_size: int | None = None
) -> torch.Tensor:
    """The mean over consecutive chunks of ``chunk_size`` samples of each chunk's
    :func:`masked_sample_mean` (a last, shorter chunk counts as one chunk); ``None``: one chunk.

    The official trainer takes the selective KL's masked mean within each GPU's minibatch of
    ``train.batch_size`` (3) samples and DDP then averages the GPUs, so a chunk whose mask selects
    nothing adds 0 to the average. Without a mask and with equal chunks this is the plain mean.
    """
    if chunk_size is None or chunk_size >= per_sample.shape[0]:
        return masked_sample_mean(per_sample, mask)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if mask is not None:
        mask = mask.to(device=per_sample.device, dtype=torch.bool).reshape(-1)
        if mask.shape[0] != per_sample.shape[0]:
            raise ValueError(f"mask has {mask.shape[0]} entries for {per_sample.shape[0]} samples")
    chunks = [
        masked_sample_mean(per_sample[i : i + chunk_size], None if mask is None else mask[i : i + chunk_size])
        for i in range(0, per_sample.shape[0], chunk_size)
    ]
    return torch.stack(chunks).mean()


def astrolabe_loss(
    x0_theta: torch.Tensor,
    x0_old: torch.Tensor,
    x0_ref: torch.Tensor,
    x0: torch.Tensor,
    advantages: torch.Tensor,
    *,
    beta: float = 0.1,
    kl_weight: float = 1e-4,
    advantage_clip: float = 5.0,
    kl_mask: torch.Tensor | None = None,
    kl_chunk_size: int | None = None,
    adaptive_weighting: bool = False,
    clip_over_beta: bool = False,
    weight_min: float = 1e-5,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Astrolabe's minibatch loss (scalar) in x0 space (module docstring; ``train_nft_wan.py``).

    The policy term is :func:`.nft.nft_loss_in_x0` with the x0 prediction as the regressed
    output: per sample ``r mean|x0+ - x0|^2 + (1 - r) mean|x0- - x0|^2`` over every non-batch
    dimension, then the batch mean. The KL term is ``mean|x0_theta - x0_ref|^2`` per sample,
    averaged over the batch, or over the samples ``kl_mask`` selects (:mod:`.selective_kl`;
    0 when it selects none), times ``kl_weight`` (lambda). With ``kl_chunk_size`` the masked mean
    is taken within consecutive chunks of that many samples and then averaged over the chunks
    (:func:`chunked_masked_mean`: the official per-GPU minibatch).

    Args:
        x0_theta: ``[B, ...]`` x0 prediction of the trained policy at x_t (with gradients); for
            video ``[B, F, C, H, W]`` or ``[B, C, F, H, W]``, the reduction does not care.
        x0_old: ``[B, ...]`` the old policy's x0 prediction (detached here).
        x0_ref: ``[B, ...]`` the reference's: the adapter-disabled distilled model, or the
            lagging ``old_ref`` adapter under selective KL (detached here).
        x0: ``[B, ...]`` the clean rollout latents.
        advantages: ``[B]`` advantages (:func:`astrolabe_advantages`); r = clip(A / 2c + 1/2, 0, 1).
        beta: NFT's mixing strength (0.1 in every Astrolabe config).
        kl_weight: lambda (the official ``train.beta``), 1e-4 or 1e-3.
        kl_mask: ``[B]`` bool, the samples the KL applies to; ``None`` applies it to all.
        kl_chunk_size: the chunk of samples the (masked) KL mean is taken within; ``None``: all.
        adaptive_weighting / clip_over_beta / weight_min: DiffusionNFT's options (off by default,
            as Astrolabe); both on gives :func:`.nft.nft_loss_in_x0` exactly.

    Returns:
        ``(loss, info)``; ``info["astrolabe_kl_loss"]`` is the (masked) KL before lambda, the
        value the selective KL's reset rule watches.
    """
    per_sample, info = nft_loss_in_x0(
        x0_theta,
        x0_old,
        x0,  # the regressed target: the clean latents
        x0_theta,
        x0_old,
        x0,
        advantages.to(device=x0.device, dtype=x0.dtype),
        beta=beta,
        advantage_clip=advantage_clip,
        adaptive_weighting=adaptive_weighting,
        weight_min=weight_min,
        clip_over_beta=clip_over_beta,
    )
    policy_loss = per_sample.mean()
    dims = tuple(range(1, x0.ndim))
    x0_ref = x0_ref.detach()
    kl_per_sample = ((x0_theta - x0_ref) ** 2).mean(dims)  # [B]
    kl_loss = chunked_masked_mean(kl_per_sample, kl_mask, kl_chunk_size)
    loss = policy_loss + kl_weight * kl_loss
    info.update(
        {
            "astrolabe_policy_loss": policy_loss.detach(),
            "astrolabe_kl_loss": kl_loss.detach(),
            "astrolabe_kl_div": kl_per_sample.detach().mean(),  # unmasked, the official "kl_div"
            "astrolabe_old_kl_div": ((x0_old.detach() - x0_ref) ** 2).mean(),
        }
    )
    if kl_mask is not None:
        info["astrolabe_kl_fraction"] = kl_mask.detach().to(torch.float32).mean()
    return loss, info


def astrolabe_old_policy_decay(optimizer_steps: int, rate: float = 0.001, maximum: float = 0.5) -> float:
    """eta = min(rate * optimizer_steps, maximum) of the old policy's per-epoch soft update.

    The official ``return_decay(global_step, decay_type=1)``, evaluated after the epoch's
    optimiser steps; DiffusionNFT's schedule (:func:`.nft.nft_old_policy_decay`) with no flat part.
    """
    return nft_old_policy_decay(optimizer_steps, rate=rate, maximum=maximum, flat=0)


@torch.no_grad()
def soft_update_(targets: Iterable[torch.Tensor], sources: Iterable[torch.Tensor], decay: float) -> None:
    """In place, ``target <- decay * target + (1 - decay) * source`` for each pair.

    The old policy's update (``decay`` = eta, :func:`astrolabe_old_policy_decay`): 0 copies the
    current weights, 1 keeps the old ones. ``targets`` and ``sources`` are parallel lists
    (parameters or plain tensors) of equal shapes; a source is cast to its target's dtype.
    """
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay must lie in [0, 1], got {decay}")
    targets, sources = list(targets), list(sources)
    if len(targets) != len(sources):
        raise ValueError(f"got {len(targets)} targets for {len(sources)} sources")
    for i, (target, source) in enumerate(zip(targets, sources)):
        if target.shape != source.shape:
            raise ValueError(f"pair {i}: target shape {list(target.shape)} != source {list(source.shape)}")
        target.mul_(decay).add_(source.detach().to(target.device, target.dtype), alpha=1.0 - decay)
