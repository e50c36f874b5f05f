"""ReNO's optimisation loop (Eyring et al., NeurIPS 2024), shared by every model family.

A family supplies the initial-noise layout, the prompt conditioning and the differentiable
generator ``G(z)``; :class:`ReNOMixin` runs the method: generate, score, keep the best, step.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import PIL.Image
import torch
from diffusers import DiffusionPipeline, SchedulerMixin
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor

from genalign.pipelines.decoding import decode_kl
from genalign.pipelines.guidance import apply_guidance
from genalign.pipelines.reno.objective import RewardsSpec, build_reward_ensemble, norm_regularizer

logger = logging.getLogger(__name__)

__all__ = ["PromptRequest", "ReNOMixin", "ReNOPipelineOutput", "SamplingSettings"]


@dataclass
class ReNOPipelineOutput(BaseOutput):
    """Output of the ReNO pipelines.

    Attributes:
        images: the best image of each sample over all iterations: PIL list, ``np.ndarray``
            ``[B, H, W, 3]`` or ``torch.Tensor`` ``[B, 3, H, W]``, values in [0, 1].
        rewards_history: float ``[num_iterations, B]``: the ensemble reward at every iteration.
        best_iteration: long ``[B]``: the iteration whose image is returned.
        latents: float ``[B, C, h, w]``: the optimised initial noise that produced ``images``.
    """

    images: list[PIL.Image.Image] | np.ndarray | torch.Tensor
    rewards_history: torch.Tensor
    best_iteration: torch.Tensor
    latents: torch.Tensor


@dataclass(frozen=True)
class PromptRequest:
    """What a family's ``_encode`` turns into fixed conditioning (no gradient)."""

    prompts: list[str]
    negative_prompt: str | list[str] | None
    guidance_scale: float
    height: int
    width: int
    device: torch.device
    max_sequence_length: int | None


@dataclass(frozen=True)
class SamplingSettings:
    """How ``G(z)`` samples: the same at every iteration."""

    num_inference_steps: int
    guidance_scale: float
    generator: torch.Generator | None
    timesteps: list[int] | None


def step_kwargs(scheduler: SchedulerMixin, generator: torch.Generator | None) -> dict[str, Any]:
    """Pass the generator to schedulers whose step draws noise (DDPM, LCM, Euler ancestral ...)."""
    accepts = "generator" in inspect.signature(scheduler.step).parameters
    return {"generator": generator} if accepts else {}


def _to_output_type(images: torch.Tensor, output_type: str) -> Any:
    if output_type == "pt":
        return images
    array = images.permute(0, 2, 3, 1).float().cpu().numpy()
    if output_type == "np":
        return array
    if output_type == "pil":
        return DiffusionPipeline.numpy_to_pil(array)
    raise ValueError(f"output_type={output_type!r}: expected 'pil', 'np' or 'pt'")


class _BestOfIterations:
    """The best-scoring image and noise of each sample so far (on the reward alone: the
    regulariser is not an image quality), and the reward history."""

    def __init__(self, num_iterations: int, noise: torch.Tensor) -> None:
        batch = noise.shape[0]
        self.history = torch.empty(num_iterations, batch)
        self.scores = torch.full((batch,), -math.inf)
        self.iteration = torch.zeros(batch, dtype=torch.long)
        self.images: torch.Tensor | None = None  # allocated at the first image size seen
        self.noise = noise.detach().clone()

    def update(self, iteration: int, scores: torch.Tensor, images: torch.Tensor, noise: torch.Tensor) -> None:
        if self.images is None:
            self.images = torch.zeros(images.shape, dtype=torch.float32)
        self.history[iteration] = scores
        better = scores > self.scores
        self.scores = torch.where(better, scores, self.scores)
        self.iteration[better] = iteration
        self.images[better] = images.detach().float().cpu()[better]
        self.noise[better.to(noise.device)] = noise.detach()[better.to(noise.device)]


def _clip_per_sample(grad: torch.Tensor, max_grad_norm: float | None) -> torch.Tensor:
    """Clip each sample's gradient to norm ``max_grad_norm`` (samples are independent problems)."""
    if max_grad_norm is None:
        return grad
    norms = torch.linalg.vector_norm(grad.flatten(1), dim=1).clamp(min=1e-12)
    return grad * (max_grad_norm / norms).clamp(max=1.0).view(-1, *[1] * (grad.ndim - 1))


