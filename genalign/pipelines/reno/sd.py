"""ReNO (Eyring et al., NeurIPS 2024) for Stable-Diffusion-layout UNets: sd-turbo, LCM, few-step SD."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import AutoencoderKL, DiffusionPipeline, SchedulerMixin, UNet2DConditionModel
from transformers import CLIPImageProcessor, CLIPTextModel, CLIPTokenizer

from genalign.pipelines.reno.common import PromptRequest
from genalign.pipelines.reno.unet import UNetReNOMixin, lcm_guidance_embedding, lcm_timestep_cond

__all__ = ["ReNOStableDiffusionPipeline"]


class ReNOStableDiffusionPipeline(UNetReNOMixin, DiffusionPipeline):
    """Reward-based Noise Optimization (Eyring et al., NeurIPS 2024) for SD-layout UNets with any
    diffusers scheduler: sd-turbo (``num_inference_steps=1``, ``guidance_scale=0``), LCM
    (guidance as a ``timestep_cond`` embedding, ``tiny:lcm``), few-step SD with CFG.

    Built like any diffusers pipeline; ``ReNOPipeline.from_pretrained`` / ``from_pipe`` return
    this class for ``StableDiffusionPipeline`` and ``LatentConsistencyModelPipeline`` models.
    Components: ``vae``, ``text_encoder``, ``tokenizer``, ``unet``, ``scheduler``
    (``safety_checker`` and ``feature_extractor`` are accepted and ignored).
    """

    model_cpu_offload_seq = "text_encoder->unet->vae"
    _optional_components = ["safety_checker", "feature_extractor"]

    def __init__(
        self,
        vae: AutoencoderKL,
        text_encoder: CLIPTextModel,
        tokenizer: CLIPTokenizer,
        unet: UNet2DConditionModel,
        scheduler: SchedulerMixin,
        safety_checker: torch.nn.Module | None = None,
        feature_extractor: CLIPImageProcessor | None = None,
        requires_safety_checker: bool = False,
    ) -> None:
        super().__init__()
        self.register_modules(
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            unet=unet,
            scheduler=scheduler,
            safety_checker=safety_checker,
            feature_extractor=feature_extractor,
        )
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)

    @torch.no_grad()
    def encode_prompt(self, prompts: list[str], device: torch.device) -> torch.Tensor:
        """CLIP text embeddings ``[B, 77, D]`` (no gradient: the prompt is not optimised)."""
        tokens = self.tokenizer(
            prompts,
            padding="max_length",
            max_length=self.tokenizer.model_max_length,
            truncation=True,
            return_tensors="pt",
        )
        return self.text_encoder(tokens.input_ids.to(device))[0]

    guidance_embedding = staticmethod(lcm_guidance_embedding)

    def _encode(self, request: PromptRequest) -> dict[str, Any]:
        prompts, device = request.prompts, request.device
        embeds = self.encode_prompt(prompts, device)
        do_cfg = request.guidance_scale > 1.0 and self.unet.config.time_cond_proj_dim is None
        if do_cfg:
            negatives = request.negative_prompt or ""
            negatives = [negatives] * len(prompts) if isinstance(negatives, str) else list(negatives)
            embeds = torch.cat([self.encode_prompt(negatives, device), embeds])
        return {
            "embeds": embeds,
            "do_cfg": do_cfg,
            "timestep_cond": lcm_timestep_cond(self.unet, request.guidance_scale, len(prompts), do_cfg),
        }
