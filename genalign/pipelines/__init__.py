"""Inference-time alignment pipelines (diffusers ``DiffusionPipeline`` subclasses).

* :class:`ReNOPipeline` — reward-based noise optimisation (Eyring et al., NeurIPS 2024) of
  sd-turbo / LCM (SD UNets), sdxl-turbo, FLUX.1-schnell and PixArt-alpha DMD.
* :class:`RLGPipeline` — reinforcement learning guidance (Jin et al. 2025): the base and the
  RL-tuned model combined at inference, for the SD (SD 1.x/2.x, SDXL) and flow (SD3, FLUX,
  SANA) families.

Layout: ``reno/`` and ``rlg/`` hold one module per model family; :mod:`.families` is the one
table of model families (diffusers class name -> policy family, RLG and ReNO pipelines);
:mod:`.guidance` the CFG / RLG formulas every family shares. Names are imported on first use,
so reading :mod:`.families` (the CLI does) imports no model library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from genalign.utils.lazy import lazy_exports

_EXPORTS = {
    "RENO_REWARD_KWARGS": "reno",
    "RENO_REWARD_WEIGHTS": "reno",
    "ReNOFluxPipeline": "reno",
    "ReNOPipeline": "reno",
    "ReNOPipelineOutput": "reno",
    "ReNOPixArtAlphaPipeline": "reno",
    "ReNOStableDiffusionPipeline": "reno",
    "ReNOStableDiffusionXLPipeline": "reno",
    "build_reward_ensemble": "reno",
    "norm_regularizer": "reno",
    "RLGFluxPipeline": "rlg",
    "RLGPipeline": "rlg",
    "RLGPipelineOutput": "rlg",
    "RLGSanaPipeline": "rlg",
    "RLGStableDiffusion3Pipeline": "rlg",
    "RLGStableDiffusionPipeline": "rlg",
    "RLGStableDiffusionXLPipeline": "rlg",
    "rlg_combine": "rlg",
    "apply_guidance": "guidance",
    "MODEL_FAMILIES": "families",
}

__all__ = sorted(_EXPORTS)  # exported lazily: importing genalign.pipelines loads no diffusers pipeline

if TYPE_CHECKING:  # the same names, for type checkers
    from genalign.pipelines.families import MODEL_FAMILIES as MODEL_FAMILIES
    from genalign.pipelines.guidance import apply_guidance as apply_guidance
    from genalign.pipelines.reno import *  # noqa: F403
    from genalign.pipelines.rlg import *  # noqa: F403


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
