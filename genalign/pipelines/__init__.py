"""Inference-time alignment pipelines (diffusers ``DiffusionPipeline`` subclasses).

* :class:`ReNOPipeline` — reward-based noise optimisation (Eyring et al., NeurIPS 2024).
* :class:`RLGPipeline` — reinforcement learning guidance (Jin et al. 2025): the base and the
  RL-tuned model combined at inference, for the SD (UNet) and flow (SD3) families.
"""

from __future__ import annotations

from genalign.pipelines.reno import (
    RENO_REWARD_WEIGHTS,
    ReNOPipeline,
    ReNOPipelineOutput,
    build_reward_ensemble,
    norm_regularizer,
)
from genalign.pipelines.rlg import (
    RLGPipeline,
    RLGPipelineOutput,
    RLGStableDiffusion3Pipeline,
    RLGStableDiffusionPipeline,
    rlg_combine,
)

__all__ = [
    "RENO_REWARD_WEIGHTS",
    "RLGPipeline",
    "RLGPipelineOutput",
    "RLGStableDiffusion3Pipeline",
    "RLGStableDiffusionPipeline",
    "ReNOPipeline",
    "ReNOPipelineOutput",
    "build_reward_ensemble",
    "norm_regularizer",
    "rlg_combine",
]
