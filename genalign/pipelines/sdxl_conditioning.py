"""SDXL's prompt conditioning, shared by the ReNO and RLG SDXL pipelines."""

from __future__ import annotations

import torch
from diffusers import StableDiffusionXLPipeline

from genalign.pipelines.guidance import cfg_batch

__all__ = ["encode_sdxl_prompt"]


def encode_sdxl_prompt(
    pipe: StableDiffusionXLPipeline,
    prompt: str | list[str],
    negative_prompt: str | list[str] | None,
    num_images_per_prompt: int,
    do_cfg: bool,
    height: int,
    width: int,
    device: torch.device,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The UNet's text conditioning as ``StableDiffusionXLPipeline`` builds it: the two CLIP
    encoders' embeddings ``[N, 77, D]`` and ``added_cond_kwargs`` (the pooled embedding
    ``text_embeds`` and the size/crop ``time_ids`` with original = target = the image size, no
    crop); ``N = 2 B`` ordered ``[uncond; cond]`` under CFG, else ``B`` (prompts x images each)."""
    embeds, negative_embeds, pooled, negative_pooled = pipe.encode_prompt(
        prompt=prompt,
        device=device,
        num_images_per_prompt=num_images_per_prompt,
        do_classifier_free_guidance=do_cfg,
        negative_prompt=negative_prompt,
    )
    projection_dim = (
        int(pooled.shape[-1]) if pipe.text_encoder_2 is None else pipe.text_encoder_2.config.projection_dim
    )
    time_ids = pipe._get_add_time_ids(
        (height, width),
        (0, 0),
        (height, width),
        dtype=embeds.dtype,
        text_encoder_projection_dim=projection_dim,
    )
    embeds, pooled = cfg_batch(negative_embeds, embeds, do_cfg), cfg_batch(negative_pooled, pooled, do_cfg)
    time_ids = cfg_batch(time_ids, time_ids, do_cfg)
    batch = (1 if isinstance(prompt, str) else len(prompt)) * num_images_per_prompt
    time_ids = time_ids.to(device).repeat(batch, 1)
    return embeds.to(device), {"text_embeds": pooled.to(device), "time_ids": time_ids}
