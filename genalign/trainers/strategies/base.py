"""What every rollout strategy shares: the rollout context, the batch it returns and the base class.

A strategy decides which trajectories exist in a training step and what their advantages are. It
returns a :class:`RolloutBatch` holding this process's share of the step's global batch. The
global batch (prompts, per-sample seeds) is a pure function of ``(seed, step)``, so every process
agrees on it, a resumed run redraws exactly what the original would have, and N processes together
produce the same samples as one process with the same global batch.

A strategy sees a :class:`RolloutContext` (policy, reward, prompt pool, sampling settings and the
process's place in the run), never the trainer.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from genalign.policies import LanguagePolicy, TokenTrajectory, Trajectory
from genalign.registry import Registry
from genalign.trainers.guards import skip_nonfinite_rewards

if TYPE_CHECKING:
    from genalign.policies import DiffusionPolicy
    from genalign.rewards import Reward
    from genalign.trainers.config import SamplingConfig

STRATEGIES: Registry[type[RolloutStrategy]] = Registry("rollout strategy")

__all__ = [
    "STRATEGIES",
    "RolloutBatch",
    "RolloutContext",
    "RolloutStrategy",
    "IndexedRollout",
    "draw_indexed_groups",
    "draw_pool_rows",
    "draw_prompt_groups",
    "draw_step_groups",
    "rollout_indexed_groups",
    "step_generator",
]


def step_generator(seed: int, *keys: int) -> torch.Generator:
    """A generator determined by ``seed`` and integer keys (step, epoch, ...)."""
    value = seed
    for key in keys:
        value = (value * 1_000_003 + key + 1) % (2**63 - 1)
    return torch.Generator().manual_seed(value)


@dataclass
class RolloutContext:
    """What a strategy may use to roll out and score one step.

    Attributes:
        policy: the trained policy.
        reward: the training reward.
        prompts: the prompt pool.
        sampling: the recipe's sampling settings (``num_inference_steps``, guidance, eta, ...).
        device: the device rewards are kept on.
        num_processes: processes sharing the global batch.
        local_rows: ``global_batch_size -> LongTensor`` of this process's contiguous rows.
        gather: concatenates a per-process ``[B_local]`` tensor over processes (identity for one).
        precision: the context trained-on rollouts run in: the one the update recomputes
            log-probs in, so the first inner step is exactly on-policy.
    """

    policy: DiffusionPolicy | LanguagePolicy
    reward: Reward
    prompts: list[str]
    sampling: SamplingConfig
    device: torch.device
    num_processes: int = 1
    local_rows: Callable[[int], torch.Tensor] = lambda size: torch.arange(size)
    gather: Callable[[torch.Tensor], torch.Tensor] = lambda tensor: tensor
    precision: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    def rollout_kwargs(self, training: bool = True) -> dict[str, Any]:
        """The sampling settings as keyword arguments of ``policy.rollout`` (a language policy's:
        ``sampling.language``); ``training`` applies ``sampling.training``, the settings of the
        training rollouts only (False: the settings evaluations use)."""
        s = self.sampling
        if isinstance(self.policy, LanguagePolicy):
            return s.language.rollout_kwargs()
        settings = {
            "num_sde_steps": s.num_sde_steps,
            "num_inference_steps": s.num_inference_steps,
            "guidance_scale": s.guidance_scale,
            "eta": s.eta,
            "noise_level": s.noise_level,
            "mode": s.mode,
            "height": s.height,
            "width": s.width,
            "negative_prompt": s.negative_prompt,
            "lcm_schedule": s.lcm_schedule,
            "lcm_final_noise": s.lcm_final_noise,
        } | (s.training if training else {})
        if settings["num_sde_steps"] is None:  # every step stochastic: the policy's default
            del settings["num_sde_steps"]
        return settings

    def score(
        self, trajectory: Trajectory | TokenTrajectory, outputs: Any = None, **metadata: Any
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Rewards ``[B_local]`` fp32 on :attr:`device` and the reward's numeric details; the
        reward scores ``outputs`` (default ``trajectory.outputs``: images, or a language policy's
        completions; the ``svg`` strategy passes the extracted SVGs) and gets ``metadata`` (per
        sample, e.g. ``targets`` and ``reference_svgs``) as keyword arguments."""
        rewards, details, _ = self.score_per_sample(trajectory, outputs, **metadata)
        return rewards, details

    def score_per_sample(
        self, trajectory: Trajectory | TokenTrajectory, outputs: Any = None, **metadata: Any
    ) -> tuple[torch.Tensor, dict[str, Any], dict[str, torch.Tensor]]:
        """:meth:`score`, and the reward's per-sample details: each ``[B_local]`` tensor of its
        ``details`` (an ``ensemble``'s member scores), detached, fp32 on :attr:`device`."""
        outputs = trajectory.outputs if outputs is None else outputs
        out = self.reward(outputs, list(trajectory.prompts), **metadata)
        details = {k: v for k, v in out.details.items() if isinstance(v, (int, float))}
        batch = len(trajectory.prompts)
        per_sample = {
            k: v.detach().float().to(self.device)
            for k, v in out.details.items()
            if torch.is_tensor(v) and v.shape == (batch,)
        }
        return out.scores.detach().float().to(self.device), details, per_sample


