"""``RLGPipeline``: the entry point that picks a family's RLG pipeline."""

from __future__ import annotations

from genalign.pipelines.families import PipelineDispatcher

__all__ = ["RLGPipeline"]


class RLGPipeline(PipelineDispatcher):
    """Reinforcement Learning Guidance (Jin et al. 2025): picks the family's RLG pipeline.

    Like diffusers' ``AutoPipelineForText2Image``: ``RLGPipeline.from_pretrained(path)`` reads
    the folder's pipeline class (SD -> :class:`RLGStableDiffusionPipeline`, SDXL ->
    :class:`RLGStableDiffusionXLPipeline`, SD3 -> :class:`RLGStableDiffusion3Pipeline`, FLUX ->
    :class:`RLGFluxPipeline`, SANA -> :class:`RLGSanaPipeline`; the table is
    :data:`genalign.pipelines.families.MODEL_FAMILIES`); ``RLGPipeline.from_pipe(pipe)`` shares
    an existing pipeline's modules (and its loaded LoRA). Then ``pipe.load_lora_weights(rl_lora)``
    (or ``rl_unet=`` / ``rl_transformer=``) and ``pipe(prompt, rlg_scale=w, ...)``.
    """

    method = "rlg"
