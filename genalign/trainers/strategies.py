"""Rollout strategies: which trajectories exist in a training step and what their advantages are.

A strategy returns a :class:`RolloutBatch` holding this process's share of the step's global
batch. The global batch (prompts, per-sample seeds) is a pure function of ``(seed, step)``, so
every process agrees on it, a resumed run redraws exactly what the original would have, and N
processes together produce the same samples as one process with the same global batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from genalign.algorithms import PerPromptStatTracker, clip_advantages, group_advantages
from genalign.policies import Trajectory
from genalign.registry import Registry
from genalign.trainers.guards import skip_nonfinite_rewards

if TYPE_CHECKING:
    from genalign.trainers.trainer import Trainer

logger = logging.getLogger(__name__)

STRATEGIES: Registry[type[RolloutStrategy]] = Registry("rollout strategy")


def step_generator(seed: int, *keys: int) -> torch.Generator:
    """A generator determined by ``seed`` and integer keys (step, epoch, ...)."""
    value = seed
    for key in keys:
        value = (value * 1_000_003 + key + 1) % (2**63 - 1)
    return torch.Generator().manual_seed(value)


@dataclass
class RolloutBatch:
    """This process's share of one step's samples.

    Attributes:
        trajectory: the local trajectories (B_local).
        rewards: ``[B_local]`` fp32.
        advantages: ``[B_local]`` fp32.
        global_index: ``[B_local]`` position of each local sample in the global batch.
        global_batch_size: samples in the step across all processes.
        global_rewards: ``[B_global]`` for logging.
        skipped: the step must not be applied (e.g. a NaN reward); ``reason`` says why.
        train_steps: the step indices the update may train on (default: every stochastic step
            of the trajectory); a strategy that trains a window of the chain sets it.
        global_group_ids: ``[B_global]`` the comparison group of each global sample (a prompt's
            group, a source's branches), for the within-group reward diagnostics; None: unknown.
    """

    trajectory: Trajectory
    rewards: torch.Tensor
    advantages: torch.Tensor
    global_index: torch.Tensor
    global_batch_size: int
    global_rewards: torch.Tensor
    details: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False
    reason: str = ""
    train_steps: torch.Tensor | None = None
    global_group_ids: torch.Tensor | None = None


class RolloutStrategy:
    """Base class: ``collect(trainer, step) -> RolloutBatch``; ``state_dict`` for checkpoints.

    Rollouts that are trained on run inside ``trainer.precision()``, the context in which the
    update recomputes their log-probs, so the first inner step is exactly on-policy; rewards are
    scored outside it, as in ddpo-pytorch and flow_grpo.
    """

    def collect(self, trainer: Trainer, step: int) -> RolloutBatch:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@STRATEGIES.register("groups")
class GroupRolloutStrategy(RolloutStrategy):
    """Plain prompt groups: ``group_size`` samples for each of ``prompts_per_step`` prompts.

    Advantages (``train.advantage``): ``group`` — GRPO / Flow-GRPO group-relative normalisation
    (Shao et al. 2024; Liu et al. 2025), with ``advantage_std`` choosing the group's or the global
    std; ``tracker`` — DDPO's per-prompt statistics tracker with a history buffer (Black et al.
    2023, Sec. 5); ``batch`` — normalisation by the batch mean and std.
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self.tracker = PerPromptStatTracker(config.tracker_buffer_size, config.tracker_min_count)

    def global_batch(self, trainer: Trainer, step: int) -> tuple[list[str], torch.Tensor, torch.Tensor]:
        """The step's prompts (each repeated group_size times), group ids and seeds, all global."""
        config = self.config
        generator = step_generator(config.seed, step)
        choice = torch.randint(0, len(trainer.prompts), (config.prompts_per_step,), generator=generator)
        prompts = [trainer.prompts[int(i)] for i in choice for _ in range(config.group_size)]
        group_ids = torch.arange(config.prompts_per_step).repeat_interleave(config.group_size)
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator)
        return prompts, group_ids, seeds

    def advantages(self, rewards: torch.Tensor, prompts: list[str], group_ids: torch.Tensor) -> torch.Tensor:
        config = self.config
        if config.advantage == "group":
            advantages = group_advantages(rewards, group_ids, std=config.advantage_std)
        elif config.advantage == "tracker":
            advantages = self.tracker.update(prompts, rewards)
        else:
            advantages = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + 1e-4)
        return clip_advantages(advantages.float(), config.advantage_clip)

    def collect(self, trainer: Trainer, step: int) -> RolloutBatch:
        prompts, group_ids, seeds = self.global_batch(trainer, step)
        rows = trainer.local_rows(len(prompts))
        local_prompts = [prompts[i] for i in rows.tolist()]
        with trainer.precision():
            trajectory = trainer.policy.rollout(local_prompts, seeds=seeds[rows], **trainer.rollout_kwargs())
        trajectory.group_ids = group_ids[rows]
        out = trainer.reward(trajectory.images, local_prompts)
        rewards = out.scores.detach().float().to(trainer.device)
        global_rewards = trainer.gather(rewards).cpu()
        batch = RolloutBatch(
            trajectory=trajectory,
            rewards=rewards,
            advantages=torch.zeros_like(rewards),
            global_index=rows,
            global_batch_size=len(prompts),
            global_rewards=global_rewards,
            details={k: v for k, v in out.details.items() if isinstance(v, (int, float))},
            global_group_ids=group_ids,
        )
        if skip_nonfinite_rewards(batch):  # before the tracker or the advantages see them
            return batch
        advantages = self.advantages(global_rewards, prompts, group_ids)
        batch.advantages = advantages[rows].to(trainer.device)
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "tracker" in state:
            self.tracker.load_state_dict(state["tracker"])