@dataclass
class RolloutBatch:
    """This process's share of one step's samples.

    Attributes:
        trajectory: the local trajectories (B_local): a :class:`~genalign.policies.Trajectory`,
            or a language policy's :class:`~genalign.policies.TokenTrajectory`.
        rewards: ``[B_local]`` fp32.
        advantages: ``[B_local]`` fp32.
        global_index: ``[B_local]`` position of each local sample in the global batch.
        global_batch_size: samples in the step across all processes.
        global_rewards: ``[B_global]`` for logging.
        details: the reward's numeric details and the strategy's counts, logged as ``reward_<key>``.
        metrics: the strategy's own report (Sol-RL's preview fidelity, timings), logged as is.
        skipped: the step must not be applied (e.g. a NaN reward); ``reason`` says why.
        train_steps: the step indices the update may train on (default: every stochastic step
            of the trajectory); a strategy that trains a window of the chain sets it.
        global_group_ids: ``[B_global]`` the comparison group of each global sample (a prompt's
            group, a source's branches), for the within-group reward diagnostics; None: unknown.
        global_prompts: the ``B_global`` prompts, for per-prompt advantages; None: unknown.
        sample_details: the reward's per-sample details ``[B_local]`` (an ensemble's member scores)
            where the strategy keeps them (``astrolabe``: for the selective KL's ranks).
    """

    trajectory: Trajectory | TokenTrajectory
    rewards: torch.Tensor
    advantages: torch.Tensor
    global_index: torch.Tensor
    global_batch_size: int
    global_rewards: torch.Tensor
    details: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    skipped: bool = False
    reason: str = ""
    train_steps: torch.Tensor | None = None
    global_group_ids: torch.Tensor | None = None
    global_prompts: list[str] | None = None
    sample_details: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def of_groups(
        cls,
        context: RolloutContext,
        trajectory: Trajectory | TokenTrajectory,
        rewards: torch.Tensor,
        details: dict[str, Any],
        rows: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **fields: Any,
    ) -> RolloutBatch:
        """The batch of a strategy that draws groups of one prompt: this process's ``rows`` of the
        global ``prompts`` and ``group_ids``, the rewards gathered over processes, advantages still
        to be assigned; ``fields`` sets the rest (``metrics``, a subclass's own)."""
        return cls(
            trajectory=trajectory,
            rewards=rewards,
            advantages=torch.zeros_like(rewards),
            global_index=rows,
            global_batch_size=len(prompts),
            global_rewards=context.gather(rewards).cpu(),
            details=details,
            global_group_ids=group_ids,
            global_prompts=prompts,
            **fields,
        )


def draw_pool_rows(
    pool_size: int, prompts_per_step: int, group_size: int, generator: torch.Generator
) -> torch.Tensor:
    """``[prompts_per_step]`` pool rows of a step's prompts.

    Groups (``group_size > 1``) are distinct prompts when the pool has enough, as flow_grpo's and
    DiffusionNFT's ``DistributedKRepeatSampler`` (``randperm(len(dataset))[:m]``), trl's
    ``RepeatSampler`` (Q-Hawkeye) and verl's shuffled loader (RLRF) draw them, so one prompt is
    never two groups normalised apart. Single samples (DDPO, RLCM, B2-DiffuRL, ``group_size`` 1)
    and pools smaller than the step are drawn with replacement, as their ``random.choice``.
    """
    if group_size > 1 and prompts_per_step <= pool_size:
        return torch.randperm(pool_size, generator=generator)[:prompts_per_step]
    return torch.randint(0, pool_size, (prompts_per_step,), generator=generator)


def draw_prompt_groups(
    pool: list[str], prompts_per_step: int, group_size: int, generator: torch.Generator
) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """``prompts_per_step`` prompts drawn from ``pool`` (:func:`draw_pool_rows`), each repeated
    ``group_size`` times, their group ids ``[B]`` and one seed per sample ``[B]`` (all global):
    :func:`draw_indexed_groups`' draw, its rows read from ``pool``."""
    rows, group_ids, seeds = draw_indexed_groups(len(pool), prompts_per_step, group_size, generator)
    return [pool[int(i)] for i in rows], group_ids, seeds


def draw_step_groups(
    pool: list[str], config: Any, step: int
) -> tuple[list[str], torch.Tensor, torch.Tensor, torch.Generator]:
    """Step ``step``'s prompt groups as :func:`draw_prompt_groups` draws them (``config``: a
    ``TrainConfig``: its seed, ``prompts_per_step`` and ``group_size``), plus the step's
    generator, left where the draw ended, for a strategy's further draws (B2-DiffuRL's branch seeds)."""
    generator = step_generator(config.seed, step)
    prompts, group_ids, seeds = draw_prompt_groups(
        pool, config.prompts_per_step, config.group_size, generator
    )
    return prompts, group_ids, seeds, generator


