"""B2-DiffuRL as a rollout strategy: backward progressive training and branch-based sampling.

Hu et al., "Towards Better Alignment: Training Diffusion Models with Reinforcement Learning Against
Sparse Rewards" (CVPR 2025; official code github.com/hu-zijing/B2-DiffuRL). Only the final image
is rewarded, so a plain policy gradient cannot tell which of the T denoising steps helped. The
method changes *which trajectories exist and which steps are trained*, not the loss, so in genalign
it is a strategy composed with any loss (PPO-clip as in the paper):

1. **Backward progressive training** (Sec. 4.1): a stage trains only the last ``split_step`` steps
   of the chain, the window ``[T - split_step, T)`` in sampling order (x_T first), and
   ``split_step`` grows over training until the whole chain is trained. The official schedule
   (``run_process.sh``) spreads ``split_step = 14 .. 20`` evenly over 100 sampling rounds:
   ``split_step(i) = start + floor(i * L / N)`` for round ``i`` of ``N`` with ``L`` levels.
2. **Branch-based sampling** (Sec. 4.2): each trajectory's prefix ``x_T .. x_{T - split_step}`` is
   drawn once and continued ``branches`` times with fresh noise. Branches share everything before
   the window, so the spread of their rewards is caused by the window's actions alone.
3. **Selection** (official ``run_select.py``): rewards are normalised per prompt by the mean and
   (unbiased) std of that prompt's rewards in this round and the previous ``history_steps``
   rounds, ``z = (r - mean) / (std + 1e-8)``. In each branch group the best branch is kept as a
   positive sample if ``z >= pos_threshold`` and the worst as a negative one if
   ``z < neg_threshold``; the rest are not trained on.
4. **Weighted advantages** (official ``run_train.py``): ``A = clip(z, -c, c) * w`` with
   ``w = pos_weight`` (beta_1) when ``z > 0`` and ``neg_weight`` (beta_2) otherwise.

The math of 1, 3 and 4 is :mod:`genalign.algorithms.b2diffurl`. One training step here is one
sampling round of the official code (sample, select, train ``inner_epochs`` epochs), so its
"stages" are training steps and its ``history_cnt`` counts steps.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from genalign.algorithms.b2diffurl import (
    PromptRewardHistory,
    branch_advantages,
    select_in_branch_groups,
    split_step_at,
    train_window,
)
from genalign.policies import Trajectory
from genalign.trainers.strategies.base import (
    STRATEGIES,
    RolloutBatch,
    RolloutContext,
    RolloutStrategy,
    draw_step_groups,
)

logger = logging.getLogger(__name__)

__all__ = ["B2DiffuRLStrategy"]


@STRATEGIES.register("b2diffurl")
class B2DiffuRLStrategy(RolloutStrategy):
    """Branch-sampled rollouts trained on a backward-growing window of steps (see the module doc).

    Each step draws ``prompts_per_step * group_size`` source samples (prompts with replacement,
    as ``groups`` does), rolls each out to the window start once, continues it ``branches`` times
    and scores all ``S * branches`` images. The returned batch holds only the selected samples,
    with ``train_steps`` the window. Sharding: sources are split over processes in contiguous rows,
    so a branch group never spans processes; selection and advantages are computed from the
    gathered rewards identically on every process; each process keeps its own selected rows with
    their positions in the global selected list. Prompts, source seeds and branch seeds come from
    ``(train.seed, step)`` only.

    The batch's trajectory (hence sample grids and reward monitors) holds the selected samples;
    ``global_rewards`` (the logged ``reward_mean`` and ``samples``) covers every generated image.
    A step in which no branch group passes the thresholds is skipped (nothing to train on).
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self.options = config.b2diffurl
        self.history = PromptRewardHistory(self.options.history_steps)

    def split_step(self, step: int, num_inference_steps: int) -> int:
        options = self.options
        end = options.split_step_end if options.split_step_end is not None else num_inference_steps
        if end > num_inference_steps:
            raise ValueError(
                f"train.b2diffurl.split_step_end {end} exceeds sampling.num_inference_steps {num_inference_steps}"
            )
        return split_step_at(
            step,
            self.config.num_steps,
            options.split_step_start,
            end,
            options.split_step_increment,
            options.stage_steps,
        )

    def global_batch(
        self, context: RolloutContext, step: int
    ) -> tuple[list[str], torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step's S source prompts, their group ids, source seeds ``[S]`` and branch seeds ``[S, K]``."""
        prompts, group_ids, seeds, generator = draw_step_groups(context.prompts, self.config, step)
        branch_seeds = torch.randint(0, 2**31 - 1, (len(prompts), self.options.branches), generator=generator)
        return prompts, group_ids, seeds, branch_seeds

    def rollout(
        self,
        context: RolloutContext,
        prompts: list[str],
        seeds: torch.Tensor,
        branch_seeds: torch.Tensor,
        start: int,
    ) -> Trajectory:
        """Prefixes to step ``start`` once per source, then ``K`` continuations each (source-major rows)."""
        branches = self.options.branches
        chunk = self.options.sample_batch_size or max(len(prompts), 1)
        parts = []
        for first in range(0, len(prompts), chunk):
            rows = slice(first, first + chunk)
            with context.precision():  # the update's context: the first inner step is on-policy
                prefix = context.policy.rollout(
                    prompts[rows], seeds=seeds[rows], stop_step=start, **context.rollout_kwargs()
                )
                parts.append(
                    context.policy.continue_rollout(
                        prefix, start, seeds=branch_seeds[rows].reshape(-1), repeats=branches
                    )
                )
        trajectory = parts[0] if len(parts) == 1 else Trajectory.concat(parts)
        trajectory.extras.update(prefix_seeds=seeds.repeat_interleave(branches), branch_step=start)
        return trajectory

    def sample(self, context: RolloutContext, step: int) -> RolloutBatch:
        """Every branch of this process's sources, scored; the window in ``train_steps``."""
        branches = self.options.branches
        num_inference_steps = context.sampling.num_inference_steps
        split_step = self.split_step(step, num_inference_steps)
        window = train_window(split_step, num_inference_steps)
        start = int(window[0])

        # 1. This process's sources: prefixes drawn once, each continued `branches` times
        prompts, group_ids, seeds, branch_seeds = self.global_batch(context, step)
        rows = context.local_rows(len(prompts))  # contiguous source rows
        local_prompts = [prompts[i] for i in rows.tolist()]
        trajectory = self.rollout(context, local_prompts, seeds[rows], branch_seeds[rows], start)
        trajectory.group_ids = group_ids[rows].repeat_interleave(branches)

        # 2. Score every branch; gather in global order (source-major, branch-minor)
        rewards, details = context.score(trajectory)  # (S_local * K,)
        global_rewards = context.gather(rewards).cpu()  # (S * K,)
        details.update(split_step=split_step, window_start=start)
        return RolloutBatch(
            trajectory=trajectory,
            rewards=rewards,
            advantages=torch.zeros_like(rewards),
            global_index=torch.arange(rows[0] * branches, (rows[-1] + 1) * branches) if len(rows) else rows,
            global_batch_size=len(global_rewards),
            global_rewards=global_rewards,
            details=details,
            train_steps=window,
            global_group_ids=torch.arange(len(prompts)).repeat_interleave(branches),
            global_prompts=[p for p in prompts for _ in range(branches)],
        )

    def assign_advantages(self, batch: RolloutBatch, context: RolloutContext) -> None:
        """Select in each branch group, weight the advantages and keep this process's selected rows."""
        options, details = self.options, batch.details
        # 3. Per-prompt normalisation against the history, selection inside each branch group
        scores = self.history.normalise(batch.global_prompts, batch.global_rewards).float()  # (S * K,)
        selected, positive = select_in_branch_groups(
            scores, options.branches, options.pos_threshold, options.neg_threshold
        )
        advantages = branch_advantages(
            scores[selected], self.config.advantage_clip, options.pos_weight, options.neg_weight
        )
        details.update(selected=int(selected.numel()), selected_positive=int(positive.sum()))
        details["selected_negative"] = int((~positive).sum())
        if selected.numel() == 0:
            batch.skipped = True
            batch.reason = (
                f"no branch group passed the selection thresholds (pos >= {options.pos_threshold}, "
                f"neg < {options.neg_threshold})"
            )
            return

        # 4. Keep this process's selected rows, indexed by their place in the global selection
        local_row = {int(g): i for i, g in enumerate(batch.global_index.tolist())}
        mine = [
            (position, local_row[int(g)])
            for position, g in enumerate(selected.tolist())
            if int(g) in local_row
        ]
        positions = torch.tensor([p for p, _ in mine], dtype=torch.long)
        local = [i for _, i in mine]
        batch.trajectory = batch.trajectory.select(local)
        batch.rewards = batch.rewards[torch.tensor(local, dtype=torch.long)]
        batch.advantages = advantages[positions].to(context.device)
        batch.global_index = positions
        batch.global_batch_size = int(selected.numel())

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "history" in state:
            self.history.load_state_dict(state["history"])
