"""Sol-RL: two-stage rollouts, low-precision exploration and full-precision regeneration.

Sol-RL (Speed-of-light RL, 2025; official code and configs in NVlabs/Sana,
``configs/sol_rl/`` and ``train_scripts/sol_rl``) decouples exploration from optimisation:

1. **Exploration.** For each prompt a pool of ``pool_size`` candidates (96) is drawn with a
   quantised copy of the denoiser (NVFP4 on Blackwell; here any backend of
   :mod:`genalign.policies.precision`) and fewer sampling steps (``preview_steps``, 6), and scored.
2. **Selection.** A contrastive subset is kept: the ``keep_top`` best and ``keep_bottom`` worst
   (``best_worst``, 12 + 12), or, for ablations, a ``random`` subset or ``all`` of the pool
   (:func:`genalign.algorithms.sol_rl.select_candidates`).
3. **Regeneration.** Exactly the kept samples are drawn again from the same seeds and initial
   noise in the training precision with the training sampler and step count (10), scored, and
   only they are optimised on (group advantages, then the configured loss; NFT by default).

``preview_steps = 0`` skips the preview: the pool is drawn at training precision and steps and the
kept samples are trained on directly (the "naive scaling" 24-in-96 baseline of the same configs).

Every process holds whole prompts: with ``prompts_per_step`` divisible by the number of
processes, the contiguous rows of the pool and of the kept batch of a process belong to the same
prompts, and the global batch (prompts, pool seeds, random selections) is a pure function of
``(seed, step)``. Each step reports the fidelity of the preview (Kendall tau and Spearman rho
between preview and regenerated rewards of the kept samples, averaged over prompts; the top-k hit
rate) and its time split into exploration, scoring and regeneration (the trainer adds the update).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import torch

from genalign.algorithms.sol_rl import ranking_fidelity, select_candidates
from genalign.policies import Trajectory
from genalign.policies.precision import quantize_denoiser, swapped_denoiser
from genalign.policies.rollout_args import per_sample_generators
from genalign.trainers.strategies.base import STRATEGIES, RolloutBatch, RolloutContext, step_generator
from genalign.trainers.strategies.groups import GroupRolloutStrategy

logger = logging.getLogger(__name__)

__all__ = ["SolRLStrategy"]


@STRATEGIES.register("sol_rl")
class SolRLStrategy(GroupRolloutStrategy):
    """The Sol-RL two-stage rollout strategy (module docstring; config ``train.sol_rl``)."""

    rewards_name = "regenerated rewards"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.sol = config.sol_rl

    # ---- the global batch ----------------------------------------------------------------------
    def global_pool(self, context: RolloutContext, step: int) -> tuple[list[str], torch.Tensor]:
        """The step's distinct prompts ``[P]`` and pool seeds ``[P * pool_size]`` (prompt-major)."""
        generator = step_generator(self.config.seed, step)
        count = self.config.prompts_per_step
        choice = torch.randint(0, len(context.prompts), (count,), generator=generator)
        seeds = torch.randint(0, 2**31 - 1, (count * self.sol.pool_size,), generator=generator)
        return [context.prompts[int(i)] for i in choice], seeds

    def selection(self, preview_rewards: torch.Tensor, step: int) -> torch.Tensor:
        generator = step_generator(self.config.seed, step, 1)
        sol = self.sol
        return select_candidates(preview_rewards, sol.selection, sol.keep_top, sol.keep_bottom, generator)

    # ---- stages --------------------------------------------------------------------------------
    def initial_noise(self, context: RolloutContext, seeds: torch.Tensor) -> torch.Tensor:
        """x_T of each seed, drawn once in the training precision and shared by both stages."""
        policy, sampling = context.policy, context.sampling
        settings = policy.make_settings(
            sampling.num_inference_steps,
            sampling.guidance_scale,
            sampling.height,
            sampling.width,
            sampling.eta,
            sampling.noise_level,
            sampling.mode,
        )
        _, generators = per_sample_generators(len(seeds), None, policy.device, seeds)
        return policy.prepare_latents(len(seeds), settings.height, settings.width, generators)

    def _rollout(
        self,
        context: RolloutContext,
        prompts: list[str],
        seeds: torch.Tensor,
        steps: int,
        chunk: int | None,
        trained: bool = True,
    ) -> Trajectory:
        """Roll out ``prompts`` from ``seeds`` in chunks; ``trained``: the samples are trained on,
        so they run in the update's precision context (``context.precision()``); the quantised
        preview keeps its own precision (``train.sol_rl.preview_precision``)."""
        kwargs = dict(context.rollout_kwargs(), num_inference_steps=steps)
        chunk = chunk or len(prompts)
        parts = []
        for start in range(0, len(prompts), chunk):
            part_seeds = seeds[start : start + chunk]
            noise = self.initial_noise(context, part_seeds)
            with context.precision() if trained else contextlib.nullcontext():
                parts.append(
                    context.policy.rollout(
                        prompts[start : start + chunk], seeds=part_seeds, latents=noise, **kwargs
                    )
                )
        return parts[0] if len(parts) == 1 else Trajectory.concat(parts)

    def _explore(
        self, context: RolloutContext, prompts: list[str], seeds: torch.Tensor
    ) -> tuple[Trajectory, Any]:
        """Stage 1: the local pool, in preview precision and steps (or at training settings);
        also the quantisation report (None without a preview)."""
        sol = self.sol
        if not sol.preview_steps:
            steps = context.sampling.num_inference_steps
            return self._rollout(context, prompts, seeds, steps, sol.preview_batch_size), None
        preview_denoiser, report = quantize_denoiser(
            context.policy.denoiser, sol.preview_precision, sol.skip_modules, sol.min_dim
        )
        with swapped_denoiser(context.policy, preview_denoiser, report.compute_dtype):
            pool = self._rollout(
                context, prompts, seeds, sol.preview_steps, sol.preview_batch_size, trained=False
            )
        del preview_denoiser
        return pool, report

    def _fidelity(
        self, pool_rewards: torch.Tensor, chosen: torch.Tensor, rewards: torch.Tensor, report: Any
    ) -> dict[str, float]:
        """Stage 4: the pool's mean reward and, after a preview, how well it ranked the kept samples.

        ``pool_rewards``: ``[P, N]`` global preview rewards; ``chosen``: ``[P, K]`` kept positions;
        ``rewards``: ``[P * K]`` global regenerated rewards."""
        metrics = {"sol_pool_reward_mean": float(torch.nan_to_num(pool_rewards, nan=0.0).mean())}
        if report is not None:
            preview_kept = torch.gather(pool_rewards, 1, chosen)
            kept = self.sol.kept_per_prompt
            fidelity = ranking_fidelity(
                preview_kept, rewards.reshape(len(pool_rewards), kept), self.sol.keep_top or kept
            )
            metrics.update({f"sol_{k}": v for k, v in fidelity.items()})
            metrics["sol_preview_simulated"] = float(report.simulated)
            metrics["sol_quantized_layers"] = float(len(report.quantized))
        return metrics

    def sample(self, context: RolloutContext, step: int) -> RolloutBatch:
        config, sol = self.config, self.sol
        if config.prompts_per_step % context.num_processes:
            raise ValueError(
                f"sol_rl gives each process whole prompts: train.prompts_per_step {config.prompts_per_step} "
                f"must be divisible by the {context.num_processes} processes"
            )
        pool_size, kept = sol.pool_size, sol.kept_per_prompt
        distinct, pool_seeds = self.global_pool(context, step)
        count = len(distinct)
        pool_prompts = [p for p in distinct for _ in range(pool_size)]
        pool_rows = context.local_rows(count * pool_size)
        times = {"time_exploration": 0.0, "time_scoring": 0.0, "time_regeneration": 0.0}

        # 1. Exploration: the pool, in preview precision and steps (or at training settings)
        start = time.perf_counter()
        local_pool_prompts = [pool_prompts[i] for i in pool_rows.tolist()]
        pool, report = self._explore(context, local_pool_prompts, pool_seeds[pool_rows])
        times["time_exploration"] = time.perf_counter() - start
        start = time.perf_counter()
        pool_rewards, details = context.score(pool)
        times["time_scoring"] += time.perf_counter() - start
        global_pool_rewards = context.gather(pool_rewards).cpu().reshape(count, pool_size)

        # 2. Selection (global, identical on every process)
        chosen = self.selection(global_pool_rewards, step)  # (P, K) pool positions
        selected = (torch.arange(count)[:, None] * pool_size + chosen).flatten()  # (P*K,) pool rows
        prompts = [pool_prompts[int(i)] for i in selected]
        group_ids = torch.arange(count).repeat_interleave(kept)
        rows = context.local_rows(count * kept)

        # 3. Regeneration of exactly the kept samples at training precision and steps
        if sol.preview_steps:
            start = time.perf_counter()
            local_prompts = [prompts[i] for i in rows.tolist()]
            steps = context.sampling.num_inference_steps
            trajectory = self._rollout(context, local_prompts, pool_seeds[selected][rows], steps, None)
            times["time_regeneration"] = time.perf_counter() - start
            start = time.perf_counter()
            rewards, details = context.score(trajectory)
            times["time_scoring"] += time.perf_counter() - start
        else:  # naive scaling: the kept samples are already full-precision trajectories
            offset = int(pool_rows[0])
            local_positions = [int(selected[i]) - offset for i in rows.tolist()]
            trajectory = pool.select(local_positions)
            rewards = pool_rewards[torch.tensor(local_positions, device=pool_rewards.device)]
        trajectory.group_ids = group_ids[rows]
        global_rewards = context.gather(rewards).cpu()

        # 4. Fidelity of the preview ranking and the timing report
        metrics = {**times, **self._fidelity(global_pool_rewards, chosen, global_rewards, report)}
        return RolloutBatch(
            trajectory=trajectory,
            rewards=rewards,
            advantages=torch.zeros_like(rewards),
            global_index=rows,
            global_batch_size=count * kept,
            global_rewards=global_rewards,
            details=details,
            metrics=metrics,
            global_group_ids=group_ids,
            global_prompts=prompts,
        )
