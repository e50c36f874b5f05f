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

* :class:`ReNOPipeline` — Stable-Diffusion-layout UNets with any diffusers scheduler: sd-turbo
  (``num_inference_steps=1``, ``guidance_scale=0``), LCM (guidance as a ``timestep_cond``
  embedding), few-step SD with CFG;
* :class:`ReNOStableDiffusionXLPipeline` — sdxl-turbo (pooled text embeddings + ``add_time_ids``);
* :class:`ReNOFluxPipeline` — FLUX.1-schnell (packed latents, flow matching, no guidance
  embedding) and FLUX.1-dev (embedded guidance);
* :class:`ReNOPixArtAlphaPipeline` — PixArt-alpha DMD (one DDPM step at t = 400, x0 estimate).

``ReNOPipeline.from_pretrained`` / ``from_pipe`` pick the right class from the model.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import PIL.Image
import torch
from diffusers import (
    AutoencoderKL,
    DiffusionPipeline,
    FluxPipeline,
    PixArtAlphaPipeline,
    SchedulerMixin,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from diffusers.pipelines.flux.pipeline_flux import calculate_shift
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor
from transformers import CLIPImageProcessor, CLIPTextModel, CLIPTokenizer

from genalign.rewards import EnsembleReward, Reward, list_rewards, load_reward

logger = logging.getLogger(__name__)

__all__ = [
    "RENO_REWARD_WEIGHTS",
    "ReNOFluxPipeline",
    "ReNOPipeline",
    "ReNOPixArtAlphaPipeline",
    "ReNOPipelineOutput",
    "ReNOStableDiffusionXLPipeline",
    "build_reward_ensemble",
    "norm_regularizer",
]

RENO_REWARD_WEIGHTS: dict[str, float] = {"hpsv2": 5.0, "imagereward": 1.0, "pickscore": 0.05, "clip": 0.01}
"""The paper's default ensemble weights (HPS v2.1, ImageReward, PickScore, CLIP; ReNO code
``arguments.py``). They were tuned on each model's native loss scale; our rewards score on their
own scales, so treat them as a starting point. ImageReward joins when a reward of that name is
registered."""

RewardsSpec = (
    Reward | Mapping[str, float | tuple[float, Mapping[str, Any]]] | Sequence[Reward | tuple[Reward, float]]
)


@dataclass
class ReNOPipelineOutput(BaseOutput):
    """Output of :class:`ReNOPipeline`.

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


def norm_regularizer(latents: torch.Tensor, weight: float = 0.01) -> torch.Tensor:
    """ReNO's noise-norm regulariser (the norm regulariser), one value per sample.

    ``weight * (||z_b||^2 / 2 - (d - 1) log ||z_b||)`` with ``d`` the number of elements of one
    sample; computed in fp32. Its gradient ``weight * z (1 - (d - 1) / ||z||^2)`` vanishes on
    the chi mode ``||z|| = sqrt(d - 1)``.

    Args:
        latents: ``[B, ...]`` initial noise.
        weight: lambda.

    Returns:
        ``[B]`` regulariser values.
    """
    flat = latents.float().flatten(1)  # (B, d)
    dim = flat.shape[1]
    norm = torch.linalg.vector_norm(flat, dim=1)  # (B,)
    return weight * (0.5 * norm**2 - (dim - 1) * torch.log(norm))


def build_reward_ensemble(
    rewards: RewardsSpec | None, reward_kwargs: Mapping[str, Mapping] | None = None
) -> Reward:
    """Turn a rewards spec into one differentiable reward ``sum_i w_i R_i``.

    Args:
        rewards: a ``Reward`` (used as is); a mapping ``{registered name: weight}`` (or
            ``{name: (weight, kwargs)}``), loaded with :func:`load_reward`; a list of ``Reward``
            or ``(Reward, weight)``. ``None``: the paper's ensemble :data:`RENO_REWARD_WEIGHTS`,
            restricted to the registered names.
        reward_kwargs: per-name keyword arguments for :func:`load_reward` (mapping form only).

    Raises:
        ValueError: on an empty spec, an unknown name or a member that is not differentiable
            (ReNO needs gradients of the reward with respect to the image).
    """
    reward_kwargs = dict(reward_kwargs or {})
    if rewards is None:
        known = set(list_rewards())
        rewards = {name: weight for name, weight in RENO_REWARD_WEIGHTS.items() if name in known}
        skipped = sorted(set(RENO_REWARD_WEIGHTS) - known)
        if skipped:
            logger.warning("ReNO default ensemble: %s not registered, left out", ", ".join(skipped))
    if isinstance(rewards, Reward):
        members: list[dict[str, Any]] = [{"reward": rewards}]
    elif isinstance(rewards, Mapping):
        members = []
        for name, value in rewards.items():
            weight, kwargs = value if isinstance(value, tuple) else (value, reward_kwargs.get(name, {}))
            members.append(
                {"reward": load_reward(name, **dict(kwargs)), "weight": float(weight), "key": name}
            )
    else:
        members = []
        for item in rewards:
            reward, weight = item if isinstance(item, tuple) else (item, 1.0)
            members.append({"reward": reward, "weight": float(weight)})
    if not members:
        raise ValueError("ReNO: no rewards given")
    for member in members:
        reward = member["reward"]
        if not isinstance(reward, Reward):
            raise ValueError(f"ReNO: {type(reward).__name__} is not a genalign Reward")
        if not reward.differentiable:
            raise ValueError(
                f"ReNO: reward {reward.name!r} is not differentiable; noise optimisation needs "
                "gradients from the reward to the image (use e.g. clip, pickscore, hpsv2, aesthetic)"
            )
    if len(members) == 1 and isinstance(members[0]["reward"], EnsembleReward) and "weight" not in members[0]:
        return members[0]["reward"]
    return EnsembleReward(members)


def _decode_kl(vae: AutoencoderKL, latents: torch.Tensor) -> torch.Tensor:
    """Latents -> images in [0, 1] through a KL VAE, undoing ``latents_mean`` / ``latents_std``
    when the VAE config has them (as the SDXL pipeline does), else the scaling factor."""
    config = vae.config
    mean, std = getattr(config, "latents_mean", None), getattr(config, "latents_std", None)
    if mean is not None and std is not None:
        view = (1, latents.shape[1], 1, 1)
        mean = torch.tensor(mean).view(view).to(latents.device, latents.dtype)
        std = torch.tensor(std).view(view).to(latents.device, latents.dtype)
        latents = latents * std / config.scaling_factor + mean
    else:
        latents = latents / config.scaling_factor
    image = vae.decode(latents.to(vae.dtype), return_dict=False)[0]
    return (image / 2 + 0.5).clamp(0, 1)  # (B, 3, H, W) in [0, 1]


def _lcm_guidance_embedding(guidance: torch.Tensor, dim: int) -> torch.Tensor:
    """LCM's sinusoidal embedding of ``w`` (Luo et al. 2023; as diffusers' LCM pipeline)."""
    guidance = guidance * 1000.0
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / (half - 1)))
    emb = guidance.float()[:, None] * freqs[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)
    if dim % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1))
    return emb


def _unet_sample(
    pipe: DiffusionPipeline,
    noise: torch.Tensor,
    conditioning: Mapping[str, Any],
    num_inference_steps: int,
    guidance_scale: float,
    generator: torch.Generator | None,
    timesteps: list[int] | None,
) -> torch.Tensor:
    """Differentiable denoising loop of an SD-layout UNet (SD 1.x/2.x, LCM, SDXL); returns the
    final clean latents. ``conditioning`` holds ``embeds`` (``[uncond; cond]`` under CFG),
    ``do_cfg``, ``timestep_cond`` (LCM) and ``added_cond_kwargs`` (SDXL)."""
    scheduler, unet = pipe.scheduler, pipe.unet
    schedule, _ = retrieve_timesteps(scheduler, num_inference_steps, noise.device, timesteps)
    latents = noise * scheduler.init_noise_sigma
    do_cfg = conditioning["do_cfg"]
    sample = latents
    for t in schedule:
        model_input = torch.cat([latents] * 2) if do_cfg else latents
        model_input = scheduler.scale_model_input(model_input, t)
        noise_pred = unet(
            model_input,
            t,
            encoder_hidden_states=conditioning["embeds"],
            timestep_cond=conditioning.get("timestep_cond"),
            added_cond_kwargs=conditioning.get("added_cond_kwargs"),
            return_dict=False,
        )[0]
        if do_cfg:
            uncond, cond = noise_pred.chunk(2)
            noise_pred = uncond + guidance_scale * (cond - uncond)
        step = scheduler.step(noise_pred, t, latents, **_step_kwargs(scheduler, generator), return_dict=True)
        latents = step.prev_sample
        # LCM returns the consistency-model estimate of x_0 as ``denoised``
        denoised = getattr(step, "denoised", None)
        sample = latents if denoised is None else denoised
    return sample


def _step_kwargs(scheduler: SchedulerMixin, generator: torch.Generator | None) -> dict[str, Any]:
    """Pass the generator to schedulers whose step draws noise (DDPM, LCM, Euler ancestral ...)."""
    accepts = "generator" in inspect.signature(scheduler.step).parameters
    return {"generator": generator} if accepts else {}


def _timestep_cond(unet: UNet2DConditionModel, guidance_scale: float, batch: int, do_cfg: bool) -> Any:
    """LCM-distilled UNets take ``w - 1`` as a ``timestep_cond`` embedding instead of running CFG."""
    if unet.config.time_cond_proj_dim is None:
        return None
    w = torch.full((batch,), guidance_scale - 1.0)
    cond = _lcm_guidance_embedding(w, unet.config.time_cond_proj_dim).to(unet.device, unet.dtype)
    return torch.cat([cond] * 2) if do_cfg else cond


class _ReNOMixin:
    """ReNO's optimisation loop (Eyring et al., NeurIPS 2024), shared by every architecture.

    A family supplies four pieces: ``_default_size``, ``_noise_shape`` / ``_draw_noise`` (the
    initial noise ``z``, in the layout the wrapped diffusers pipeline takes as ``latents``),
    ``_encode`` (fixed prompt conditioning, no gradient) and ``generate`` (differentiable
    ``G(z)``: noise -> images in [0, 1]).
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

    def _noise_shape(self, batch: int, height: int, width: int) -> tuple[int, ...]:
        channels = self.denoiser.config.in_channels
        return (batch, channels, height // self.vae_scale_factor, width // self.vae_scale_factor)

    def _draw_noise(
        self, batch: int, height: int, width: int, generator: torch.Generator | None, device: Any
    ) -> torch.Tensor:
        shape = self._noise_shape(batch, height, width)
        return randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)

    @staticmethod
    def _to_output_type(images: torch.Tensor, output_type: str) -> Any:
        if output_type == "pt":
            return images
        array = images.permute(0, 2, 3, 1).float().cpu().numpy()
        if output_type == "np":
            return array
        if output_type == "pil":
            return DiffusionPipeline.numpy_to_pil(array)
        raise ValueError(f"output_type={output_type!r}: expected 'pil', 'np' or 'pt'")

    # -- the method ---------------------------------------------------------------------------
    def __call__(
        self,
        prompt: str | list[str],
        rewards: RewardsSpec | None = None,
        num_inference_steps: int = 1,
        guidance_scale: float = 0.0,
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
            negative_prompt: the CFG negative prompt (UNet / PixArt models, CFG only).
            height, width: image size (default: the model's native size).
            generator: draws the initial noise (when ``latents`` is None) and the scheduler's
                noise, re-seeded to the same state every iteration as in the paper's code.
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
        reward = build_reward_ensemble(rewards)
        batch = len(prompts)
        default_height, default_width = self._default_size()
        height, width = height or default_height, width or default_width
        device = self._execution_device
        dtype = self.denoiser.dtype

        # 2. Encode the prompt (fixed through the optimisation)
        conditioning = self._encode(
            prompts, negative_prompt, guidance_scale, height, width, device, max_sequence_length
        )

        # 3. Prepare the initial noise z, the optimised parameter
        shape = self._noise_shape(batch, height, width)
        if latents is None:
            latents = self._draw_noise(batch, height, width, generator, device)
        elif tuple(latents.shape) != shape:
            raise ValueError(f"latents: expected shape {shape}, got {tuple(latents.shape)}")
        noise = latents.detach().to(device=device, dtype=torch.float32).clone().requires_grad_(True)
        generator_state = generator.get_state() if generator is not None else None

        # 4. Prepare the optimiser
        if optimizer == "sgd":
            optim = torch.optim.SGD([noise], lr=learning_rate, momentum=momentum, nesterov=momentum > 0)
        else:
            optim = torch.optim.Adam([noise], lr=learning_rate, eps=1e-2)  # eps as ReNO's code

        # 5. Optimisation loop: generate, score, keep the best, step
        history = torch.empty(num_iterations, batch)
        best_scores = torch.full((batch,), -math.inf)
        best_iteration = torch.zeros(batch, dtype=torch.long)
        best_images: torch.Tensor | None = None  # allocated at the first image size seen
        best_noise = noise.detach().clone()
        for iteration in range(num_iterations):
            if generator is not None:
                generator.set_state(generator_state)  # same scheduler noise every iteration
            with torch.enable_grad():
                images = self.generate(
                    noise.to(dtype), conditioning, num_inference_steps, guidance_scale, generator, timesteps
                )
                scores = reward(images.float(), prompts).scores.float()  # (B,)
            if best_images is None:
                best_images = torch.zeros(images.shape, dtype=torch.float32)
            # best-of-iterations on the reward alone (the regulariser is not an image quality)
            detached = scores.detach().cpu()
            history[iteration] = detached
            better = detached > best_scores
            best_scores = torch.where(better, detached, best_scores)
            best_iteration[better] = iteration
            best_images[better] = images.detach().float().cpu()[better]
            best_noise[better.to(device)] = noise.detach()[better.to(device)]
            logger.info("ReNO iteration %d: reward %s", iteration, detached.tolist())
            if iteration < num_iterations - 1:
                # ReNO objective: L(z) = -sum_i w_i R_i(G(z)) + lambda K(z); samples are independent problems
                loss = -scores.sum()
                if regularization_weight:
                    loss = loss + norm_regularizer(noise, regularization_weight).sum()
                (grad,) = torch.autograd.grad(loss, noise)
                if max_grad_norm is not None:
                    norms = torch.linalg.vector_norm(grad.flatten(1), dim=1).clamp(min=1e-12)
                    grad = grad * (max_grad_norm / norms).clamp(max=1.0).view(-1, *[1] * (grad.ndim - 1))
                noise.grad = grad
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
        images = self._to_output_type(best_images, output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return images, history, best_iteration, best_noise
        return ReNOPipelineOutput(
            images=images, rewards_history=history, best_iteration=best_iteration, latents=best_noise
        )


class _UNetReNOMixin(_ReNOMixin):
    """The generator of the UNet layouts (SD 1.x/2.x, LCM, turbo, SDXL): the pipeline's own
    scheduler over a UNet, then the KL VAE."""

    def generate(
        self,
        noise: torch.Tensor,
        conditioning: Mapping[str, Any],
        num_inference_steps: int,
        guidance_scale: float,
        generator: torch.Generator | None,
        timesteps: list[int] | None = None,
    ) -> torch.Tensor:
        """Differentiable ``G(z)``: noise ``[B, C, h, w]`` -> images ``[B, 3, H, W]`` in [0, 1]."""
        sample = _unet_sample(
            self, noise, conditioning, num_inference_steps, guidance_scale, generator, timesteps
        )
        return _decode_kl(self.vae, sample)


class ReNOPipeline(_UNetReNOMixin, DiffusionPipeline):
    """Reward-based Noise Optimization (Eyring et al., NeurIPS 2024) for one-/few-step models.

    Built like any diffusers pipeline. ``ReNOPipeline.from_pretrained(folder_or_hub_id)`` and
    ``ReNOPipeline.from_pipe(pipe)`` read the model's pipeline class and return the matching
    ReNO pipeline: this class for SD-layout UNets (sd-turbo, LCM, ``tiny:lcm``),
    :class:`ReNOStableDiffusionXLPipeline` (sdxl-turbo), :class:`ReNOFluxPipeline`
    (FLUX.1-schnell) and :class:`ReNOPixArtAlphaPipeline` (PixArt-alpha DMD). This class's
    components: ``vae``, ``text_encoder``, ``tokenizer``, ``unet``, ``scheduler``
    (``safety_checker`` and ``feature_extractor`` are accepted and ignored).
    """

    model_cpu_offload_seq = "text_encoder->unet->vae"
    _optional_components = ["safety_checker", "feature_extractor"]

    def __init__(
        self,
        vae: AutoencoderKL,
        text_encoder: CLIPTextModel,
        tokenizer: CLIPTokenizer,
        unet: UNet2DConditionModel,
        scheduler: SchedulerMixin,
        safety_checker: torch.nn.Module | None = None,
        feature_extractor: CLIPImageProcessor | None = None,
        requires_safety_checker: bool = False,
    ) -> None:
        super().__init__()
        self.register_modules(
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            unet=unet,
            scheduler=scheduler,
            safety_checker=safety_checker,
            feature_extractor=feature_extractor,
        )
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)

    # -- construction: one entry point for every supported architecture ------------------------
    @staticmethod
    def family(class_names: str | Sequence[str]) -> type[DiffusionPipeline]:
        """The ReNO pipeline class for a diffusers pipeline class name (or the first known name
        of a class hierarchy)."""
        names = [class_names] if isinstance(class_names, str) else list(class_names)
        for name in names:
            if name in _RENO_FAMILIES:
                return _RENO_FAMILIES[name]
        raise ValueError(f"ReNO supports {sorted(_RENO_FAMILIES)} pipelines, got {names[0]}")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any) -> Any:
        """Load a folder or hub id as the ReNO pipeline of its architecture."""
        if cls is ReNOPipeline:
            options = {k: kwargs[k] for k in _CONFIG_OPTIONS if k in kwargs}
            config = DiffusionPipeline.load_config(pretrained_model_name_or_path, **options)
            family = cls.family(config["_class_name"])
            if family is not ReNOPipeline:
                return family.from_pretrained(pretrained_model_name_or_path, **kwargs)
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @classmethod
    def from_pipe(cls, pipeline: DiffusionPipeline, **kwargs: Any) -> Any:
        """Wrap an existing pipeline's modules (no copy) in the ReNO pipeline of its architecture."""
        if cls is ReNOPipeline:
            family = cls.family([klass.__name__ for klass in type(pipeline).__mro__])
            if family is not ReNOPipeline:
                return family.from_pipe(pipeline, **kwargs)
        return super().from_pipe(pipeline, **kwargs)

    # -- pieces -------------------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompt(self, prompts: list[str], device: torch.device) -> torch.Tensor:
        """CLIP text embeddings ``[B, 77, D]`` (no gradient: the prompt is not optimised)."""
        tokens = self.tokenizer(
            prompts,
            padding="max_length",
            max_length=self.tokenizer.model_max_length,
            truncation=True,
            return_tensors="pt",
        )
        return self.text_encoder(tokens.input_ids.to(device))[0]

    guidance_embedding = staticmethod(_lcm_guidance_embedding)

    def _encode(
        self,
        prompts: list[str],
        negative_prompt: str | list[str] | None,
        guidance_scale: float,
        height: int,
        width: int,
        device: torch.device,
        max_sequence_length: int | None,
    ) -> dict[str, Any]:
        embeds = self.encode_prompt(prompts, device)
        do_cfg = guidance_scale > 1.0 and self.unet.config.time_cond_proj_dim is None
        if do_cfg:
            negatives = negative_prompt or ""
            negatives = [negatives] * len(prompts) if isinstance(negatives, str) else list(negatives)
            embeds = torch.cat([self.encode_prompt(negatives, device), embeds])
        return {
            "embeds": embeds,
            "do_cfg": do_cfg,
            "timestep_cond": _timestep_cond(self.unet, guidance_scale, len(prompts), do_cfg),
        }


class ReNOStableDiffusionXLPipeline(_UNetReNOMixin, StableDiffusionXLPipeline):
    """ReNO (Eyring et al., NeurIPS 2024) for SDXL UNets: sdxl-turbo (one step, no CFG; the
    paper's setup uses ``EulerAncestralDiscreteScheduler`` with ``timestep_spacing="trailing"``),
    SDXL-LCM, or few-step SDXL with CFG.

    Everything of :class:`~diffusers.StableDiffusionXLPipeline` (loading, LoRA, prompt
    encoding with two CLIP encoders); the UNet gets the pooled text embedding and the
    size/crop ``add_time_ids`` (original = target = the image size, no crop) as the SDXL
    pipeline builds them. Decoding follows the VAE's dtype: in fp16 use a VAE that is stable
    in fp16 (the paper uses ``madebyollin/sdxl-vae-fp16-fix``).
    """

    def _encode(
        self,
        prompts: list[str],
        negative_prompt: str | list[str] | None,
        guidance_scale: float,
        height: int,
        width: int,
        device: torch.device,
        max_sequence_length: int | None,
    ) -> dict[str, Any]:
        do_cfg = guidance_scale > 1.0 and self.unet.config.time_cond_proj_dim is None
        with torch.no_grad():
            embeds, negative_embeds, pooled, negative_pooled = self.encode_prompt(
                prompt=prompts,
                device=device,
                num_images_per_prompt=1,
                do_classifier_free_guidance=do_cfg,
                negative_prompt=negative_prompt,
            )
        projection_dim = (
            int(pooled.shape[-1])
            if self.text_encoder_2 is None
            else self.text_encoder_2.config.projection_dim
        )
        time_ids = self._get_add_time_ids(
            (height, width),
            (0, 0),
            (height, width),
            dtype=embeds.dtype,
            text_encoder_projection_dim=projection_dim,
        )
        if do_cfg:
            embeds = torch.cat([negative_embeds, embeds])
            pooled = torch.cat([negative_pooled, pooled])
            time_ids = torch.cat([time_ids, time_ids])
        return {
            "embeds": embeds.to(device),
            "do_cfg": do_cfg,
            "timestep_cond": _timestep_cond(self.unet, guidance_scale, len(prompts), do_cfg),
            "added_cond_kwargs": {
                "text_embeds": pooled.to(device),
                "time_ids": time_ids.to(device).repeat(len(prompts), 1),
            },
        }

    def _default_size(self) -> tuple[int, int]:
        size = self.default_sample_size * self.vae_scale_factor
        return size, size


class ReNOFluxPipeline(_ReNOMixin, FluxPipeline):
    """ReNO (Eyring et al., NeurIPS 2024) for FLUX transformers: FLUX.1-schnell (1-4 steps,
    no guidance embedding) and FLUX.1-dev (embedded guidance ``guidance_scale``).

    Everything of :class:`~diffusers.FluxPipeline`. The optimised noise is in FLUX's packed
    layout ``[B, h/2 * w/2, 4 C]`` (what ``FluxPipeline`` takes as ``latents``); the norm
    regulariser only sees its elements, so packing does not change it. The flow schedule is
    ``FluxPipeline``'s (sigmas ``linspace(1, 1/n, n)``, resolution shift ``mu``); the Euler
    flow step is differentiable.
    """

    _denoiser_name = "transformer"
    _supports_timesteps = False

    def _default_size(self) -> tuple[int, int]:
        size = self.default_sample_size * self.vae_scale_factor
        return size, size

    def _latent_size(self, height: int, width: int) -> tuple[int, int]:
        """Unpacked latent side lengths (even, as packing 2x2 needs), as ``FluxPipeline``."""
        return 2 * (int(height) // (self.vae_scale_factor * 2)), 2 * (
            int(width) // (self.vae_scale_factor * 2)
        )

    def _noise_shape(self, batch: int, height: int, width: int) -> tuple[int, ...]:
        h, w = self._latent_size(height, width)
        return (batch, (h // 2) * (w // 2), self.transformer.config.in_channels)

    def _draw_noise(
        self, batch: int, height: int, width: int, generator: torch.Generator | None, device: Any
    ) -> torch.Tensor:
        # drawn unpacked, then packed, as FluxPipeline.prepare_latents: the same noise for the same generator
        channels = self.transformer.config.in_channels // 4
        h, w = self._latent_size(height, width)
        unpacked = randn_tensor(
            (batch, channels, h, w), generator=generator, device=device, dtype=torch.float32
        )
        return self._pack_latents(unpacked, batch, channels, h, w)

    def _encode(
        self,
        prompts: list[str],
        negative_prompt: str | list[str] | None,
        guidance_scale: float,
        height: int,
        width: int,
        device: torch.device,
        max_sequence_length: int | None,
    ) -> dict[str, Any]:
        if max_sequence_length is None:  # schnell's T5 context is 256 tokens, dev's 512
            max_sequence_length = 512 if self.transformer.config.guidance_embeds else 256
        with torch.no_grad():
            embeds, pooled, text_ids = self.encode_prompt(
                prompt=prompts,
                prompt_2=None,
                device=device,
                num_images_per_prompt=1,
                max_sequence_length=max_sequence_length,
            )
        h, w = self._latent_size(height, width)
        return {
            "embeds": embeds,
            "pooled": pooled,
            "text_ids": text_ids,
            "image_ids": self._prepare_latent_image_ids(len(prompts), h // 2, w // 2, device, embeds.dtype),
            "height": height,
            "width": width,
        }

    def generate(
        self,
        noise: torch.Tensor,
        conditioning: Mapping[str, Any],
        num_inference_steps: int,
        guidance_scale: float,
        generator: torch.Generator | None,
        timesteps: list[int] | None = None,
    ) -> torch.Tensor:
        """Differentiable ``G(z)``: packed noise -> images ``[B, 3, H, W]`` in [0, 1]."""
        if timesteps is not None:
            raise ValueError("timesteps: FLUX sets its flow schedule from num_inference_steps")
        config = self.scheduler.config
        sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
        if getattr(config, "use_flow_sigmas", False):
            sigmas = None
        mu = calculate_shift(
            noise.shape[1],
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        schedule, _ = retrieve_timesteps(
            self.scheduler, num_inference_steps, noise.device, sigmas=sigmas, mu=mu
        )
        guidance = None
        if self.transformer.config.guidance_embeds:  # FLUX.1-dev: guidance is an input
            guidance = torch.full([1], guidance_scale, device=noise.device, dtype=torch.float32)
            guidance = guidance.expand(noise.shape[0])
        self.scheduler.set_begin_index(0)
        latents = noise
        for t in schedule:
            timestep = t.expand(latents.shape[0]).to(latents.dtype)
            velocity = self.transformer(
                hidden_states=latents,
                timestep=timestep / 1000,
                guidance=guidance,
                pooled_projections=conditioning["pooled"],
                encoder_hidden_states=conditioning["embeds"],
                txt_ids=conditioning["text_ids"],
                img_ids=conditioning["image_ids"],
                return_dict=False,
            )[0]
            latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0]
        latents = self._unpack_latents(
            latents, conditioning["height"], conditioning["width"], self.vae_scale_factor
        )
        latents = latents / self.vae.config.scaling_factor + self.vae.config.shift_factor
        image = self.vae.decode(latents.to(self.vae.dtype), return_dict=False)[0]
        return (image / 2 + 0.5).clamp(0, 1)


class ReNOPixArtAlphaPipeline(_ReNOMixin, PixArtAlphaPipeline):
    """ReNO (Eyring et al., NeurIPS 2024) for PixArt-alpha DiTs, in particular the one-step
    PixArt-alpha DMD model (``PixArt-alpha/PixArt-Alpha-DMD-XL-2-512x512``).

    Everything of :class:`~diffusers.PixArtAlphaPipeline`. DMD runs one DDPM step at timestep
    400 and takes the step's ``pred_original_sample`` as the image (the DMD model card and the
    ReNO code; ``PixArtAlphaPipeline`` does the same for one step): with one step and no
    ``timesteps`` this pipeline uses ``[400]``. Learned-sigma outputs keep their mean half.
    CFG runs for ``guidance_scale > 1`` (DMD uses 1, no CFG).
    """

    _denoiser_name = "transformer"
    ONE_STEP_TIMESTEPS = [400]
    """Default schedule for one step: the DMD checkpoint's start timestep."""

    def _encode(
        self,
        prompts: list[str],
        negative_prompt: str | list[str] | None,
        guidance_scale: float,
        height: int,
        width: int,
        device: torch.device,
        max_sequence_length: int | None,
    ) -> dict[str, Any]:
        do_cfg = guidance_scale > 1.0
        with torch.no_grad():
            embeds, mask, negative_embeds, negative_mask = self.encode_prompt(
                prompts,
                do_cfg,
                negative_prompt=negative_prompt or "",
                num_images_per_prompt=1,
                device=device,
                clean_caption=False,
                max_sequence_length=max_sequence_length or 120,
            )
        if do_cfg:
            embeds, mask = torch.cat([negative_embeds, embeds]), torch.cat([negative_mask, mask])
        added_cond_kwargs = {"resolution": None, "aspect_ratio": None}
        if self.transformer.config.sample_size == 128:  # the 1024-px model's size micro-conditions
            rows = len(prompts) * (2 if do_cfg else 1)
            resolution = torch.tensor([height, width]).repeat(rows, 1).to(device, embeds.dtype)
            aspect_ratio = torch.tensor([float(height / width)]).repeat(rows, 1).to(device, embeds.dtype)
            added_cond_kwargs = {"resolution": resolution, "aspect_ratio": aspect_ratio}
        return {"embeds": embeds, "mask": mask, "do_cfg": do_cfg, "added_cond_kwargs": added_cond_kwargs}

    def generate(
        self,
        noise: torch.Tensor,
        conditioning: Mapping[str, Any],
        num_inference_steps: int,
        guidance_scale: float,
        generator: torch.Generator | None,
        timesteps: list[int] | None = None,
    ) -> torch.Tensor:
        """Differentiable ``G(z)``: noise ``[B, 4, h, w]`` -> images ``[B, 3, H, W]`` in [0, 1]."""
        if timesteps is None and num_inference_steps == 1:
            timesteps = self.ONE_STEP_TIMESTEPS
        schedule, num_inference_steps = retrieve_timesteps(
            self.scheduler, num_inference_steps, noise.device, timesteps
        )
        latents = noise * self.scheduler.init_noise_sigma
        do_cfg, channels = conditioning["do_cfg"], self.transformer.config.in_channels
        for t in schedule:
            model_input = torch.cat([latents] * 2) if do_cfg else latents
            model_input = self.scheduler.scale_model_input(model_input, t)
            prediction = self.transformer(
                model_input,
                encoder_hidden_states=conditioning["embeds"],
                encoder_attention_mask=conditioning["mask"],
                timestep=t[None].to(model_input.device).expand(model_input.shape[0]),
                added_cond_kwargs=conditioning["added_cond_kwargs"],
                return_dict=False,
            )[0]
            if do_cfg:
                uncond, cond = prediction.chunk(2)
                prediction = uncond + guidance_scale * (cond - uncond)
            if self.transformer.config.out_channels // 2 == channels:  # learned sigma: keep the mean
                prediction = prediction.chunk(2, dim=1)[0]
            step = self.scheduler.step(
                prediction, t, latents, **_step_kwargs(self.scheduler, generator), return_dict=True
            )
            if num_inference_steps == 1:  # one-step (DMD): the model's x_0 estimate is the image
                latents = getattr(step, "pred_original_sample", None)
                if latents is None:
                    raise ValueError(
                        f"one-step PixArt needs a scheduler whose step returns pred_original_sample "
                        f"(DDPMScheduler, as the DMD checkpoint ships); got {type(self.scheduler).__name__}"
                    )
            else:
                latents = step.prev_sample
        return _decode_kl(self.vae, latents)


_RENO_FAMILIES: dict[str, type[DiffusionPipeline]] = {
    "ReNOPipeline": ReNOPipeline,
    "StableDiffusionPipeline": ReNOPipeline,
    "LatentConsistencyModelPipeline": ReNOPipeline,
    "ReNOStableDiffusionXLPipeline": ReNOStableDiffusionXLPipeline,
    "StableDiffusionXLPipeline": ReNOStableDiffusionXLPipeline,
    "ReNOFluxPipeline": ReNOFluxPipeline,
    "FluxPipeline": ReNOFluxPipeline,
    "ReNOPixArtAlphaPipeline": ReNOPixArtAlphaPipeline,
    "PixArtAlphaPipeline": ReNOPixArtAlphaPipeline,
}

_CONFIG_OPTIONS = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision")
