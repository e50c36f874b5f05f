"""Sol-RL: two-stage rollouts, low-precision exploration and full-precision regeneration.

Sol-RL (Speed-of-light RL, 2025; official code and configs in NVlabs/Sana,
``configs/sol_rl/`` and ``train_scripts/sol_rl``) decouples exploration from optimisation:

1. **Exploration.** For each prompt a pool of ``pool_size`` candidates (96) is drawn with a
   quantised copy of the denoiser (NVFP4 on Blackwell; here any backend of
   :mod:`genalign.policies.precision`) and fewer sampling steps (``preview_steps``, 6), and scored.
2. **Selection.** A contrastive subset is kept: the ``keep_top`` best and ``keep_bottom`` worst
   (``best_worst``, 12 + 12), or, for ablations, a ``random`` subset or ``all`` of the pool.
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
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from genalign.policies import Trajectory
from genalign.policies.base import per_sample_generators
from genalign.policies.precision import quantize_denoiser, swapped_denoiser
from genalign.trainers.guards import skip_nonfinite_rewards
from genalign.trainers.strategies import STRATEGIES, GroupRolloutStrategy, RolloutBatch, step_generator

if TYPE_CHECKING:
    from genalign.trainers.trainer import Trainer

logger = logging.getLogger(__name__)

__all__ = ["SolRLBatch", "SolRLStrategy", "ranking_fidelity", "select_candidates"]


@dataclass
class SolRLBatch(RolloutBatch):
    """A :class:`RolloutBatch` with the step's fidelity and timing report (logged by the trainer)."""

    metrics: dict[str, float] = field(default_factory=dict)


