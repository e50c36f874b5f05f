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

Supported generators: Stable-Diffusion-layout UNets (``unet`` + ``vae`` + CLIP text encoder)
with any diffusers scheduler, including LCM (guidance as a ``timestep_cond`` embedding) and
sd-turbo-style one-step models (``num_inference_steps=1``, ``guidance_scale=0``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import PIL.Image
import torch
from diffusers import AutoencoderKL, DiffusionPipeline, SchedulerMixin, UNet2DConditionModel
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor
from transformers import CLIPImageProcessor, CLIPTextModel, CLIPTokenizer

from genalign.rewards import EnsembleReward, Reward, list_rewards, load_reward

logger = logging.getLogger(__name__)

__all__ = [
    "RENO_REWARD_WEIGHTS",
    "ReNOPipeline",
    "ReNOPipelineOutput",
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


class ReNOPipeline(DiffusionPipeline):
    """Reward-based Noise Optimization (Eyring et al., NeurIPS 2024) for one-/few-step models.

    Built like any diffusers pipeline: ``ReNOPipeline.from_pretrained(folder_or_hub_id)`` on an
    LCM / sd-turbo layout, or ``ReNOPipeline.from_pipe(pipe)`` to share an existing pipeline's
    modules. Components: ``vae``, ``text_encoder``, ``tokenizer``, ``unet``, ``scheduler``
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

    # -- options ------------------------------------------------------------------------------
    def enable_gradient_checkpointing(self) -> None:
        """Recompute activations in the backward pass (UNet and VAE): memory for compute."""
        for module in (self.unet, self.vae):
            if getattr(module, "_supports_gradient_checkpointing", False):
                module.enable_gradient_checkpointing()

    def disable_gradient_checkpointing(self) -> None:
        for module in (self.unet, self.vae):
            if getattr(module, "_supports_gradient_checkpointing", False):
                module.disable_gradient_checkpointing()

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

    @staticmethod
    def guidance_embedding(guidance: torch.Tensor, dim: int) -> torch.Tensor:
        """LCM's sinusoidal embedding of ``w`` (Luo et al. 2023; as diffusers' LCM pipeline)."""
        guidance = guidance * 1000.0
        half = dim // 2
        freqs = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / (half - 1)))
        emb = guidance.float()[:, None] * freqs[None, :]
        emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)
        if dim % 2 == 1:
            emb = torch.nn.functional.pad(emb, (0, 1))
        return emb

    def generate(
        self,
        noise: torch.Tensor,
        prompt_embeds: torch.Tensor,
        negative_prompt_embeds: torch.Tensor | None,
        num_inference_steps: int,
        guidance_scale: float,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """Differentiable ``G(z)``: noise ``[B, C, h, w]`` -> images ``[B, 3, H, W]`` in [0, 1]."""
        device = noise.device
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        latents = noise * self.scheduler.init_noise_sigma
        timestep_cond = None
        if self.unet.config.time_cond_proj_dim is not None:  # LCM: guidance is an input
            w = torch.full((noise.shape[0],), guidance_scale - 1.0)
            timestep_cond = self.guidance_embedding(w, self.unet.config.time_cond_proj_dim).to(
                device, noise.dtype
            )
        do_cfg = negative_prompt_embeds is not None
        embeds = torch.cat([negative_prompt_embeds, prompt_embeds]) if do_cfg else prompt_embeds
        if do_cfg and timestep_cond is not None:
            timestep_cond = torch.cat([timestep_cond] * 2)
        sample = latents
        for t in self.scheduler.timesteps:
            model_input = torch.cat([latents] * 2) if do_cfg else latents
            model_input = self.scheduler.scale_model_input(model_input, t)
            noise_pred = self.unet(
                model_input, t, encoder_hidden_states=embeds, timestep_cond=timestep_cond, return_dict=False
            )[0]
            if do_cfg:
                uncond, cond = noise_pred.chunk(2)
                noise_pred = uncond + guidance_scale * (cond - uncond)
            step = self.scheduler.step(noise_pred, t, latents, generator=generator, return_dict=True)
            latents = step.prev_sample
            # LCM returns the consistency-model estimate of x_0 as ``denoised``
            sample = getattr(step, "denoised", None)
            sample = latents if sample is None else sample
        image = self.vae.decode(sample / self.vae.config.scaling_factor, return_dict=False)[0]
        return (image / 2 + 0.5).clamp(0, 1)  # (B, 3, H, W) in [0, 1]

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
    ) -> ReNOPipelineOutput | tuple:
        """Optimise the initial noise for ``num_iterations`` steps and return the best images.

        Args:
            prompt: one prompt or a list (one image each).
            rewards: see :func:`build_reward_ensemble`; every member must be differentiable.
            num_inference_steps: denoising steps of the generator (1 for one-step models).
            guidance_scale: CFG scale (> 1 runs CFG), or LCM's embedded guidance ``w``.
            generator: draws the initial noise (when ``latents`` is None) and the scheduler's
                noise, re-seeded to the same state every iteration as in the paper's code.
            latents: initial noise ``z`` ``[B, C, h, w]`` (standard normal scale).
            num_iterations: ReNO iterations (the paper uses 50); one generation each.
            learning_rate: step size (paper: 5.0 for SGD).
            regularization_weight: lambda of the norm regulariser (paper: 0.01); 0 disables it.
            max_grad_norm: per-sample gradient-norm clip (paper: 0.1); None disables it.
            optimizer: "sgd" (Nesterov momentum) or "adam".
            momentum: SGD momentum (paper: 0.9).
            callback_on_step_end: called after each iteration as
                ``callback(pipe, iteration, num_iterations, {"latents", "images", "rewards"})``;
                a returned ``"latents"`` replaces the noise being optimised.

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
        reward = build_reward_ensemble(rewards)
        batch = len(prompts)
        height = height or self.unet.config.sample_size * self.vae_scale_factor
        width = width or self.unet.config.sample_size * self.vae_scale_factor
        device = self._execution_device
        dtype = self.unet.dtype

        # 2. Encode the prompt (fixed through the optimisation)
        prompt_embeds = self.encode_prompt(prompts, device)
        negative_prompt_embeds = None
        if guidance_scale > 1.0 and self.unet.config.time_cond_proj_dim is None:
            negatives = negative_prompt or ""
            negatives = [negatives] * batch if isinstance(negatives, str) else list(negatives)
            negative_prompt_embeds = self.encode_prompt(negatives, device)

        # 3. Prepare the initial noise z, the optimised parameter
        shape = (
            batch,
            self.unet.config.in_channels,
            height // self.vae_scale_factor,
            width // self.vae_scale_factor,
        )
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
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
        best_images = torch.zeros(batch, 3, height, width)
        best_noise = noise.detach().clone()
        for iteration in range(num_iterations):
            if generator is not None:
                generator.set_state(generator_state)  # same scheduler noise every iteration
            with torch.enable_grad():
                images = self.generate(
                    noise.to(dtype),
                    prompt_embeds,
                    negative_prompt_embeds,
                    num_inference_steps,
                    guidance_scale,
                    generator,
                )
                scores = reward(images.float(), prompts).scores.float()  # (B,)
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
