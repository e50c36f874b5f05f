"""What every RLG pipeline shares (Jin et al. 2025): the reference and RL-tuned models as two
branches of one step, each branch's guided prediction, and their mix ``v_ref + w (v_RL - v_ref)``;
the ``__init__`` and ``__call__`` signatures, and the sampling loop, written once for every family."""

from __future__ import annotations

import abc
import dataclasses
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import PIL.Image
import torch
from diffusers import DiffusionPipeline
from diffusers.utils import BaseOutput
from peft.tuners.tuners_utils import BaseTunerLayer

from genalign.pipelines.guidance import apply_guidance, rlg_combine
from genalign.utils.quiet import quiet_messages

__all__ = [
    "Branch",
    "RLGCall",
    "RLGMixin",
    "RLGPipelineOutput",
    "StepCallback",
    "init_with_rl_denoiser",
    "rlg_call",
]

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


@dataclass(kw_only=True)
class RLGCall:
    """The arguments of one RLG ``__call__``: the union of the families' parameters, in the order
    they all share. Every family takes the common ones; the options (``_FAMILY_OPTIONS``) only
    the families that name them in :func:`rlg_call`, which also sets each family's defaults."""

    prompt: str | list[str]
    rlg_scale: float = 1.0
    num_inference_steps: int
    guidance_scale: float
    negative_prompt: str | list[str] | None = None
    true_cfg_scale: float = 1.0
    height: int | None = None
    width: int | None = None
    num_images_per_prompt: int = 1
    eta: float = 0.0
    generator: torch.Generator | list[torch.Generator] | None = None
    latents: torch.Tensor | None = None
    output_type: str = "pil"
    return_dict: bool = True
    callback_on_step_end: StepCallback | None = None
    clean_caption: bool = False
    use_resolution_binning: bool = True
    max_sequence_length: int | None = None
    complex_human_instruction: list[str] | None = None

    @property
    def num_images(self) -> int:
        """Images to sample: prompts x ``num_images_per_prompt``."""
        return (1 if isinstance(self.prompt, str) else len(self.prompt)) * self.num_images_per_prompt


_FAMILY_OPTIONS = frozenset(
    {
        "true_cfg_scale",
        "eta",
        "clean_caption",
        "use_resolution_binning",
        "max_sequence_length",
        "complex_human_instruction",
    }
)


def rlg_call(base: type[DiffusionPipeline], **defaults: Any) -> Callable[..., RLGPipelineOutput | tuple]:
    """The ``__call__`` of an RLG pipeline: the :class:`RLGCall` parameters common to every family
    plus the options named in ``defaults`` (e.g. ``eta``), with ``defaults`` as the defaults
    (those of the wrapped pipeline ``base``, ``num_inference_steps`` and ``guidance_scale`` always
    among them). It binds the arguments, checks ``rlg_scale`` and the RL-tuned model, and samples
    with the family's ``_sample(call)``.

    Its signature is exact (``inspect.signature``, ``help``), as if written out per family.
    """
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for field in dataclasses.fields(RLGCall):
        if field.name in _FAMILY_OPTIONS and field.name not in defaults:
            continue
        default = defaults.pop(field.name, field.default)
        parameters.append(
            inspect.Parameter(
                field.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=inspect.Parameter.empty if default is dataclasses.MISSING else default,
                annotation=field.type,
            )
        )
    if defaults:
        raise TypeError(f"RLGCall has no parameters {sorted(defaults)}")
    signature = inspect.Signature(parameters, return_annotation="RLGPipelineOutput | tuple")

    @torch.no_grad()
    def __call__(self: RLGMixin, *args: Any, **kwargs: Any) -> RLGPipelineOutput | tuple:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = {name: value for name, value in bound.arguments.items() if name != "self"}
        self._check_rlg(arguments["rlg_scale"])
        return self._sample(RLGCall(**arguments))

    __call__.__signature__ = signature
    __call__.__doc__ = (
        f"Sample with RLG, ``rlg_scale`` = ``w`` (:class:`RLGMixin`); the rest as ``{base.__name__}``."
    )
    return __call__


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


