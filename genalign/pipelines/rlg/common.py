"""What every RLG pipeline shares (Jin et al. 2025): the reference and RL-tuned models as two
branches of one step, each branch's guided prediction, and their mix ``v_ref + w (v_RL - v_ref)``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import PIL.Image
import torch
from diffusers import DiffusionPipeline
from diffusers.utils import BaseOutput
from peft.tuners.tuners_utils import BaseTunerLayer

from genalign.pipelines.guidance import rlg_combine

__all__ = ["Branch", "RLGMixin", "RLGPipelineOutput", "StepCallback", "init_with_rl_denoiser"]

T = TypeVar("T")
Branch = tuple[str, Callable]
"""``("reference" | "rl", context manager yielding that branch's denoiser)``."""
StepCallback = Callable[[DiffusionPipeline, int, int, dict], dict]


@dataclass
class RLGPipelineOutput(BaseOutput):
    """Output of the RLG pipelines.

    Attributes:
        images: PIL list, ``np.ndarray`` ``[B, H, W, 3]`` or ``torch.Tensor`` ``[B, 3, H, W]``
            (or the final latents for ``output_type="latent"``).
    """

    images: list[PIL.Image.Image] | np.ndarray | torch.Tensor


def init_with_rl_denoiser(
    base: type[DiffusionPipeline], rl_denoiser_name: str, denoiser_type: type, **defaults: Any
) -> Callable[..., None]:
    """The ``__init__`` of an RLG pipeline: ``base.__init__`` (the wrapped diffusers pipeline's
    components, ``defaults`` replacing some of its defaults) plus one optional component,
    ``rl_denoiser_name``, the RL-tuned denoiser of the two-model form, registered like the rest.

    Its signature (the base's parameters, then ``rl_denoiser_name: denoiser_type | None = None``)
    is what diffusers reads to load, save and ``from_pipe`` the pipeline, so it is exact.
    """
    base_signature = inspect.signature(base.__init__)
    parameters = [
        parameter.replace(default=defaults.pop(parameter.name)) if parameter.name in defaults else parameter
        for parameter in base_signature.parameters.values()
    ]
    if defaults:
        raise TypeError(f"{base.__name__}.__init__ has no parameters {sorted(defaults)}")
    rl_parameter = inspect.Parameter(
        rl_denoiser_name,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=None,
        annotation=denoiser_type | None,
    )
    signature = base_signature.replace(parameters=[*parameters, rl_parameter])

    def __init__(self: DiffusionPipeline, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        components = {name: value for name, value in bound.arguments.items() if name != "self"}
        rl_denoiser = components.pop(rl_denoiser_name)
        base.__init__(self, **components)
        self.register_modules(**{rl_denoiser_name: rl_denoiser})

    __init__.__signature__ = signature
    __init__.__annotations__ = {
        parameter.name: parameter.annotation
        for parameter in signature.parameters.values()
        if parameter.annotation is not inspect.Parameter.empty
    }
    __init__.__annotations__["return"] = None
    return __init__


class RLGMixin:
    """Shared RLG machinery: which model is the reference, which the RL-tuned one, and how one
    step's two branches become one prediction.

    Every family's ``__call__`` samples with RLG: per step, guidance in each branch (CFG, or
    FLUX's embedded and true CFG), then ``v_ref + w (v_RL - v_ref)``. Its ``rlg_scale`` is
    ``w`` (0: reference model, 1: RL-tuned model, > 1: extrapolation); every other argument is
    the wrapped diffusers pipeline's, with its defaults.
    """

    _denoiser_name: str
    _rl_denoiser_name: str

    @property
    def rl_denoiser(self) -> torch.nn.Module | None:
        return getattr(self, self._rl_denoiser_name, None)

    def _lora_layers(self) -> list[BaseTunerLayer]:
        """Every peft adapter layer of every component (denoiser and text encoders), however
        it was injected (``load_lora_weights``, ``add_adapter``, ``inject_adapter_in_model``)."""
        return [
            layer
            for name, module in self.components.items()
            if isinstance(module, torch.nn.Module) and name != self._rl_denoiser_name
            for layer in module.modules()
            if isinstance(layer, BaseTunerLayer)
        ]

    def _check_rlg(self, rlg_scale: float) -> None:
        if self.rl_denoiser is None and not self._lora_layers():
            raise ValueError(
                "RLG needs an RL-tuned model: load its LoRA (pipe.load_lora_weights(path)) or pass "
                f"{self._rl_denoiser_name}=... (a second denoiser)"
            )
        if not np.isfinite(rlg_scale):
            raise ValueError(f"rlg_scale must be finite, got {rlg_scale}")

    @contextmanager
    def reference_model(self) -> Iterator[torch.nn.Module]:
        """The reference denoiser: the base model (LoRA disabled on every component) in the LoRA
        form, the pipeline's own denoiser in the two-model form."""
        denoiser = getattr(self, self._denoiser_name)
        if self.rl_denoiser is not None:
            yield denoiser
            return
        layers = [(layer, layer.disable_adapters) for layer in self._lora_layers()]
        for layer, _ in layers:
            layer.enable_adapters(False)  # the layer computes base_layer(x) exactly
        try:
            yield denoiser
        finally:
            for layer, was_disabled in layers:
                layer.enable_adapters(not was_disabled)

    @contextmanager
    def rl_model(self) -> Iterator[torch.nn.Module]:
        """The RL-tuned denoiser (``rl_*`` component, or the denoiser with its LoRA active)."""
        yield self.rl_denoiser if self.rl_denoiser is not None else getattr(self, self._denoiser_name)

    def _branches(self, rlg_scale: float) -> list[Branch]:
        """The branches to evaluate: w = 0 needs only the reference, w = 1 only the RL model."""
        if rlg_scale == 0.0:
            return [("reference", self.reference_model)]
        if rlg_scale == 1.0:
            return [("rl", self.rl_model)]
        return [("reference", self.reference_model), ("rl", self.rl_model)]

    # -- the stages every family's __call__ shares ----------------------------------------------
    @staticmethod
    def _encode_branches(branches: list[Branch], encode: Callable[[], T]) -> dict[str, T]:
        """The prompt encoded under each branch (a LoRA may touch the text encoders too)."""
        encoded: dict[str, T] = {}
        for name, model in branches:
            with model():
                encoded[name] = encode()
        return encoded

    @staticmethod
    def _rlg_prediction(
        branches: list[Branch], rlg_scale: float, predict: Callable[..., torch.Tensor], *args: object
    ) -> torch.Tensor:
        """One step's RLG prediction: ``predict(branch name, denoiser, *args)`` is a branch's
        guided prediction (CFG already applied); two branches are mixed as
        ``v_ref + w (v_RL - v_ref)`` (:func:`~genalign.pipelines.guidance.rlg_combine`)."""
        guided: dict[str, torch.Tensor] = {}
        for name, model in branches:
            with model() as denoiser:
                guided[name] = predict(name, denoiser, *args)
        if len(guided) == 1:
            return next(iter(guided.values()))
        return rlg_combine(guided["reference"], guided["rl"], rlg_scale)

    def _step_end(
        self, callback: StepCallback | None, step: int, timestep: torch.Tensor, latents: torch.Tensor
    ) -> torch.Tensor:
        """``callback_on_step_end``: it may replace the latents."""
        if callback is None:
            return latents
        outputs = callback(self, step, timestep, {"latents": latents})
        return (outputs or {}).get("latents", latents)

    def _rlg_output(self, image: object, return_dict: bool) -> RLGPipelineOutput | tuple:
        self.maybe_free_model_hooks()
        if not return_dict:
            return (image,)
        return RLGPipelineOutput(images=image)
