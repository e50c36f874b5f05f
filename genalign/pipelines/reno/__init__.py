"""ReNO: reward-based noise optimisation of one-step / few-step text-to-image models.

Eyring et al., "ReNO: Enhancing One-step Text-to-Image Models through Reward-based Noise
Optimization", NeurIPS 2024. The generator's weights stay frozen; the *initial noise* ``z`` is
the parameter. Each iteration generates ``x = G(z, prompt)`` (differentiably, with the same
scheduler noise), scores it with a weighted reward ensemble, and takes one gradient step on

    L(z) = -sum_i w_i R_i(G(z), prompt) + lambda * K(z)                          (the paper's objective)
    K(z) = ||z||^2 / 2 - (d - 1) log ||z||                                       (the norm regulariser)

``K`` is the negative log-density of the chi distribution of ``||z||`` for ``z ~ N(0, I_d)``
(up to a constant); its minimiser ``||z|| = sqrt(d - 1)`` is the chi mode, so the optimised
noise stays on the Gaussian shell the generator was trained on. The default optimiser is SGD
with Nesterov momentum 0.9 and learning rate 5.0 on gradients clipped to norm 0.1, lambda = 0.01,
as in the paper's code; the image returned is the best over all iterations, not the last.

Supported generators (the paper's four one-step models and more):

* :class:`ReNOStableDiffusionPipeline` — Stable-Diffusion-layout UNets with any diffusers scheduler: sd-turbo
  (``num_inference_steps=1``, ``guidance_scale=0``), LCM (guidance as a ``timestep_cond``
  embedding), few-step SD with CFG;
* :class:`ReNOStableDiffusionXLPipeline` — sdxl-turbo (pooled text embeddings + ``add_time_ids``);
* :class:`ReNOFluxPipeline` — FLUX.1-schnell (packed latents, flow matching, no guidance
  embedding) and FLUX.1-dev (embedded guidance);
* :class:`ReNOPixArtAlphaPipeline` — PixArt-alpha DMD (one DDPM step at t = 400, x0 estimate).

:class:`ReNOPipeline` (``from_pretrained`` / ``from_pipe``) picks the right class from the model.
One module per family (``sd``, ``sdxl``, ``flux``, ``pixart``; ``unet`` is the UNet generator SD
and SDXL share), ``objective`` holds the loss, ``common`` the optimisation loop and
``dispatch`` :class:`ReNOPipeline`.
"""

from __future__ import annotations

from genalign.pipelines.reno.common import ReNOPipelineOutput
from genalign.pipelines.reno.dispatch import ReNOPipeline
from genalign.pipelines.reno.flux import ReNOFluxPipeline
from genalign.pipelines.reno.objective import (
    RENO_REWARD_KWARGS,
    RENO_REWARD_WEIGHTS,
    build_reward_ensemble,
    norm_regularizer,
)
from genalign.pipelines.reno.pixart import ReNOPixArtAlphaPipeline
from genalign.pipelines.reno.sd import ReNOStableDiffusionPipeline
from genalign.pipelines.reno.sdxl import ReNOStableDiffusionXLPipeline

__all__ = [
    "RENO_REWARD_KWARGS",
    "RENO_REWARD_WEIGHTS",
    "ReNOFluxPipeline",
    "ReNOPipeline",
    "ReNOPipelineOutput",
    "ReNOPixArtAlphaPipeline",
    "ReNOStableDiffusionPipeline",
    "ReNOStableDiffusionXLPipeline",
    "build_reward_ensemble",
    "norm_regularizer",
]