class RLGMixin(abc.ABC):
    """Shared RLG machinery: which model is the reference, which the RL-tuned one, and how one
    step's two branches become one prediction.

    Every family's ``__call__`` samples with RLG: per step, guidance in each branch (CFG, or
    FLUX's embedded and true CFG), then ``v_ref + w (v_RL - v_ref)``. Its ``rlg_scale`` is
    ``w`` (0: reference model, 1: RL-tuned model, > 1: extrapolation); every other argument is
    the wrapped diffusers pipeline's, with its defaults.

    A family declares its denoiser as class keywords, ``class RLGFluxPipeline(RLGMixin,
    FluxPipeline, denoiser="transformer", denoiser_type=FluxTransformer2DModel)`` (any further
    keyword replaces a default of the base ``__init__``), which registers the optional ``rl_*``
    component and the ``__init__`` (:func:`init_with_rl_denoiser`); ``__call__ = rlg_call(...)``
    and ``_sample(call)`` (its body, with the shared stages below) do the rest.
    """

    _denoiser_name: str
    _rl_denoiser_name: str

    def __init_subclass__(
        cls, denoiser: str | None = None, denoiser_type: type | None = None, **init_defaults: Any
    ) -> None:
        super().__init_subclass__()
        if denoiser is None:  # a subclass of a family's pipeline inherits its components
            if denoiser_type is not None or init_defaults:
                raise TypeError(f"{cls.__name__}: denoiser_type and __init__ defaults need denoiser=")
            return
        base = next(parent for parent in cls.__bases__ if issubclass(parent, DiffusionPipeline))
        cls._denoiser_name = denoiser
        cls._rl_denoiser_name = f"rl_{denoiser}"
        cls._optional_components = [*getattr(base, "_optional_components", []), cls._rl_denoiser_name]
        cls.__init__ = init_with_rl_denoiser(base, cls._rl_denoiser_name, denoiser_type, **init_defaults)

    @abc.abstractmethod
    def _sample(self, call: RLGCall) -> RLGPipelineOutput | tuple:
        """The family's sampling, ``__call__``'s body (every family defines it)."""

    @property
    def rl_denoiser(self) -> torch.nn.Module | None:
        return getattr(self, self._rl_denoiser_name, None)

    def load_rl_lora(self, path: str, adapter_name: str = "rl") -> None:
        """``load_lora_weights(path, adapter_name)`` for the RL model, with one-line errors: a
        training checkpoint folder, or a LoRA whose layers do not fit this pipeline, is named as
        such; diffusers' notice that the LoRA has no text-encoder keys (a denoiser-only LoRA, what
        genalign trains) is dropped."""
        if (Path(path) / "meta.json").is_file():
            raise ValueError(f"{path} is a training checkpoint; pass the run's final/ folder")
        notices = ["diffusers.loaders.lora_base", "diffusers.loaders.peft"]
        try:
            with quiet_messages(notices, "No LoRA keys associated"):
                self.load_lora_weights(path, adapter_name=adapter_name)
        except (RuntimeError, ValueError, KeyError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(f"the LoRA {path} does not fit this {type(self).__name__}: {first}") from error

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
    def _rlg_size(self, call: RLGCall, sample_size: int) -> tuple[int, int]:
        """``(height, width)``: the call's, else the denoiser's native size (``sample_size`` latents)."""
        default = sample_size * self.vae_scale_factor
        return call.height or default, call.width or default

    def _checked_t5_size(self, call: RLGCall, other_prompts: int) -> tuple[int, int]:
        """``(height, width)`` of a call to a pipeline with T5 prompts (FLUX.1, SD3), checked by its
        ``check_inputs`` with its ``other_prompts`` secondary prompts (``prompt_2`` ...) left None;
        sets the guidance scale."""
        height, width = self._rlg_size(call, self.default_sample_size)
        self.check_inputs(
            call.prompt,
            *[None] * other_prompts,
            height,
            width,
            negative_prompt=call.negative_prompt,
            max_sequence_length=call.max_sequence_length,
        )
        self._guidance_scale = call.guidance_scale
        return height, width

    def _rlg_latents(
        self, call: RLGCall, channels: int, height: int, width: int, dtype: torch.dtype, device: torch.device
    ) -> Any:
        """The initial latents of ``call.num_images`` images as the wrapped pipeline's
        ``prepare_latents`` draws them from ``call.generator`` (or takes ``call.latents``)."""
        return self.prepare_latents(
            call.num_images, channels, height, width, dtype, device, call.generator, call.latents
        )

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

    def _lcm_timestep_cond(
        self, call: RLGCall, device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor | None:
        """An LCM-distilled UNet's guidance embedding (``w - 1`` per image, as diffusers' SD and SDXL
        pipelines build it when ``unet.config.time_cond_proj_dim`` is set; CFG is off for it), or
        None for any other UNet."""
        dim = self.unet.config.time_cond_proj_dim
        if dim is None:
            return None
        guidance = torch.tensor(call.guidance_scale - 1).repeat(call.num_images)
        return self.get_guidance_scale_embedding(guidance, embedding_dim=dim).to(device=device, dtype=dtype)

    @staticmethod
    def _cfg_prediction(
        call: RLGCall, do_cfg: bool, denoiser: torch.nn.Module, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        """A branch's prediction for ``predict`` when guidance is plain CFG: the denoiser's output on
        ``args`` / ``kwargs`` (``return_dict=False``), guided at ``call.guidance_scale`` when
        ``do_cfg`` (:func:`~genalign.pipelines.guidance.apply_guidance`)."""
        output = denoiser(*args, return_dict=False, **kwargs)[0]
        return apply_guidance(output, call.guidance_scale, do_cfg)

    def _step_end(
        self, callback: StepCallback | None, step: int, timestep: torch.Tensor, latents: torch.Tensor
    ) -> torch.Tensor:
        """``callback_on_step_end``: it may replace the latents."""
        if callback is None:
            return latents
        outputs = callback(self, step, timestep, {"latents": latents})
        return (outputs or {}).get("latents", latents)

    def _rlg_denoise(
        self,
        call: RLGCall,
        branches: list[Branch],
        timesteps: torch.Tensor,
        latents: torch.Tensor,
        predict: Callable[..., torch.Tensor],
        model_input: Callable[[torch.Tensor, torch.Tensor], tuple],
        **step_kwargs: Any,
    ) -> torch.Tensor:
        """The denoising loop: per step, :meth:`_rlg_prediction` of ``predict`` on the family's
        ``model_input(latents, t)`` (its batch under CFG, its timestep scaling), one scheduler
        step (``step_kwargs``: e.g. ``eta``), then ``callback_on_step_end``."""
        self._num_timesteps = len(timesteps)
        for i, t in enumerate(timesteps):
            prediction = self._rlg_prediction(branches, call.rlg_scale, predict, *model_input(latents, t))
            latents = self.scheduler.step(prediction, t, latents, **step_kwargs, return_dict=False)[0]
            latents = self._step_end(call.callback_on_step_end, i, t, latents)
        return latents

    def _rlg_output(
        self, call: RLGCall, latents: torch.Tensor, decode: Callable[[torch.Tensor], object]
    ) -> RLGPipelineOutput | tuple:
        """The pipeline's output: the final latents for ``output_type="latent"``, else ``decode(latents)``."""
        image = latents if call.output_type == "latent" else decode(latents)
        self.maybe_free_model_hooks()
        if not call.return_dict:
            return (image,)
        return RLGPipelineOutput(images=image)