class ReNOMixin:
    """ReNO's optimisation loop (Eyring et al., NeurIPS 2024), shared by every architecture.

    A family supplies: ``_default_size``, ``_noise_shape`` / ``_draw_noise`` (the initial noise
    ``z``, in the layout the wrapped diffusers pipeline takes as ``latents``), ``_encode``
    (fixed prompt conditioning, no gradient) and the differentiable generator ``G(z)`` that
    :meth:`generate` runs: ``_denoise`` (noise -> clean latents; by default the discrete
    scheduler loop below, with the family's ``_predict`` and ``_step_sample``) and ``_decode``
    (latents -> images in [0, 1]; by default the KL VAE).
    """

    _denoiser_name: str = "unet"
    _supports_timesteps: bool = True

    @property
    def denoiser(self) -> torch.nn.Module:
        return getattr(self, self._denoiser_name)

    # -- options ------------------------------------------------------------------------------
    def enable_gradient_checkpointing(self) -> None:
        """Recompute activations in the backward pass (denoiser and VAE): memory for compute."""
        for module in (self.denoiser, self.vae):
            if getattr(module, "_supports_gradient_checkpointing", False):
                module.enable_gradient_checkpointing()

    def disable_gradient_checkpointing(self) -> None:
        for module in (self.denoiser, self.vae):
            if getattr(module, "_supports_gradient_checkpointing", False):
                module.disable_gradient_checkpointing()

    # -- family pieces ------------------------------------------------------------------------
    def _default_size(self) -> tuple[int, int]:
        size = self.denoiser.config.sample_size * self.vae_scale_factor
        return size, size

    def _default_guidance(self) -> float:
        """The guidance when the call gives none: 0 (no CFG), what the one-step models ReNO
        optimises (SD-Turbo, SDXL-Turbo, PixArt-DMD, FLUX.1-schnell) sample with; a model that
        takes guidance as an input overrides it with its pipeline's default."""
        return 0.0

    def _noise_shape(self, batch: int, height: int, width: int) -> tuple[int, ...]:
        channels = self.denoiser.config.in_channels
        return (batch, channels, height // self.vae_scale_factor, width // self.vae_scale_factor)

    def _draw_noise(
        self, batch: int, height: int, width: int, generator: torch.Generator | None, device: Any
    ) -> torch.Tensor:
        shape = self._noise_shape(batch, height, width)
        return randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)

    def _encode(self, request: PromptRequest) -> dict[str, Any]:
        """The family's prompt conditioning for :meth:`_denoise` (every family defines it)."""
        raise NotImplementedError(f"{type(self).__name__} must define _encode, its prompt conditioning")

    def _predict(
        self, model_input: torch.Tensor, t: torch.Tensor, conditioning: Mapping[str, Any]
    ) -> torch.Tensor:
        """The denoiser's prediction for a ``[uncond; cond]`` (CFG) or plain batch; a family that
        replaces :meth:`_denoise` instead (FLUX) never calls it."""
        raise NotImplementedError(f"{type(self).__name__} must define _predict or replace _denoise")

    def _step_sample(self, step: Any, num_inference_steps: int) -> torch.Tensor:
        """The clean latents if the loop ended after this scheduler step (default: the new sample)."""
        return step.prev_sample

    def _schedule(self, settings: SamplingSettings, device: torch.device) -> tuple[torch.Tensor, int]:
        return retrieve_timesteps(self.scheduler, settings.num_inference_steps, device, settings.timesteps)

    def _denoise(
        self, noise: torch.Tensor, conditioning: Mapping[str, Any], settings: SamplingSettings
    ) -> torch.Tensor:
        """Differentiable denoising loop of a discrete-time scheduler (``conditioning["do_cfg"]``
        runs CFG on a ``[uncond; cond]`` batch); returns the final clean latents."""
        schedule, num_inference_steps = self._schedule(settings, noise.device)
        latents = noise * self.scheduler.init_noise_sigma
        do_cfg = conditioning["do_cfg"]
        sample = latents
        for t in schedule:
            model_input = torch.cat([latents] * 2) if do_cfg else latents
            model_input = self.scheduler.scale_model_input(model_input, t)
            prediction = apply_guidance(
                self._predict(model_input, t, conditioning), settings.guidance_scale, do_cfg
            )
            step = self.scheduler.step(
                prediction, t, latents, **step_kwargs(self.scheduler, settings.generator), return_dict=True
            )
            latents = step.prev_sample
            sample = self._step_sample(step, num_inference_steps)
        return sample

    def _decode(self, latents: torch.Tensor, conditioning: Mapping[str, Any]) -> torch.Tensor:
        return decode_kl(self.vae, latents)

    def generate(
        self,
        noise: torch.Tensor,
        conditioning: Mapping[str, Any],
        num_inference_steps: int,
        guidance_scale: float,
        generator: torch.Generator | None,
        timesteps: list[int] | None = None,
    ) -> torch.Tensor:
        """Differentiable ``G(z)``: noise (the layout of ``latents``) -> images ``[B, 3, H, W]`` in [0, 1]."""
        settings = SamplingSettings(num_inference_steps, guidance_scale, generator, timesteps)
        return self._decode(self._denoise(noise, conditioning, settings), conditioning)

    # -- the method ---------------------------------------------------------------------------
    def _check_call(
        self, prompts: list[str], num_iterations: int, optimizer: str, output_type: str, timesteps: Any
    ) -> None:
        if not prompts:
            raise ValueError("prompt: expected at least one prompt")
        if num_iterations < 1:
            raise ValueError(f"num_iterations must be >= 1, got {num_iterations}")
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer={optimizer!r}: expected 'sgd' or 'adam'")
        if output_type not in ("pil", "np", "pt"):
            raise ValueError(f"output_type={output_type!r}: expected 'pil', 'np' or 'pt'")
        if timesteps is not None and not self._supports_timesteps:
            raise ValueError(
                f"timesteps: {type(self).__name__} sets its flow schedule from num_inference_steps; "
                "custom timesteps are not supported"
            )

    def __call__(
        self,
        prompt: str | list[str],
        rewards: RewardsSpec | None = None,
        num_inference_steps: int = 1,
        guidance_scale: float | None = None,
        negative_prompt: str | list[str] | None = None,
        height: int | None = None,
        width: int | None = None,
        generator: torch.Generator | None = None,
        latents: torch.Tensor | None = None,
        num_iterations: int = 50,
        learning_rate: float = 5.0,
        regularization_weight: float = 0.01,
        max_grad_norm: float | None = 0.1,
        optimizer: str = "sgd",
        momentum: float = 0.9,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Callable[[DiffusionPipeline, int, int, dict], dict] | None = None,
        timesteps: list[int] | None = None,
        max_sequence_length: int | None = None,
    ) -> ReNOPipelineOutput | tuple:
        """Optimise the initial noise for ``num_iterations`` steps and return the best images.

        Each iteration is one step on ReNO's objective
        ``L(z) = -sum_i w_i R_i(G(z), c) + lambda K(z)`` (the paper's objective, with ``K`` the
        norm regulariser of :func:`norm_regularizer`), on per-sample gradients clipped to
        ``max_grad_norm``; the image returned per sample is the best-scoring one over all
        iterations.

        Args:
            prompt: one prompt or a list (one image each).
            rewards: see :func:`build_reward_ensemble`; every member must be differentiable.
            num_inference_steps: denoising steps of the generator (1 for one-step models).
            guidance_scale: CFG scale (> 1 runs CFG on UNet / PixArt models); LCM's embedded
                guidance ``w``; FLUX.1-dev's embedded guidance (FLUX.1-schnell ignores it).
                None: 0 for the one-step models, the wrapped pipeline's default for a model that
                embeds it (LCM 8.5, FLUX.1-dev 3.5).
            negative_prompt: the CFG negative prompt (UNet / PixArt models, CFG only).
            height, width: image size (default: the model's native size).
            generator: draws the initial noise (when ``latents`` is None) and the scheduler's
                noise, re-seeded to the same state every iteration as in the paper's code. None:
                a generator seeded from the global RNG once, so every iteration still sees the
                same scheduler noise (a multi-step sampler's objective would change otherwise).
            latents: initial noise ``z`` (standard normal scale) in the layout the wrapped
                pipeline takes as ``latents``: ``[B, C, h, w]``, or FLUX's packed
                ``[B, h/2 * w/2, 4 C]``.
            num_iterations: ReNO iterations (the paper uses 50); one generation each.
            learning_rate: step size (paper: 5.0 for SGD).
            regularization_weight: lambda of the norm regulariser (paper: 0.01); 0 disables it.
            max_grad_norm: per-sample gradient-norm clip (paper: 0.1); None disables it.
            optimizer: "sgd" (Nesterov momentum) or "adam".
            momentum: SGD momentum (paper: 0.9).
            callback_on_step_end: called after each iteration as
                ``callback(pipe, iteration, num_iterations, {"latents", "images", "rewards"})``;
                a returned ``"latents"`` replaces the noise being optimised.
            timesteps: custom discrete timesteps (e.g. ``[400]`` for PixArt-alpha DMD; that is
                the PixArt default for one step). Not for FLUX (flow sigmas).
            max_sequence_length: T5 prompt length (FLUX: 256 for schnell, 512 for dev;
                PixArt: 120); unused by CLIP-only models.

        Returns:
            :class:`ReNOPipelineOutput`, or ``(images, rewards_history, best_iteration, latents)``.
        """
        # 1. Check inputs
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        self._check_call(prompts, num_iterations, optimizer, output_type, timesteps)
        reward = build_reward_ensemble(rewards)
        if guidance_scale is None:
            guidance_scale = self._default_guidance()
        batch = len(prompts)
        default_height, default_width = self._default_size()
        height, width = height or default_height, width or default_width
        device = self._execution_device
        dtype = self.denoiser.dtype

        # 2. Encode the prompt (fixed through the optimisation)
        conditioning = self._encode(
            PromptRequest(
                prompts, negative_prompt, guidance_scale, height, width, device, max_sequence_length
            )
        )

        # 3. Prepare the initial noise z, the optimised parameter
        shape = self._noise_shape(batch, height, width)
        if latents is None:
            latents = self._draw_noise(batch, height, width, generator, device)
        elif tuple(latents.shape) != shape:
            raise ValueError(f"latents: expected shape {shape}, got {tuple(latents.shape)}")
        noise = latents.detach().to(device=device, dtype=torch.float32).clone().requires_grad_(True)
        if generator is None:  # one fixed scheduler noise for every iteration, as a given generator
            seed = int(torch.randint(2**62, (1,)).item())
            generator = torch.Generator(device=torch.device(device)).manual_seed(seed)
        generator_state = generator.get_state()

        # 4. Prepare the optimiser
        if optimizer == "sgd":
            optim = torch.optim.SGD([noise], lr=learning_rate, momentum=momentum, nesterov=momentum > 0)
        else:
            optim = torch.optim.Adam([noise], lr=learning_rate, eps=1e-2)  # eps as ReNO's code

        # 5. Optimisation loop: generate, score, keep the best, step
        best = _BestOfIterations(num_iterations, noise)
        for iteration in range(num_iterations):
            generator.set_state(generator_state)  # same scheduler noise every iteration
            with torch.enable_grad():
                images = self.generate(
                    noise.to(dtype), conditioning, num_inference_steps, guidance_scale, generator, timesteps
                )
                scores = reward(images.float(), prompts).scores.float()  # (B,)
            detached = scores.detach().cpu()
            best.update(iteration, detached, images, noise)
            logger.info("ReNO iteration %d: reward %s", iteration, detached.tolist())
            if iteration < num_iterations - 1:
                # ReNO objective: L(z) = -sum_i w_i R_i(G(z)) + lambda K(z); samples are independent problems
                loss = -scores.sum()
                if regularization_weight:
                    loss = loss + norm_regularizer(noise, regularization_weight).sum()
                (grad,) = torch.autograd.grad(loss, noise)
                noise.grad = _clip_per_sample(grad, max_grad_norm)
                optim.step()
                optim.zero_grad(set_to_none=True)
            if callback_on_step_end is not None:
                outputs = callback_on_step_end(
                    self,
                    iteration,
                    num_iterations,
                    {"latents": noise, "images": images.detach(), "rewards": detached},
                )
                if outputs and "latents" in outputs and outputs["latents"] is not noise:
                    with torch.no_grad():
                        noise.copy_(outputs["latents"])

        # 6. Post-process the best images
        images = _to_output_type(best.images, output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return images, best.history, best.iteration, best.noise
        return ReNOPipelineOutput(
            images=images, rewards_history=best.history, best_iteration=best.iteration, latents=best.noise
        )
