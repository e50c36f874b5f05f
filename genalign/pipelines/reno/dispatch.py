"""``ReNOPipeline``: the entry point that picks a family's ReNO pipeline."""

from __future__ import annotations

from typing import Any

from genalign.pipelines.families import PipelineDispatcher

__all__ = ["ReNOPipeline"]


class ReNOPipeline(PipelineDispatcher):
    """Reward-based Noise Optimization (Eyring et al., NeurIPS 2024) for one-/few-step models:
    picks the family's ReNO pipeline.

    ``ReNOPipeline.from_pretrained(folder_or_hub_id)`` and ``ReNOPipeline.from_pipe(pipe)`` read
    the model's pipeline class (its class hierarchy for ``from_pipe``) and return the matching
    ReNO pipeline: :class:`ReNOStableDiffusionPipeline` for SD-layout UNets (sd-turbo, LCM,
    ``tiny:lcm``), :class:`ReNOStableDiffusionXLPipeline` (sdxl-turbo), :class:`ReNOFluxPipeline`
    (FLUX.1-schnell) and :class:`ReNOPixArtAlphaPipeline` (PixArt-alpha DMD); the table is
    :data:`genalign.pipelines.families.MODEL_FAMILIES`. Built from components
    (``ReNOPipeline(vae=..., text_encoder=..., tokenizer=..., unet=..., scheduler=...)``) it is
    the SD-layout pipeline, as before the families were split.
    """

    method = "reno"
    from_pipe_matches_subclasses = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from genalign.pipelines.reno.sd import ReNOStableDiffusionPipeline

        return ReNOStableDiffusionPipeline(*args, **kwargs)
