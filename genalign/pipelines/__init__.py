"""Inference-time alignment pipelines (diffusers ``DiffusionPipeline`` subclasses).

* :class:`ReNOPipeline` — reward-based noise optimisation (Eyring et al., NeurIPS 2024) of
  sd-turbo / LCM (SD UNets), sdxl-turbo, FLUX.1-schnell and PixArt-alpha DMD.
* :class:`RLGPipeline` — reinforcement learning guidance (Jin et al. 2025): the base and the
  RL-tuned model combined at inference, for the SD (SD 1.x/2.x, SDXL) and flow (SD3, FLUX,
  SANA) families.
"""

from __future__ import annotations

from genalign.pipelines.reno import (
    RENO_REWARD_WEIGHTS,
    ReNOFluxPipeline,
    ReNOPipeline,
    ReNOPipelineOutput,
    ReNOPixArtAlphaPipeline,
    ReNOStableDiffusionXLPipeline,
    build_reward_ensemble,
    norm_regularizer,
)
from genalign.pipelines.rlg import (
    RLGFluxPipeline,
    RLGPipeline,
    RLGPipelineOutput,
    RLGSanaPipeline,
    RLGStableDiffusion3Pipeline,
    RLGStableDiffusionPipeline,
    RLGStableDiffusionXLPipeline,
    rlg_combine,
)

__all__ = [
    "RENO_REWARD_WEIGHTS",
    "ReNOFluxPipeline",
    "ReNOPixArtAlphaPipeline",
    "ReNOStableDiffusionXLPipeline",
    "RLGFluxPipeline",
    "RLGPipeline",
    "RLGPipelineOutput",
    "RLGSanaPipeline",
    "RLGStableDiffusion3Pipeline",
    "RLGStableDiffusionPipeline",
    "RLGStableDiffusionXLPipeline",
    "ReNOPipeline",
    "ReNOPipelineOutput",
    "build_reward_ensemble",
    "norm_regularizer",
    "rlg_combine",
]
