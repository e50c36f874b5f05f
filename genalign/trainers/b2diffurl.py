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

One training step here is one sampling round of the official code (sample, select, train
``inner_epochs`` epochs), so its "stages" are training steps and its ``history_cnt`` counts steps.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from genalign.policies import Trajectory
from genalign.trainers.guards import skip_nonfinite_rewards
from genalign.trainers.strategies import STRATEGIES, RolloutBatch, RolloutStrategy, step_generator

if TYPE_CHECKING:
    from genalign.trainers.trainer import Trainer

logger = logging.getLogger(__name__)

NORMALISATION_EPS = 1e-8  # official run_select.py

__all__ = [
    "B2DiffuRLStrategy",
    "PromptRewardHistory",
    "branch_advantages",
    "select_in_branch_groups",
    "split_step_at",
    "train_window",
]


# ----------------------------------------------------------------------------- the schedule
def split_step_at(
    step: int,
    num_steps: int,
    start: int,
    end: int,
    increment: int = 1,
    stage_steps: int | None = None,
) -> int:
    """``split_step`` of training step ``step`` (backward progressive training, Sec. 4.1).

    The values are ``start, start + increment, ...``, capped at ``end`` (so the last is ``end``):
    ``L = ceil((end - start) / increment) + 1`` levels. With ``stage_steps`` each level lasts that
    many steps (the last lasts to the end); without, level ``floor(step * L / num_steps)``,
    the official ``run_process.sh`` rule that spreads the levels evenly over ``num_steps``.
    """
    if not 1 <= start <= end:
        raise ValueError(f"split steps need 1 <= start <= end, got start={start}, end={end}")
    if increment < 1:
        raise ValueError(f"increment must be positive, got {increment}")
    levels = math.ceil((end - start) / increment) + 1
    if stage_steps is None:
        if num_steps <= 0:
            raise ValueError(f"num_steps must be positive, got {num_steps}")
        level = step * levels // num_steps
    else:
        if stage_steps <= 0:
            raise ValueError(f"stage_steps must be positive, got {stage_steps}")
        level = step // stage_steps
    return min(end, start + min(level, levels - 1) * increment)


def train_window(split_step: int, num_inference_steps: int) -> torch.Tensor:
    """The trained step indices ``[T - split_step, T)`` (sampling order: index 0 acts on x_T)."""
    if not 1 <= split_step <= num_inference_steps:
        raise ValueError(f"split_step must lie in [1, {num_inference_steps}], got {split_step}")
    return torch.arange(num_inference_steps - split_step, num_inference_steps)


# ----------------------------------------------------------------------------- selection
class PromptRewardHistory:
    """Per-prompt reward normalisation against the rewards of the last ``history_steps`` steps.

    :meth:`normalise` pools, for each prompt, its rewards of this step with those kept from the
    previous ``history_steps`` steps, returns ``(r - mean) / (std + 1e-8)`` (unbiased std, as
    ``torch.std`` in the official code), then stores this step's rewards. A prompt with a single
    pooled reward has no spread: its normalised reward is 0.
    """

    def __init__(self, history_steps: int) -> None:
        if history_steps < 0:
            raise ValueError(f"history_steps must be >= 0, got {history_steps}")
        self.history_steps = history_steps
        self.steps: deque[dict[str, torch.Tensor]] = deque(maxlen=history_steps)

    def normalise(self, prompts: list[str], rewards: torch.Tensor) -> torch.Tensor:
        """``rewards`` ``[N]`` of ``prompts`` (N strings) -> normalised rewards ``[N]`` fp64."""
        if rewards.ndim != 1 or rewards.shape[0] != len(prompts):
            raise ValueError(f"rewards must have shape [{len(prompts)}], got {list(rewards.shape)}")
        values = rewards.detach().double().cpu()
        current: dict[str, list[int]] = {}
        for i, prompt in enumerate(prompts):
            current.setdefault(prompt, []).append(i)
        out = torch.zeros_like(values)
        this_step = {}
        for prompt, index in current.items():
            mine = values[index]
            this_step[prompt] = mine
            pooled = torch.cat([past[prompt] for past in self.steps if prompt in past] + [mine])
            if pooled.numel() < 2:
                continue
            out[index] = (mine - pooled.mean()) / (pooled.std(unbiased=True) + NORMALISATION_EPS)
        if self.history_steps > 0:
            self.steps.append(this_step)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"steps": [dict(step) for step in self.steps]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps.clear()
        for step in state.get("steps", []):
            self.steps.append({prompt: torch.as_tensor(v, dtype=torch.float64) for prompt, v in step.items()})


