"""The ``ar_video`` family: block-causal autoregressive video generators, sampled Self-Forcing style.

Self-Forcing (Huang et al. 2025, arXiv 2506.08009), Causal Forcing and LongLive distil Wan2.1 into
causal few-step generators that produce a video block by block. This family runs that sampler on
diffusers components: a ``SkyReelsV2DiffusionForcingPipeline`` whose
``SkyReelsV2Transformer3DModel`` has ``num_frame_per_block = k`` (a block-causal attention
mask; for framewise models, k = 1, the mask diffusers omits is applied by
:mod:`genalign.policies.video_kv_cache`) and takes per-frame timesteps ``[B, F]``
(``enable_diffusion_forcing=True``), an ``AutoencoderKLWan`` and a T5 / UMT5 text encoder.

Rollout (Self-Forcing's ``CausalInferencePipeline``; kernel :func:`genalign.sampling.self_forcing_step`):
the latent video ``[B, C, F, h, w]`` is drawn in blocks of k frames. Each block starts from its
slice of the initial noise and takes T steps on the warped grid (4 steps: model timesteps
1000, 937.5, 833.3, 625 from 1000/750/500/250 with shift 5); each step predicts x0 and re-noises
it with fresh noise from the sample's own generator, the last step keeps x0. The finished block is
then context for the later ones, seen at timestep 0 (``context_noise = 0``). Two exact ways to
give it as context:

* ``kv_cache=False``: recompute the prefix; each step runs the transformer on ``[clean context
  at t = 0, current block at t]`` under the block-causal mask (the reference path);
* ``kv_cache=True`` (default): the clean block is run once at t = 0 and its keys and values are
  kept (:mod:`genalign.policies.video_kv_cache`); the outputs equal the recompute path's.

``local_window`` (None: full block-causal attention) sets LongLive's short window with sink frames
(:class:`genalign.policies.video_kv_cache.LocalWindow`; LongLive-1.3B: ``LocalWindow(12, 3)``)
on every path: rollouts (cached or recomputed), log-prob recomputation and streaming windows. With
it the cache stays bounded, so rollouts may run far past the length the model was trained on.

No classifier-free guidance (the distilled models sample at guidance 1, as Astrolabe's rollouts).

Trajectory layout: ``latents[:, i]`` ``[B, C, F, h, w]`` holds every block's sample before step
i (the blocks' chains side by side), ``latents[:, T]`` the clean video; ``log_probs[:, i]`` is the
exact log-density of step i summed over blocks (the last step is deterministic: 0); ``images``
is the decoded video ``[B, F_pixels, 3, H, W]`` in [0, 1]. :meth:`step` recomputes a step's
log-prob under the current weights (clean context of the recorded video, the recompute path).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers.utils.torch_utils import randn_tensor

from genalign.policies.base import DiffusionPolicy
from genalign.policies.rollout_args import per_sample_generators, validate_rollout_arguments
from genalign.policies.trajectory import Trajectory
from genalign.policies.video_kv_cache import LocalWindow, VideoKVCache, block_kv_cache, causal_forward
from genalign.sampling import StepOutput
from genalign.sampling.self_forcing import self_forcing_step, self_forcing_timesteps, uniform_denoising_steps
from genalign.utils.quiet import quiet_messages

__all__ = ["ARVideoPolicy"]

NUM_TRAIN_TIMESTEPS = 1000


class ARVideoPolicy(DiffusionPolicy):
    """A block-causal video transformer sampled block by block (module docstring).

    Class attributes a user may change: ``timestep_shift`` (5.0, Self-Forcing's), ``context_timestep``
    (0, the official ``context_noise``), ``default_num_blocks`` (7: 21 latent frames in blocks of 3),
    ``local_window`` (None; a :class:`~genalign.policies.video_kv_cache.LocalWindow` for LongLive).
    """

    family = "ar_video"
    default_steps = 4
    default_guidance_scale = 1.0
    denoiser_name = "transformer"
    default_num_blocks = 7
    timestep_shift = 5.0
    context_timestep = 0.0
    default_resolution = (480, 832)  # Self-Forcing / Astrolabe's 480 x 832
    local_window: LocalWindow | None = None

    def __init__(self, pipeline: Any, **kwargs: Any) -> None:
        transformer = getattr(pipeline, "transformer", None)
        if type(transformer).__name__ != "SkyReelsV2Transformer3DModel":
            raise ValueError(
                "the ar_video family runs a SkyReelsV2Transformer3DModel (a SkyReelsV2DiffusionForcingPipeline), "
                f"got {type(transformer).__name__}"
            )
        if int(transformer.config.num_frame_per_block) < 1:
            raise ValueError(
                f"transformer.config.num_frame_per_block is {transformer.config.num_frame_per_block}: "
                "a block holds at least one latent frame"
            )
        super().__init__(pipeline, **kwargs)

    @classmethod
    def from_pretrained(
        cls, *args: Any, local_window: LocalWindow | Sequence[int] | None = None, **kwargs: Any
    ):
        """:meth:`DiffusionPolicy.from_pretrained`, and ``local_window`` (a :class:`LocalWindow` or
        ``(local_frames, sink_frames)``; LongLive-1.3B: ``(12, 3)``) set on the loaded policy."""
        policy = super().from_pretrained(*args, **kwargs)
        if local_window is not None:
            window = local_window if isinstance(local_window, LocalWindow) else LocalWindow(*local_window)
            window.check_block(policy.block_size)
            policy.local_window = window
        return policy

    @classmethod
    def load_pipeline(cls, path: str | Path, **kwargs: Any) -> Any:
        """:meth:`DiffusionPolicy.load_pipeline`, without diffusers' warning that a CLIP text tower
        is not the UMT5 the SkyReels pipeline names: the toy video generators condition on toy-clip's
        text tower by design (their cards), which a user cannot and need not change."""
        with quiet_messages(
            ["diffusers.pipelines.pipeline_utils"], "Expected types for text_encoder", "CLIPTextModel"
        ):
            return super().load_pipeline(path, **kwargs)

    # ---- the model's shape -----------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        """Latent frames per block (the transformer's ``num_frame_per_block``)."""
        return int(self.denoiser.config.num_frame_per_block)

    @property
    def temporal_factor(self) -> int:
        """Pixel frames per latent frame after the first (the VAE's temporal compression; Wan: 4)."""
        return int(self.pipeline.vae_scale_factor_temporal)

    @property
    def max_sequence_length(self) -> int:
        """Text tokens per prompt: Wan's 512, or fewer when the tokenizer holds fewer."""
        return int(min(512, self.pipeline.tokenizer.model_max_length))

    def default_size(self) -> tuple[int, int]:
        return self.default_resolution

    def size_multiple(self) -> int:
        return int(self.pipeline.vae_scale_factor_spatial) * int(self.denoiser.config.patch_size[1])

    def check_num_frames(self, num_frames: int | None) -> int:
        """Latent frames of a rollout: a positive multiple of the block size (default 7 blocks)."""
        if num_frames is None:
            return self.default_num_blocks * self.block_size
        if not isinstance(num_frames, int) or num_frames <= 0 or num_frames % self.block_size:
            raise ValueError(
                f"num_frames {num_frames!r} must be a positive multiple of the block size {self.block_size} (latent frames)"
            )
        return num_frames

    def rollout_timesteps(self, num_inference_steps: int) -> torch.Tensor:
        """The warped model timesteps ``[T]`` of a T-step rollout (4: 1000, 937.5, 833.3, 625)."""
        grid = uniform_denoising_steps(num_inference_steps, NUM_TRAIN_TIMESTEPS)
        return self_forcing_timesteps(grid, self.timestep_shift, NUM_TRAIN_TIMESTEPS)

    # ---- family hooks ----------------------------------------------------------------------------
    def encode_prompts(self, prompts, guidance_scale, negative_prompt):
        embeds, _ = self.pipeline.encode_prompt(
            list(prompts),
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return {"prompt_embeds": embeds}

    def prepare_video_latents(
        self, batch_size: int, height: int, width: int, num_frames: int, generators: list[torch.Generator]
    ) -> torch.Tensor:
        """Initial noise ``[B, C, F, h, w]`` (fp32), each sample's from its own generator."""
        factor = int(self.pipeline.vae_scale_factor_spatial)
        channels = int(self.denoiser.config.in_channels)
        shape = (batch_size, channels, num_frames, height // factor, width // factor)
        return randn_tensor(shape, generator=generators, device=self.device, dtype=torch.float32)

    def transformer_output(
        self, latents: torch.Tensor, timesteps: torch.Tensor, conditioning: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The flow output ``v`` ``[B, C, F, h, w]`` (fp32) of the whole sequence ``latents`` at
        per-frame model timesteps ``timesteps`` ``[B, F]``, under the block-causal mask (and the
        local window, when set: through an empty cache, which applies it as a mask)."""
        embeds = conditioning["prompt_embeds"].to(self.device, self.model_dtype)
        latents = latents.to(self.device, self.model_dtype)
        timesteps = timesteps.to(self.device, torch.float32)
        return causal_forward(self.denoiser, latents, timesteps, embeds, self.local_window).float()

    def predict_video_x0(
        self, latents: torch.Tensor, timesteps: torch.Tensor, conditioning: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """x0 = x_t - sigma v per frame, ``sigma = timestep / 1000`` (``[B, C, F, h, w]``, fp32)."""
        velocity = self.transformer_output(latents, timesteps, conditioning)
        sigma = (timesteps.to(velocity.device, torch.float32) / NUM_TRAIN_TIMESTEPS)[:, None, :, None, None]
        return latents.to(velocity.device).float() - sigma * velocity

    def predict_window_x0(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        conditioning: dict[str, torch.Tensor],
        window_start: int,
    ) -> torch.Tensor:
        """x0 of the window frames ``latents[:, :, window_start:]`` only (``[B, C, F_w, h, w]``),
        the frames before it a detached history: they run block by block without gradient into a
        KV cache (under :attr:`local_window` it evicts what no later block sees, so its size stays
        bounded at any history length), the window attends to it. Values equal
        :meth:`predict_video_x0`'s on the window; gradients reach only the window's own
        computation, so training memory follows the window's length. ``window_start`` must be a
        multiple of the block size."""
        if window_start % self.block_size or not 0 <= window_start < latents.shape[2]:
            raise ValueError(
                f"window_start {window_start} must be a multiple of the block size {self.block_size} "
                f"below the {latents.shape[2]} latent frames"
            )
        embeds = conditioning["prompt_embeds"].to(self.device, self.model_dtype)
        latents = latents.to(self.device, self.model_dtype)
        timesteps = timesteps.to(self.device, torch.float32)
        with block_kv_cache(self.denoiser, self.local_window) as cache:
            with torch.no_grad():  # block by block: the prefill's peak follows a block, not the history
                for start in range(0, window_start, self.block_size):
                    stop = start + self.block_size
                    cache.run(latents[:, :, start:stop], timesteps[:, start:stop], embeds, write=True)
            # a copy: a view would keep the whole video's latents alive in the saved graph
            window = latents[:, :, window_start:].clone()
            velocity = cache.run(window, timesteps[:, window_start:], embeds, write=False).float()
        sigma = (timesteps[:, window_start:] / NUM_TRAIN_TIMESTEPS)[:, None, :, None, None]
        return window.float() - sigma * velocity

    def block_output(
        self,
        block: torch.Tensor,
        timestep: torch.Tensor,
        context: torch.Tensor,
        conditioning: dict[str, torch.Tensor],
        cache: VideoKVCache | None = None,
    ) -> torch.Tensor:
        """The flow output ``[B, C, k, h, w]`` of one block at per-sample model timestep ``[B]``
        given the clean ``context`` frames ``[B, C, F_ctx, h, w]`` before it: from the ``cache``
        (which holds them) or by recomputing the prefix at ``context_timestep``."""
        batch, num_block = block.shape[0], block.shape[2]
        block_t = timestep.to(self.device, torch.float32).reshape(batch, 1).expand(batch, num_block)
        if cache is not None:
            embeds = conditioning["prompt_embeds"].to(self.device, self.model_dtype)
            return cache.run(block.to(self.model_dtype), block_t, embeds, write=False).float()
        num_context = context.shape[2]
        context_t = torch.full((batch, num_context), self.context_timestep, device=self.device)
        latents = torch.cat([context.to(block.dtype), block], dim=2)
        out = self.transformer_output(latents, torch.cat([context_t, block_t], dim=1), conditioning)
        return out[:, :, num_context:]

    def decode(self, latents, settings):
        """Latents ``[B, C, F, h, w]`` -> video ``[B, F_pixels, 3, H, W]`` in [0, 1]."""
        vae = self.pipeline.vae
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, vae.dtype)
        std = torch.tensor(vae.config.latents_std).view(shape).to(latents.device, vae.dtype)
        video = vae.decode(latents.to(vae.dtype) * std + mean, return_dict=False)[0]  # (B, 3, F', H, W)
        return (video.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4)

    # ---- rollout ---------------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(
        self,
        prompts: Sequence[str],
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        height: int | None = None,
        width: int | None = None,
        num_frames: int | None = None,
        group_size: int = 1,
        generator: torch.Generator | int | None = None,
        seeds: torch.Tensor | None = None,
        latents: torch.Tensor | None = None,
        negative_prompt: str = "",
        kv_cache: bool = True,
    ) -> Trajectory:
        """Sample ``group_size`` videos per prompt block by block (module docstring).

        Args:
            num_inference_steps: steps per block (4: the official grid).
            num_frames: latent frames, a multiple of the block size (default 7 blocks).
            generator / seeds: one generator per sample, as every family (initial noise of all
                frames first, then each step's re-noising noise in sampling order).
            latents: optional initial noise ``[B, C, F, h, w]``.
            kv_cache: keep the context's keys and values (True) or recompute the prefix (False);
                both give the same videos.
        """
        steps = num_inference_steps if num_inference_steps is not None else self.default_steps
        validate_rollout_arguments(prompts, steps, group_size)
        if guidance_scale is not None and float(guidance_scale) != 1.0:
            raise ValueError(
                f"guidance_scale {guidance_scale}: the ar_video family samples without classifier-free "
                "guidance (distilled models, guidance 1.0)"
            )
        settings = self.make_settings(steps, 1.0, height, width, 0.0, 0.0, "sde")
        num_frames = self.check_num_frames(num_frames)
        expanded = [p for p in prompts for _ in range(group_size)]
        batch = len(expanded)
        seeds, generators = per_sample_generators(batch, generator, self.device, seeds)
        # 1. Encode prompts
        conditioning = self.encode_prompts(expanded, 1.0, negative_prompt)
        # 2. Initial noise of every frame, from each sample's own generator
        if latents is None:
            latents = self.prepare_video_latents(
                batch, settings.height, settings.width, num_frames, generators
            )
        elif latents.shape[0] != batch or latents.shape[2] != num_frames:
            raise ValueError(
                f"latents has shape {tuple(latents.shape)}, expected [{batch}, C, {num_frames}, h, w]"
            )
        # 3. Timesteps
        timesteps = self.rollout_timesteps(steps).to(self.device)
        # 4. Block-by-block denoising
        chain, log_probs, stds = self._sample_blocks(
            latents.float(), timesteps, conditioning, generators, kv_cache
        )
        # 5. Decode
        video = self.decode(chain[:, -1], settings)
        return Trajectory(
            prompts=expanded,
            group_ids=torch.arange(len(prompts)).repeat_interleave(group_size),
            seeds=seeds,
            latents=chain,
            timesteps=timesteps[None].expand(batch, -1).clone(),
            log_probs=log_probs,
            stds=stds,
            images=video,
            conditioning=conditioning,
            settings=settings,
        )

    def _sample_blocks(
        self,
        noise: torch.Tensor,
        timesteps: torch.Tensor,
        conditioning: dict[str, torch.Tensor],
        generators: list[torch.Generator],
        kv_cache: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The chain ``[B, T + 1, C, F, h, w]``, log-probs ``[B, T]`` and stds ``[B, T]``."""
        batch, num_frames, num_steps = noise.shape[0], noise.shape[2], len(timesteps)
        sigmas = torch.cat([timesteps.float().cpu() / NUM_TRAIN_TIMESTEPS, torch.zeros(1)])
        chain = noise.new_zeros(batch, num_steps + 1, *noise.shape[1:])
        log_probs = torch.zeros(batch, num_steps)
        stds = sigmas[1:][None].expand(batch, -1).clone()
        with contextlib.ExitStack() as stack:
            cache = (
                stack.enter_context(block_kv_cache(self.denoiser, self.local_window)) if kv_cache else None
            )
            for start in range(0, num_frames, self.block_size):
                frames = slice(start, start + self.block_size)
                sample = noise[:, :, frames]
                for i in range(num_steps):
                    chain[:, i, :, frames] = sample
                    t = timesteps[i].expand(batch)
                    velocity = self.block_output(sample, t, chain[:, -1, :, :start], conditioning, cache)
                    out = self_forcing_step(velocity, sample, sigmas[i], sigmas[i + 1], generator=generators)
                    sample = out.prev_sample
                    log_probs[:, i] += out.log_prob.cpu()
                chain[:, -1, :, frames] = sample
                if cache is not None:  # the clean block, re-run at the context timestep, becomes context
                    context_t = torch.full(
                        (batch, self.block_size), self.context_timestep, device=self.device
                    )
                    embeds = conditioning["prompt_embeds"].to(self.model_dtype)
                    cache.run(sample.to(self.model_dtype), context_t, embeds, write=True)
        return chain, log_probs, stds

    def continue_rollout(self, *args: Any, **kwargs: Any) -> Trajectory:
        raise NotImplementedError("the ar_video family does not branch trajectories (continue_rollout)")

    # ---- log-probs under the current weights -----------------------------------------------------
    def step(self, trajectory: Trajectory, step_index: torch.Tensor | int) -> StepOutput:
        """Recompute step ``latents[:, i] -> latents[:, i + 1]`` of every block (per-sample ``i``
        ``[B]`` or an int) under the current weights, each block given the recorded clean video
        before it as context; ``log_prob`` ``[B]`` sums the blocks'. Gradients flow."""
        batch, num_steps = trajectory.batch_size, trajectory.num_steps
        if isinstance(step_index, int):
            step_index = torch.full((batch,), step_index, dtype=torch.long)
        step_index = step_index.to(torch.long).cpu()
        if step_index.shape != (batch,) or int(step_index.min()) < 0 or int(step_index.max()) >= num_steps:
            raise ValueError(
                f"step_index must be an int or shape ({batch},) in [0, {num_steps}), got {step_index.tolist()}"
            )
        rows = torch.arange(batch)
        timesteps = trajectory.timesteps.float().cpu()
        padded = torch.cat([timesteps, torch.zeros(batch, 1)], dim=1) / NUM_TRAIN_TIMESTEPS
        sigma, sigma_next = padded[rows, step_index], padded[rows, step_index + 1]
        sample_all = trajectory.latents[rows, step_index]  # (B, C, F, h, w)
        target_all = trajectory.latents[rows, step_index + 1]
        clean = trajectory.latents[:, -1]
        outs = []
        for start in range(0, sample_all.shape[2], self.block_size):
            frames = slice(start, start + self.block_size)
            velocity = self.block_output(
                sample_all[:, :, frames],
                timesteps[rows, step_index],
                clean[:, :, :start],
                trajectory.conditioning,
            )
            outs.append(
                self_forcing_step(
                    velocity, sample_all[:, :, frames], sigma, sigma_next, target_all[:, :, frames]
                )
            )
        return StepOutput(
            prev_sample=target_all,
            mean=torch.cat([o.mean for o in outs], dim=2),
            std=outs[0].std,
            log_prob=torch.stack([o.log_prob for o in outs]).sum(dim=0),
            pred_original_sample=torch.cat([o.pred_original_sample for o in outs], dim=2),
        )