def select_candidates(
    rewards: torch.Tensor,
    selection: str,
    keep_top: int,
    keep_bottom: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pool positions kept for each prompt: ``rewards [P, N] -> [P, K]``.

    ``best_worst``: the ``keep_top`` highest rewards (best first) then the ``keep_bottom`` lowest
    (worst first), disjoint even under ties; ``random``: ``keep_top + keep_bottom`` positions drawn
    from ``generator``; ``all``: ``0 .. N-1``. NaN rewards rank below every number.
    """
    prompts, pool = rewards.shape
    if selection == "all":
        return torch.arange(pool).expand(prompts, -1).clone()
    kept = keep_top + keep_bottom
    if kept > pool:
        raise ValueError(f"cannot keep {kept} of a pool of {pool}")
    if selection == "random":
        return torch.stack([torch.randperm(pool, generator=generator)[:kept] for _ in range(prompts)])
    if selection != "best_worst":
        raise ValueError(f"unknown selection {selection!r}; choose best_worst, random or all")
    ranked = torch.nan_to_num(rewards.float(), nan=-math.inf)
    order = torch.argsort(ranked, dim=1, descending=True, stable=True)  # best first
    best = order[:, :keep_top]
    worst = order[:, pool - keep_bottom :].flip(1) if keep_bottom else order[:, :0]
    return torch.cat([best, worst], dim=1)


def ranking_fidelity(preview: torch.Tensor, final: torch.Tensor, top_k: int) -> dict[str, float]:
    """Agreement of two rankings of the same samples, per prompt (rows) and averaged.

    Returns Kendall's tau-b and Spearman's rho (``scipy.stats``; prompts whose rewards are all
    tied are left out) and the top-k hit rate: the fraction of the preview's k best that are among
    the final k best.
    """
    from scipy import stats

    taus, rhos, hits = [], [], []
    for p, f in zip(preview.double().numpy(), final.double().numpy()):
        if len(p) >= 2:
            tau = stats.kendalltau(p, f).statistic
            rho = stats.spearmanr(p, f).statistic
            if math.isfinite(tau):
                taus.append(float(tau))
            if math.isfinite(rho):
                rhos.append(float(rho))
        k = min(top_k, len(p))
        if k > 0:
            top_preview = set(torch.tensor(p).argsort(descending=True, stable=True)[:k].tolist())
            top_final = set(torch.tensor(f).argsort(descending=True, stable=True)[:k].tolist())
            hits.append(len(top_preview & top_final) / k)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else float("nan")

    return {"kendall_tau": mean(taus), "spearman_rho": mean(rhos), "top_k_hit_rate": mean(hits)}


@STRATEGIES.register("sol_rl")
class SolRLStrategy(GroupRolloutStrategy):
    """The Sol-RL two-stage rollout strategy (module docstring; config ``train.sol_rl``)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.sol = config.sol_rl

    # ---- the global batch ----------------------------------------------------------------------
    def global_pool(self, trainer: Trainer, step: int) -> tuple[list[str], torch.Tensor]:
        """The step's distinct prompts ``[P]`` and pool seeds ``[P * pool_size]`` (prompt-major)."""
        generator = step_generator(self.config.seed, step)
        count = self.config.prompts_per_step
        choice = torch.randint(0, len(trainer.prompts), (count,), generator=generator)
        seeds = torch.randint(0, 2**31 - 1, (count * self.sol.pool_size,), generator=generator)
        return [trainer.prompts[int(i)] for i in choice], seeds

    def selection(self, preview_rewards: torch.Tensor, step: int) -> torch.Tensor:
        generator = step_generator(self.config.seed, step, 1)
        sol = self.sol
        return select_candidates(preview_rewards, sol.selection, sol.keep_top, sol.keep_bottom, generator)

    # ---- stages --------------------------------------------------------------------------------
    def initial_noise(self, trainer: Trainer, seeds: torch.Tensor) -> torch.Tensor:
        """x_T of each seed, drawn once in the training precision and shared by both stages."""
        policy = trainer.policy
        kwargs = trainer.rollout_kwargs()
        settings = policy.make_settings(
            kwargs["num_inference_steps"],
            kwargs["guidance_scale"],
            kwargs["height"],
            kwargs["width"],
            kwargs["eta"],
            kwargs["noise_level"],
            kwargs["mode"],
        )
        _, generators = per_sample_generators(len(seeds), None, policy.device, seeds)
        return policy.prepare_latents(len(seeds), settings.height, settings.width, generators)

    def _rollout(
        self,
        trainer: Trainer,
        prompts: list[str],
        seeds: torch.Tensor,
        steps: int,
        chunk: int | None,
        trained: bool = True,
    ) -> Trajectory:
        """Roll out ``prompts`` from ``seeds`` in chunks; ``trained``: the samples are trained on,
        so they run in the update's precision context (``trainer.precision()``); the quantised
        preview keeps its own precision (``train.sol_rl.preview_precision``)."""
        kwargs = dict(trainer.rollout_kwargs(), num_inference_steps=steps)
        chunk = chunk or len(prompts)
        parts = []
        for start in range(0, len(prompts), chunk):
            part_seeds = seeds[start : start + chunk]
            noise = self.initial_noise(trainer, part_seeds)
            with trainer.precision() if trained else contextlib.nullcontext():
                parts.append(
                    trainer.policy.rollout(
                        prompts[start : start + chunk], seeds=part_seeds, latents=noise, **kwargs
                    )
                )
        return parts[0] if len(parts) == 1 else Trajectory.concat(parts)

    def _score(self, trainer: Trainer, trajectory: Trajectory) -> tuple[torch.Tensor, dict[str, Any]]:
        out = trainer.reward(trajectory.images, trajectory.prompts)
        details = {k: v for k, v in out.details.items() if isinstance(v, (int, float))}
        return out.scores.detach().float().to(trainer.device), details

    def collect(self, trainer: Trainer, step: int) -> SolRLBatch:
        config, sol = self.config, self.sol
        processes = trainer.accelerator.num_processes
        if config.prompts_per_step % processes:
            raise ValueError(
                f"sol_rl gives each process whole prompts: train.prompts_per_step {config.prompts_per_step} "
                f"must be divisible by the {processes} processes"
            )
        pool_size, kept = sol.pool_size, sol.kept_per_prompt
        distinct, pool_seeds = self.global_pool(trainer, step)
        count = len(distinct)
        pool_prompts = [p for p in distinct for _ in range(pool_size)]
        pool_rows = trainer.local_rows(count * pool_size)
        times = {"time_exploration": 0.0, "time_scoring": 0.0, "time_regeneration": 0.0}
        metrics: dict[str, float] = {}

        # 1. Exploration: the pool, in preview precision and steps (or at training settings)
        start = time.perf_counter()
        local_pool_prompts = [pool_prompts[i] for i in pool_rows.tolist()]
        preview_denoiser, report = None, None
        steps = sol.preview_steps or trainer.config.sampling.num_inference_steps
        if sol.preview_steps:
            preview_denoiser, report = quantize_denoiser(
                trainer.policy.denoiser, sol.preview_precision, sol.skip_modules, sol.min_dim
            )
            with swapped_denoiser(trainer.policy, preview_denoiser, report.compute_dtype):
                pool = self._rollout(
                    trainer,
                    local_pool_prompts,
                    pool_seeds[pool_rows],
                    steps,
                    sol.preview_batch_size,
                    trained=False,
                )
            del preview_denoiser
        else:
            pool = self._rollout(
                trainer, local_pool_prompts, pool_seeds[pool_rows], steps, sol.preview_batch_size
            )
        times["time_exploration"] = time.perf_counter() - start
        start = time.perf_counter()
        pool_rewards, details = self._score(trainer, pool)
        times["time_scoring"] += time.perf_counter() - start
        global_pool_rewards = trainer.gather(pool_rewards).cpu().reshape(count, pool_size)

        # 2. Selection (global, identical on every process)
        chosen = self.selection(global_pool_rewards, step)  # (P, K) pool positions
        selected = (torch.arange(count)[:, None] * pool_size + chosen).flatten()  # (P*K,) pool rows
        prompts = [pool_prompts[int(i)] for i in selected]
        group_ids = torch.arange(count).repeat_interleave(kept)
        seeds = pool_seeds[selected]
        rows = trainer.local_rows(count * kept)

        # 3. Regeneration of exactly the kept samples at training precision and steps
        if sol.preview_steps:
            start = time.perf_counter()
            local_prompts = [prompts[i] for i in rows.tolist()]
            trajectory = self._rollout(
                trainer, local_prompts, seeds[rows], trainer.config.sampling.num_inference_steps, None
            )
            times["time_regeneration"] = time.perf_counter() - start
            start = time.perf_counter()
            rewards, details = self._score(trainer, trajectory)
            times["time_scoring"] += time.perf_counter() - start
        else:  # naive scaling: the kept samples are already full-precision trajectories
            offset = int(pool_rows[0])
            local_positions = [int(selected[i]) - offset for i in rows.tolist()]
            trajectory = pool.select(local_positions)
            rewards = pool_rewards[torch.tensor(local_positions, device=pool_rewards.device)]
        trajectory.group_ids = group_ids[rows]
        global_rewards = trainer.gather(rewards).cpu()

        # 4. Fidelity of the preview ranking and the timing report
        metrics.update(times)
        metrics["sol_pool_reward_mean"] = float(torch.nan_to_num(global_pool_rewards, nan=0.0).mean())
        if report is not None:
            preview_kept = torch.gather(global_pool_rewards, 1, chosen)
            fidelity = ranking_fidelity(
                preview_kept, global_rewards.reshape(count, kept), sol.keep_top or kept
            )
            metrics.update({f"sol_{k}": v for k, v in fidelity.items()})
            metrics["sol_preview_simulated"] = float(report.simulated)
            metrics["sol_quantized_layers"] = float(len(report.quantized))

        batch = SolRLBatch(
            trajectory=trajectory,
            rewards=rewards,
            advantages=torch.zeros_like(rewards),
            global_index=rows,
            global_batch_size=count * kept,
            global_rewards=global_rewards,
            details=details,
            metrics=metrics,
            global_group_ids=group_ids,
        )
        if skip_nonfinite_rewards(batch, "regenerated rewards"):
            return batch
        advantages = self.advantages(global_rewards, prompts, group_ids)
        batch.advantages = advantages[rows].to(trainer.device)
        return batch
