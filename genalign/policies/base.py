"""The policy base class: a diffusers pipeline whose denoising loop records exact log-probs.

A policy wraps one real diffusers pipeline (loaded with ``from_pretrained`` from a hub id or a
local folder) and adds what RL needs:

* :meth:`DiffusionPolicy.rollout` samples trajectories step by step through a stateless kernel
  of :mod:`genalign.sampling`, keeping every latent, timestep and log-prob;
* :meth:`DiffusionPolicy.step` / :meth:`log_prob` recompute a step's distribution under the
  current weights, with classifier-free guidance exactly as in the rollout;
* :meth:`reference` is a context in which the policy is the frozen base model (LoRA disabled,
  or a frozen copy under full fine-tuning), for KL penalties and RL guidance;
* :meth:`trainable_parameters` lists what an optimiser should update.

Families differ only in how they encode prompts, prepare latents, call the denoiser and decode;
subclasses implement those four hooks plus the choice of kernel.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from genalign.policies.model_folder import check_model_folder, require_local_path
from genalign.policies.rollout_args import check_group_size, per_sample_generators, validate_rollout_arguments
from genalign.policies.trajectory import RolloutSettings, Trajectory

__all__ = [
    "DiffusionPolicy",
    "LoRASpec",
    "LoraSpec",
    "check_group_size",
    "per_sample_generators",
    "validate_rollout_arguments",
]
from genalign.sampling import StepOutput

logger = logging.getLogger(__name__)


@dataclass
class LoRASpec:
    """LoRA on the denoiser through peft (``init_lora_weights="gaussian"`` leaves B = 0, so a
    fresh adapter does not change the model)."""

    rank: int = 4
    alpha: float | None = None
    target_modules: list[str] = field(default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0"])
    dropout: float = 0.0
    seed: int = 0  # the adapters' initialisation is drawn from this seed, not the global RNG

    def to_peft(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha if self.alpha is not None else self.rank,
            target_modules=list(self.target_modules),
            lora_dropout=self.dropout,
            init_lora_weights="gaussian",
        )


def _stack_steps(values: list[torch.Tensor], batch: int) -> torch.Tensor:
    """Per-step ``[B]`` values stacked to ``[B, K]`` (``[B, 0]`` fp32 when there are none)."""
    return torch.stack(values, dim=1) if values else torch.zeros(batch, 0)


class DiffusionPolicy(torch.nn.Module):
    """Base class of the diffusion-like families (sd, flow, consistency).

    Args:
        pipeline: a loaded diffusers pipeline of the family.
        lora: a :class:`LoRASpec` (or its dict) to train LoRA adapters, or None for full fine-tuning.
        train: whether the denoiser is to be trained at all (False for frozen inference).
        device, dtype: where and in what precision the frozen weights live (LoRA stays fp32).
    """

    family: str = "base"
    default_steps: int = 20
    default_guidance_scale: float = 5.0
    denoiser_name: str  # the pipeline component that is trained ("unet", "transformer")

    def __init__(
        self,
        pipeline: Any,
        lora: LoRASpec | dict | None = None,
        train: bool = True,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
    ) -> None:
        super().__init__()
        self.pipeline = pipeline
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        device = torch.device(device) if device is not None else torch.device("cpu")
        pipeline.to(device)
        if dtype is not None:
            pipeline.to(dtype=dtype)
        pipeline.set_progress_bar_config(disable=True)
        self.device = device
        self.scheduler = self.make_scheduler(pipeline.scheduler)
        for module in self.frozen_modules():
            module.requires_grad_(False)
            module.eval()
        # Read once: diffusers' ``ModelMixin.dtype`` walks every submodule (ms per call on real
        # models), far too slow to ask on each denoising step.
        self.model_dtype = self.denoiser.dtype
        self.lora = LoRASpec(**lora) if isinstance(lora, dict) else lora
        self._reference_denoiser: torch.nn.Module | None = None
        denoiser = self.denoiser
        denoiser.requires_grad_(False)
        if self.lora is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.lora.seed)
                denoiser.add_adapter(self.lora.to_peft())
            for name, parameter in denoiser.named_parameters():
                if "lora_" in name:
                    parameter.data = parameter.data.float()
                    parameter.requires_grad_(train)
        elif train:
            denoiser.requires_grad_(True)
            self._reference_denoiser = copy.deepcopy(denoiser).requires_grad_(False).eval()

    # ---- loading -------------------------------------------------------------------------------
    pipeline_class: Any = None

    @classmethod
    def load_pipeline(cls, path: str | Path, **kwargs: Any) -> Any:
        require_local_path(path)
        if Path(path).exists():
            check_model_folder(path)
        from diffusers import DiffusionPipeline

        # Components saved as null (SD3 without T5, a pipeline without safety checker) must be
        # passed as None explicitly, or diffusers insists on loading them.
        index = DiffusionPipeline.load_config(str(path))
        for name, spec in index.items():
            if not name.startswith("_") and isinstance(spec, list) and spec[0] is None:
                kwargs.setdefault(name, None)
        loader = cls.pipeline_class or DiffusionPipeline
        return loader.from_pretrained(str(path), **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        lora: LoRASpec | dict | None = None,
        train: bool = True,
        dtype: torch.dtype | str | None = None,
        device: str | torch.device | None = None,
        **pipeline_kwargs: Any,
    ) -> DiffusionPolicy:
        """Load from a hub id (e.g. ``stabilityai/stable-diffusion-2-1``) or a local folder."""
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        if dtype is not None:
            pipeline_kwargs.setdefault("torch_dtype", dtype)
        pipeline = cls.load_pipeline(path, **pipeline_kwargs)
        if getattr(pipeline, cls.denoiser_name, None) is None:  # another family's pipeline
            raise ValueError(
                f"model {path} is a {type(pipeline).__name__} without a {cls.denoiser_name!r}: not a "
                f"pipeline of the {cls.family!r} family (model.family)"
            )
        return cls.for_pipeline(pipeline)(pipeline, lora=lora, train=train, device=device, dtype=dtype)

    @classmethod
    def from_pipe(cls, pipeline: Any, **kwargs: Any) -> DiffusionPolicy:
        """Wrap an already loaded pipeline (its modules are shared, not copied)."""
        return cls.for_pipeline(pipeline)(pipeline, **kwargs)

    @classmethod
    def for_pipeline(cls, pipeline: Any) -> type[DiffusionPolicy]:
        """The policy class for ``pipeline``: this one, unless a family has one per architecture."""
        return cls

    # ---- family hooks --------------------------------------------------------------------------
    @property
    def denoiser(self) -> torch.nn.Module:
        """The trained network: the pipeline's component named ``denoiser_name``."""
        return getattr(self.pipeline, self.denoiser_name)

    @property
    def trained_module(self) -> torch.nn.Module:
        """The network whose parameters are trained (the trainer's view; the denoiser here)."""
        return self.denoiser

    @property
    def reference_module(self) -> torch.nn.Module | None:
        """The frozen copy that serves as reference under full fine-tuning (None under LoRA)."""
        return self._reference_denoiser

    def frozen_modules(self) -> list[torch.nn.Module]:
        """Modules never trained (VAE, text encoders)."""
        return [m for m in self.pipeline.components.values() if isinstance(m, torch.nn.Module)]

    def make_scheduler(self, scheduler: Any) -> Any:
        """The policy's own scheduler (a copy, so pipeline calls cannot change its state)."""
        return copy.deepcopy(scheduler)

    def encode_prompts(
        self, prompts: list[str], guidance_scale: float, negative_prompt: str
    ) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def prepare_latents(
        self, batch_size: int, height: int, width: int, generators: list[torch.Generator]
    ) -> torch.Tensor:
        raise NotImplementedError

    def set_timesteps(self, num_inference_steps: int, latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def set_schedule(self, settings: RolloutSettings, latents: torch.Tensor) -> torch.Tensor:
        """Set the scheduler's timesteps for a trajectory drawn with ``settings`` and return them;
        a family whose schedule depends on more than the step count overrides this."""
        return self.set_timesteps(settings.num_inference_steps, latents)

    def clean_sample(self, last_step: StepOutput, settings: RolloutSettings) -> torch.Tensor:
        """The latents a finished chain decodes to, given its last step: that step's sample,
        unless the last step re-noises (RLCM's final step, where it is the step's clean estimate)."""
        return last_step.prev_sample

    def predict(
        self,
        latents: torch.Tensor,
        step_index: torch.Tensor,
        conditioning: dict[str, torch.Tensor],
        settings: RolloutSettings,
    ) -> torch.Tensor:
        """The denoiser's output (after guidance) for ``latents`` at per-sample ``step_index`` [B]."""
        raise NotImplementedError

    def forward_noise(
        self, x0: torch.Tensor, noise: torch.Tensor, step_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Noise clean latents ``x0`` to the level of per-sample grid ``step_index`` (after
        :meth:`set_timesteps`); returns ``(x_t, target)`` with ``target`` what the denoiser
        regresses there (its training objective): eps, v, x_0 or the flow velocity."""
        raise NotImplementedError

    def predict_x0(
        self, x_t: torch.Tensor, model_output: torch.Tensor, step_index: torch.Tensor
    ) -> torch.Tensor:
        """The clean latents the denoiser's ``model_output`` at ``x_t`` (grid ``step_index``)
        implies, in one step: the inverse of :meth:`forward_noise` given its target."""
        raise NotImplementedError

    def kernel(
        self,
        model_output: torch.Tensor,
        step_index: torch.Tensor,
        latents: torch.Tensor,
        settings: RolloutSettings,
        prev_sample: torch.Tensor | None,
        generator: list[torch.Generator] | None,
    ) -> StepOutput:
        raise NotImplementedError

    def decode(self, latents: torch.Tensor, settings: RolloutSettings) -> torch.Tensor:
        """Latents -> images ``[B, 3, H, W]`` in [0, 1]."""
        raise NotImplementedError

    def default_size(self) -> tuple[int, int]:
        raise NotImplementedError

    def size_multiple(self) -> int:
        """Image height and width must be multiples of this: the VAE's downsampling factor times
        the denoiser's patch size (a size in between would be silently rounded down)."""
        patch = getattr(getattr(self.denoiser, "config", None), "patch_size", None) or 1
        return int(getattr(self.pipeline, "vae_scale_factor", 8)) * int(patch)

    # ---- the RL interface ----------------------------------------------------------------------
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.denoiser.parameters() if p.requires_grad]

    def named_trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in self.denoiser.named_parameters() if p.requires_grad}

    @contextlib.contextmanager
    def reference(self) -> Iterator[DiffusionPolicy]:
        """Within this context the policy is the frozen base model (LoRA off / frozen copy)."""
        if self.lora is not None:
            self.denoiser.disable_adapters()
            try:
                yield self
            finally:
                self.denoiser.enable_adapters()
        elif self._reference_denoiser is not None:
            trained = self.denoiser
            self._swap_denoiser(self._reference_denoiser)
            try:
                yield self
            finally:
                self._swap_denoiser(trained)
        else:
            yield self  # nothing is trained: the policy is its own reference

    def _swap_denoiser(self, module: torch.nn.Module) -> None:
        setattr(self.pipeline, self.denoiser_name, module)

    def _timestep(self, step_index: torch.Tensor) -> torch.Tensor:
        """The scheduler's timesteps ``[B]`` at per-sample grid ``step_index`` [B], on the policy's device."""
        return self.scheduler.timesteps[step_index.to(self.scheduler.timesteps.device)].to(self.device)

    def make_settings(
        self,
        num_inference_steps: int | None,
        guidance_scale: float | None,
        height: int | None,
        width: int | None,
        eta: float,
        noise_level: float,
        mode: str,
        lcm_schedule: str = "diffusers",
        lcm_final_noise: bool = False,
        num_sde_steps: int | None = None,
    ) -> RolloutSettings:
        default_h, default_w = self.default_size()
        multiple = self.size_multiple()
        for name, size in (("height", height), ("width", width)):
            if size is not None and (int(size) <= 0 or int(size) % multiple):
                lower = max(multiple, int(size) // multiple * multiple)
                raise ValueError(
                    f"{name} {size} is not a positive multiple of {multiple} (this model's VAE factor "
                    f"times its patch size); use {lower} or {lower + multiple}"
                )
        return RolloutSettings(
            num_inference_steps=num_inference_steps
            if num_inference_steps is not None
            else self.default_steps,
            guidance_scale=float(
                guidance_scale if guidance_scale is not None else self.default_guidance_scale
            ),
            height=height or default_h,
            width=width or default_w,
            eta=float(eta),
            noise_level=float(noise_level),
            mode=mode,
            lcm_schedule=lcm_schedule,
            lcm_final_noise=bool(lcm_final_noise),
            num_sde_steps=None if num_sde_steps is None else int(num_sde_steps),
        )

    @torch.no_grad()
    def rollout(
        self,
        prompts: Sequence[str],
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        eta: float = 1.0,
        noise_level: float = 0.7,
        mode: str = "sde",
        group_size: int = 1,
        generator: torch.Generator | int | None = None,
        negative_prompt: str = "",
        height: int | None = None,
        width: int | None = None,
        latents: torch.Tensor | None = None,
        seeds: torch.Tensor | None = None,
        stop_step: int | None = None,
        lcm_schedule: str = "diffusers",
        lcm_final_noise: bool = False,
        num_sde_steps: int | None = None,
    ) -> Trajectory:
        """Sample ``group_size`` trajectories for each prompt, recording exact step log-probs.

        Args:
            prompts: the distinct prompts; the batch is each repeated ``group_size`` times (B = P * G).
            eta / noise_level / mode: the step policy's stochasticity (see the family's kernel).
            generator: an int seed or a ``torch.Generator`` from which one seed per sample is drawn;
                each sample then has its own generator, so a sample is reproducible from its seed.
            latents: optional initial noise ``[B, ...]`` (else drawn from the per-sample generators).
            seeds: optional per-sample seeds ``[B]`` (overrides ``generator``); a sample drawn with
                the same seed and settings is the same sample, in any batch.
            stop_step: run only the first ``stop_step`` steps of the chain and return a *prefix*:
                ``latents`` ``[B, stop_step + 1, ...]``, ``log_probs`` / ``stds`` ``[B, stop_step]``,
                ``timesteps`` the whole schedule ``[B, T]`` and no images (``[B, 0]``); finish it with
                :meth:`continue_rollout`. Its steps are exactly the first ``stop_step`` of the full
                rollout with the same seeds. None (default) runs all T steps and decodes.
            lcm_schedule / lcm_final_noise: the consistency family's timesteps (``"diffusers"``
                or ``"rlcm"``) and RLCM's scored re-noising of the last step; other families
                ignore them.
            num_sde_steps: only the first this many steps are stochastic, the rest deterministic
                (PromptRL's SDE prefix and ODE tail); None: every step is.
        """
        num_inference_steps = num_inference_steps if num_inference_steps is not None else self.default_steps
        validate_rollout_arguments(prompts, num_inference_steps, group_size)
        if stop_step is not None and not (
            isinstance(stop_step, int) and 0 <= stop_step <= num_inference_steps
        ):
            raise ValueError(f"stop_step must be an integer in [0, {num_inference_steps}], got {stop_step!r}")
        settings = self.make_settings(
            num_inference_steps,
            guidance_scale,
            height,
            width,
            eta,
            noise_level,
            mode,
            lcm_schedule,
            lcm_final_noise,
            num_sde_steps,
        )
        expanded = [p for p in prompts for _ in range(group_size)]
        batch = len(expanded)
        group_ids = torch.arange(len(prompts)).repeat_interleave(group_size)
        seeds, generators = per_sample_generators(batch, generator, self.device, seeds)

        # 1. Encode prompts (positive and, under CFG, negative)
        conditioning = self.encode_prompts(expanded, settings.guidance_scale, negative_prompt)
        # 2. Initial noise from each sample's own generator
        if latents is None:
            latents = self.prepare_latents(batch, settings.height, settings.width, generators)
        elif latents.shape[0] != batch:
            raise ValueError(f"latents has batch {latents.shape[0]} but the rollout has {batch} samples")
        # 3. Timesteps
        timesteps = self.set_schedule(settings, latents)
        # 4. Denoising loop through the kernel
        stop = len(timesteps) if stop_step is None else stop_step
        new_latents, log_probs, stds, last = self._denoise(
            latents, conditioning, settings, generators, 0, stop
        )
        all_latents = [latents, *new_latents]
        # 5. Decode (a prefix is not decoded: it is finished by continue_rollout)
        if stop == len(timesteps):
            images = self.decode(self.clean_sample(last, settings), settings).float()
        else:
            images = torch.empty(batch, 0)
        return Trajectory(
            prompts=expanded,
            group_ids=group_ids,
            seeds=seeds,
            latents=torch.stack(all_latents, dim=1),
            timesteps=timesteps.to(self.device)[None].expand(batch, -1).clone(),
            log_probs=_stack_steps(log_probs, batch),
            stds=_stack_steps(stds, batch),
            images=images,
            conditioning=conditioning,
            settings=settings,
        )

    def _denoise(
        self,
        latents: torch.Tensor,
        conditioning: dict[str, torch.Tensor],
        settings: RolloutSettings,
        generators: list[torch.Generator],
        start: int,
        stop: int,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], StepOutput | None]:
        """Run steps ``start .. stop - 1`` from ``latents`` (the latent before step ``start``).

        Returns the ``stop - start`` new latents ``[B, ...]``, log-probs ``[B]`` and stds ``[B]``,
        and the last step's output (None when no step ran).
        """
        batch = latents.shape[0]
        new_latents, log_probs, stds = [], [], []
        out = None
        for i in range(start, stop):
            step_index = torch.full((batch,), i, dtype=torch.long)
            model_output = self.predict(latents, step_index, conditioning, settings)
            out = self.kernel(model_output, step_index, latents, settings.at_steps(i), None, generators)
            latents = out.prev_sample
            new_latents.append(latents)
            log_probs.append(out.log_prob)
            stds.append(out.std.reshape(batch, -1)[:, 0].float())
        return new_latents, log_probs, stds, out

    @torch.no_grad()
    def continue_rollout(
        self,
        trajectory: Trajectory,
        from_step: int,
        seeds: torch.Tensor | None = None,
        generator: torch.Generator | int | None = None,
        repeats: int = 1,
    ) -> Trajectory:
        """Branch trajectories: continue each from its latent after ``from_step`` steps, with fresh noise.

        Branch-based sampling of B2-DiffuRL (Hu et al. 2025, Sec. 4.2): a trajectory's prefix
        ``x_T .. x_{t_s}`` is shared and ``repeats`` continuations are drawn from it. Row ``b`` of
        ``trajectory`` becomes rows ``b * repeats .. b * repeats + repeats - 1`` of the result.

        Args:
            trajectory: a full trajectory, or a prefix from ``rollout(..., stop_step=k)`` with
                ``k >= from_step``; its settings and conditioning are reused.
            from_step: the first step to redraw, in ``[0, T)``. Steps ``[0, from_step)`` are copied
                bitwise: ``latents[:, :from_step + 1]``, ``log_probs[:, :from_step]``, ``stds``.
            seeds: one seed per output row ``[B * repeats]`` for the generators of the new steps
                (else drawn from ``generator``).
            repeats: continuations per input row.

        Returns:
            A full :class:`Trajectory` of ``B * repeats`` rows with decoded images, exact log-probs
            of every step, ``seeds`` the continuation seeds, ``extras["prefix_seeds"]`` the seeds
            the prefix was drawn with and ``extras["branch_step"] = from_step``.
        """
        num_steps = trajectory.num_steps
        if not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
        if not isinstance(from_step, int) or not 0 <= from_step < num_steps:
            raise ValueError(f"from_step must be an integer in [0, {num_steps}), got {from_step!r}")
        recorded = trajectory.latents.shape[1] - 1
        if recorded < from_step:
            raise ValueError(
                f"the trajectory holds {recorded} steps, fewer than from_step={from_step}: "
                f"roll out at least {from_step} steps (stop_step) before continuing"
            )
        batch = trajectory.batch_size * repeats
        seeds, generators = per_sample_generators(batch, generator, self.device, seeds)

        def repeat(value: Any) -> Any:
            if torch.is_tensor(value) and value.ndim > 0 and value.shape[0] == trajectory.batch_size:
                return value.repeat_interleave(repeats, dim=0)
            return value

        settings = trajectory.settings
        conditioning = {name: repeat(value) for name, value in trajectory.conditioning.items()}
        prefix = repeat(trajectory.latents[:, : from_step + 1])  # (B * repeats, from_step + 1, ...)
        self.set_schedule(settings, prefix[:, 0])
        new_latents, log_probs, stds, last = self._denoise(
            prefix[:, -1], conditioning, settings, generators, from_step, num_steps
        )
        latents = torch.cat([prefix, torch.stack(new_latents, dim=1)], dim=1)
        images = self.decode(self.clean_sample(last, settings), settings).float()
        extras = dict(trajectory.extras)
        extras.update(prefix_seeds=repeat(trajectory.seeds), branch_step=from_step)
        return Trajectory(
            prompts=[p for p in trajectory.prompts for _ in range(repeats)],
            group_ids=repeat(trajectory.group_ids),
            seeds=seeds,
            latents=latents,
            timesteps=repeat(trajectory.timesteps),
            log_probs=torch.cat(
                [repeat(trajectory.log_probs[:, :from_step]), _stack_steps(log_probs, batch)], 1
            ),
            stds=torch.cat([repeat(trajectory.stds[:, :from_step]), _stack_steps(stds, batch)], 1),
            images=images,
            conditioning=conditioning,
            settings=settings,
            extras=extras,
        )

    def step(self, trajectory: Trajectory, step_index: torch.Tensor | int) -> StepOutput:
        """Recompute the step ``latents[:, i] -> latents[:, i + 1]`` under the current weights.

        ``step_index`` is an int or a per-sample LongTensor ``[B]``. Gradients flow to the
        trainable parameters; the returned ``log_prob`` is ``[B]``.
        """
        batch = trajectory.batch_size
        if isinstance(step_index, int):
            step_index = torch.full((batch,), step_index, dtype=torch.long)
        step_index = step_index.to(torch.long).cpu()
        if step_index.shape != (batch,):
            raise ValueError(f"step_index must be an int or shape ({batch},), got {tuple(step_index.shape)}")
        if int(step_index.min()) < 0 or int(step_index.max()) >= trajectory.num_steps:
            raise ValueError(f"step_index must lie in [0, {trajectory.num_steps}), got {step_index.tolist()}")
        rows = torch.arange(batch)
        self.set_schedule(trajectory.settings, trajectory.latents[:, 0])
        sample = trajectory.latents[rows, step_index]
        prev_sample = trajectory.latents[rows, step_index + 1]
        model_output = self.predict(sample, step_index, trajectory.conditioning, trajectory.settings)
        settings = trajectory.settings.at_steps(step_index)
        return self.kernel(model_output, step_index, sample, settings, prev_sample, None)

    def log_prob(
        self, trajectory: Trajectory, step_indices: torch.Tensor | Sequence[int] | None = None
    ) -> torch.Tensor:
        """Log-probs ``[B, K]`` of the given steps under the current weights.

        ``step_indices``: None (all steps), a list of K step indices shared by the batch, or a
        LongTensor ``[B, K]`` of per-sample indices.
        """
        batch = trajectory.batch_size
        if step_indices is None:
            step_indices = list(range(trajectory.num_steps))
        if not torch.is_tensor(step_indices):
            step_indices = torch.tensor(list(step_indices), dtype=torch.long)[None].expand(batch, -1)
        columns = [self.step(trajectory, step_indices[:, k]).log_prob for k in range(step_indices.shape[1])]
        return torch.stack(columns, dim=1)


# Deprecated aliases: class names spell acronyms in upper case (#22); the old names keep working.
LoraSpec = LoRASpec