def select_in_branch_groups(
    scores: torch.Tensor, branches: int, pos_threshold: float, neg_threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the trained samples of each branch group (official ``run_select.py``).

    Args:
        scores: ``[G * branches]`` normalised rewards, branch group ``g`` at rows
            ``g * branches .. (g + 1) * branches - 1``.
        branches: group size.
        pos_threshold / neg_threshold: keep a group's best if ``>= pos_threshold`` and its worst
            if ``< neg_threshold`` (first index on ties).

    Returns:
        ``index`` ``[K]`` long, the kept rows in increasing order, and ``positive`` ``[K]`` bool
        (True for a kept best).
    """
    if scores.ndim != 1 or branches < 1 or scores.shape[0] % branches != 0:
        raise ValueError(f"scores of shape {list(scores.shape)} do not split into groups of {branches}")
    if neg_threshold > pos_threshold:
        raise ValueError(f"neg_threshold {neg_threshold} exceeds pos_threshold {pos_threshold}")
    groups = scores.reshape(-1, branches)  # (G, branches)
    offset = torch.arange(groups.shape[0]) * branches
    best, worst = groups.argmax(dim=1), groups.argmin(dim=1)  # (G,)
    keep_best = groups.gather(1, best[:, None])[:, 0] >= pos_threshold
    keep_worst = groups.gather(1, worst[:, None])[:, 0] < neg_threshold
    rows = torch.cat([(offset + best)[keep_best], (offset + worst)[keep_worst]])
    positive = torch.cat(
        [
            torch.ones(int(keep_best.sum()), dtype=torch.bool),
            torch.zeros(int(keep_worst.sum()), dtype=torch.bool),
        ]
    )
    order = torch.argsort(rows)
    return rows[order], positive[order]


def branch_advantages(
    scores: torch.Tensor, clip: float, pos_weight: float, neg_weight: float
) -> torch.Tensor:
    """``A = clip(z, -clip, clip) * (pos_weight if z > 0 else neg_weight)`` (official ``run_train.py``)."""
    weight = torch.where(scores > 0, torch.full_like(scores, pos_weight), torch.full_like(scores, neg_weight))
    return scores.clamp(-clip, clip) * weight


# ----------------------------------------------------------------------------- the strategy
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
        self, trainer: Trainer, step: int
    ) -> tuple[list[str], torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step's S source prompts, their group ids, source seeds ``[S]`` and branch seeds ``[S, K]``."""
        config = self.config
        generator = step_generator(config.seed, step)
        choice = torch.randint(0, len(trainer.prompts), (config.prompts_per_step,), generator=generator)
        prompts = [trainer.prompts[int(i)] for i in choice for _ in range(config.group_size)]
        group_ids = torch.arange(config.prompts_per_step).repeat_interleave(config.group_size)
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator)
        branch_seeds = torch.randint(0, 2**31 - 1, (len(prompts), self.options.branches), generator=generator)
        return prompts, group_ids, seeds, branch_seeds

    def rollout(
        self,
        trainer: Trainer,
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
            with trainer.precision():  # the update's context: the first inner step is on-policy
                prefix = trainer.policy.rollout(
                    prompts[rows], seeds=seeds[rows], stop_step=start, **trainer.rollout_kwargs()
                )
                parts.append(
                    trainer.policy.continue_rollout(
                        prefix, start, seeds=branch_seeds[rows].reshape(-1), repeats=branches
                    )
                )
        trajectory = parts[0] if len(parts) == 1 else Trajectory.concat(parts)
        trajectory.extras.update(prefix_seeds=seeds.repeat_interleave(branches), branch_step=start)
        return trajectory

    def collect(self, trainer: Trainer, step: int) -> RolloutBatch:
        options = self.options
        branches = options.branches
        num_inference_steps = trainer.config.sampling.num_inference_steps
        split_step = self.split_step(step, num_inference_steps)
        window = train_window(split_step, num_inference_steps)
        start = int(window[0])

        # 1. This process's sources: prefixes drawn once, each continued `branches` times
        prompts, group_ids, seeds, branch_seeds = self.global_batch(trainer, step)
        rows = trainer.local_rows(len(prompts))  # contiguous source rows
        local_prompts = [prompts[i] for i in rows.tolist()]
        trajectory = self.rollout(trainer, local_prompts, seeds[rows], branch_seeds[rows], start)
        trajectory.group_ids = group_ids[rows].repeat_interleave(branches)

        # 2. Score every branch; gather in global order (source-major, branch-minor)
        out = trainer.reward(trajectory.images, trajectory.prompts)
        rewards = out.scores.detach().float().to(trainer.device)  # (S_local * K,)
        global_rewards = trainer.gather(rewards).cpu()  # (S * K,)
        details: dict[str, Any] = {k: v for k, v in out.details.items() if isinstance(v, (int, float))}
        details.update(split_step=split_step, window_start=start)
        batch = RolloutBatch(
            trajectory=trajectory,
            rewards=rewards,
            advantages=torch.zeros_like(rewards),
            global_index=torch.arange(rows[0] * branches, (rows[-1] + 1) * branches) if len(rows) else rows,
            global_batch_size=len(global_rewards),
            global_rewards=global_rewards,
            details=details,
            train_steps=window,
            global_group_ids=torch.arange(len(prompts)).repeat_interleave(branches),
        )
        if skip_nonfinite_rewards(batch):  # before the reward history sees them
            return batch

        # 3. Per-prompt normalisation against the history, selection inside each branch group
        branch_prompts = [p for p in prompts for _ in range(branches)]
        scores = self.history.normalise(branch_prompts, global_rewards).float()  # (S * K,)
        selected, positive = select_in_branch_groups(
            scores, branches, options.pos_threshold, options.neg_threshold
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
            return batch

        # 4. Keep this process's selected rows, indexed by their place in the global selection
        first_local = int(rows[0]) * branches if len(rows) else 0
        mine = [
            (position, int(g) - first_local)
            for position, g in enumerate(selected.tolist())
            if first_local <= int(g) < first_local + trajectory.batch_size
        ]
        positions = torch.tensor([p for p, _ in mine], dtype=torch.long)
        local = [i for _, i in mine]
        batch.trajectory = trajectory.select(local)
        batch.rewards = rewards[torch.tensor(local, dtype=torch.long)]
        batch.advantages = advantages[positions].to(trainer.device)
        batch.global_index = positions
        batch.global_batch_size = int(selected.numel())
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "history" in state:
            self.history.load_state_dict(state["history"])