def draw_indexed_groups(
    pool_size: int, prompts_per_step: int, group_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step's draw as pool rows (:func:`draw_pool_rows`): ``[B]`` row of each sample, ``[B]``
    group ids and ``[B]`` seeds."""
    choice = draw_pool_rows(pool_size, prompts_per_step, group_size, generator)
    indices = choice.repeat_interleave(group_size)
    group_ids = torch.arange(prompts_per_step).repeat_interleave(group_size)
    seeds = torch.randint(0, 2**31 - 1, (len(indices),), generator=generator)
    return indices, group_ids, seeds


class IndexedRollout(NamedTuple):
    """What :func:`rollout_indexed_groups` returns: this process's trajectory (group ids set),
    the metadata of its pool rows, and the step's global ``prompts`` ``[B]``, ``group_ids`` ``[B]``
    and this process's ``rows`` of them (as :meth:`RolloutBatch.of_groups` takes them)."""

    trajectory: Any
    metadata: dict[str, Any]
    prompts: list[str]
    group_ids: torch.Tensor
    rows: torch.Tensor


def rollout_indexed_groups(
    context: RolloutContext,
    config: Any,
    step: int,
    row_metadata: Callable[[Any, torch.Tensor], dict[str, Any]],
    images: Callable[[dict[str, Any], torch.Tensor], Any],
    draw: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = draw_indexed_groups,
    rollout: Callable[..., Any] | None = None,
) -> IndexedRollout:
    """Roll out step ``step``'s prompt groups drawn as pool rows (:func:`draw_indexed_groups`;
    the same prompts, seeds and group ids as ``groups`` draws), for strategies whose pool rows
    carry metadata (an image to condition on, a target to score against).

    ``row_metadata(pool, pool_rows)`` reads this process's rows of ``context.prompts``;
    ``images(metadata, rows)`` is what the policy is shown with each prompt (None for none),
    ``rows`` this process's positions in the step's global batch.
    ``config``: a ``TrainConfig`` (its seed, ``prompts_per_step`` and ``group_size``). ``draw``
    replaces :func:`draw_indexed_groups` (same arguments and returns; the ``q_hawkeye`` strategy
    appends a second view of every group). ``rollout(prompts, seeds, images, group_ids)`` replaces
    ``context.policy.rollout`` under ``context.precision()`` (the ``svg`` strategy's branches).
    """
    pool = context.prompts
    generator = step_generator(config.seed, step)
    indices, group_ids, seeds = draw(len(pool), config.prompts_per_step, config.group_size, generator)
    prompts = [pool[i] for i in indices.tolist()]
    rows = context.local_rows(len(prompts))
    metadata = row_metadata(pool, indices[rows])
    local_prompts, shown = [prompts[i] for i in rows.tolist()], images(metadata, rows)
    with context.precision():
        if rollout is None:
            trajectory = context.policy.rollout(
                local_prompts, seeds=seeds[rows], images=shown, **context.rollout_kwargs()
            )
        else:
            trajectory = rollout(local_prompts, seeds[rows], shown, group_ids[rows])
    trajectory.group_ids = group_ids[rows]
    return IndexedRollout(trajectory, metadata, prompts, group_ids, rows)


class RolloutStrategy(abc.ABC):
    """Base class: ``collect(context, step) -> RolloutBatch``; ``state_dict`` for checkpoints.

    :meth:`collect` is the lifecycle every strategy shares: :meth:`sample` rolls out and scores
    this process's share; a step whose global rewards hold a NaN or an infinity is skipped before
    any history (a stat tracker, B2-DiffuRL's reward history) sees them
    (:func:`~genalign.trainers.guards.skip_nonfinite_rewards`); then :meth:`assign_advantages`.

    Rollouts that are trained on run inside ``context.precision()``, the context in which the
    update recomputes their log-probs, so the first inner step is exactly on-policy; rewards are
    scored outside it, as in ddpo-pytorch and flow_grpo.
    """

    rewards_name = "rewards"  # how a skip reason names the rewards it checked

    def collect(self, context: RolloutContext, step: int) -> RolloutBatch:
        """This process's share of step ``step``, with advantages (or marked skipped)."""
        batch = self.sample(context, step)
        if batch.skipped or skip_nonfinite_rewards(batch, self.rewards_name):
            return batch
        self.assign_advantages(batch, context)
        return batch

    @abc.abstractmethod
    def sample(self, context: RolloutContext, step: int) -> RolloutBatch:
        """Roll out and score this process's share of step ``step`` (advantages left at 0)."""

    @abc.abstractmethod
    def assign_advantages(self, batch: RolloutBatch, context: RolloutContext) -> None:
        """Set ``batch.advantages`` from its finite global rewards (may select rows or skip)."""

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint with the run (a stat tracker, a reward history; none by default)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore what :meth:`state_dict` returned (nothing by default)."""
