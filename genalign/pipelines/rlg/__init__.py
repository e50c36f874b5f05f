"""RLG: reinforcement learning guidance (Jin et al. 2025).

RL fine-tuning with a KL penalty of strength ``beta`` to a reference model yields the tilted
distribution ``p_RL(x) ∝ p_ref(x) exp(r(x) / beta)``. RLG reads the two models as a CFG pair and
combines their (already classifier-free-guided) predictions with a geometric average,

    v = v_ref + w (v_RL - v_ref)                                   (per step; the paper's RLG update)

which samples ``p_ref^(1 - w) p_RL^w ∝ p_ref exp(w r / beta)``: ``w`` rescales the KL
coefficient to ``beta / w`` at inference, without retraining. ``w = 0`` is the reference model,
``w = 1`` the RL-tuned one, ``w > 1`` extrapolates. ``v`` is whatever the denoiser predicts
(epsilon or v for SD UNets, velocity for flow transformers); both branches run the same CFG
(``guidance_scale``, same negative prompt) before they are combined, as in the paper.

The RL-tuned model is given either as a LoRA on the base pipeline (the reference is the same
model with the adapter disabled: one model in memory) or as a second denoiser ``rl_unet`` /
``rl_transformer``. Families: :class:`RLGStableDiffusionPipeline` (SD 1.x/2.x UNets; DDIM,
Euler, any diffusers scheduler), :class:`RLGStableDiffusionXLPipeline` (SDXL),
:class:`RLGStableDiffusion3Pipeline` (SD3 / SD3.5, flow matching), :class:`RLGFluxPipeline`
(FLUX.1-dev, whose embedded guidance makes each branch's prediction already guided, and
FLUX.1-schnell) and :class:`RLGSanaPipeline` (SANA); :class:`RLGPipeline` picks one.

One module per family (``sd``, ``sdxl``, ``sd3``, ``flux``, ``sana``: its defaults and its
``_sample`` stages); ``common`` holds what every family shares (the two-branch machinery, the
``__init__`` and ``__call__`` signatures, the sampling loop), ``dispatch`` :class:`RLGPipeline`,
and :mod:`genalign.pipelines.guidance` the CFG and RLG formulas.
"""

from __future__ import annotations

from genalign.pipelines.guidance import rlg_combine
from genalign.pipelines.rlg.common import RLGPipelineOutput
from genalign.pipelines.rlg.dispatch import RLGPipeline
from genalign.pipelines.rlg.flux import RLGFluxPipeline
from genalign.pipelines.rlg.sana import RLGSanaPipeline
from genalign.pipelines.rlg.sd import RLGStableDiffusionPipeline
from genalign.pipelines.rlg.sd3 import RLGStableDiffusion3Pipeline
from genalign.pipelines.rlg.sdxl import RLGStableDiffusionXLPipeline

__all__ = [
    "RLGPipeline",
    "RLGFluxPipeline",
    "RLGPipelineOutput",
    "RLGSanaPipeline",
    "RLGStableDiffusion3Pipeline",
    "RLGStableDiffusionPipeline",
    "RLGStableDiffusionXLPipeline",
    "rlg_combine",
]
