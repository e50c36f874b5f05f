"""Latents -> images through a KL VAE, shared by the ReNO and RLG pipelines."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import AutoencoderKL

__all__ = ["decode_kl", "unscale_latents"]


def unscale_latents(vae_config: Any, latents: torch.Tensor) -> torch.Tensor:
    """Denoiser latents ``[B, C, h, w]`` -> the VAE's latent scale: undo ``latents_mean`` /
    ``latents_std`` when the VAE config has them (as the SDXL pipeline does), else the scaling factor."""
    mean = getattr(vae_config, "latents_mean", None)
    std = getattr(vae_config, "latents_std", None)
    if mean is not None and std is not None:
        view = (1, latents.shape[1], 1, 1)
        mean = torch.tensor(mean).view(view).to(latents.device, latents.dtype)
        std = torch.tensor(std).view(view).to(latents.device, latents.dtype)
        return latents * std / vae_config.scaling_factor + mean
    return latents / vae_config.scaling_factor


def decode_kl(vae: AutoencoderKL, latents: torch.Tensor) -> torch.Tensor:
    """Latents ``[B, C, h, w]`` -> images ``[B, 3, H, W]`` in [0, 1] through a KL VAE, in the VAE's dtype."""
    latents = unscale_latents(vae.config, latents)
    image = vae.decode(latents.to(vae.dtype), return_dict=False)[0]
    return (image / 2 + 0.5).clamp(0, 1)  # (B, 3, H, W) in [0, 1]
