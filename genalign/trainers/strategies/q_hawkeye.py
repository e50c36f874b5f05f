"""Q-Hawkeye's rollouts: G judgements per image, the degraded copy kept for the perception loss.

Xie et al. 2026, "Q-Hawkeye" (arXiv 2601.22920; official ``grpo_trainer.py`` @ 905262f). A VLM
judge is shown an image with the IQA question and samples G completions
``<think>...</think><answer>x.xx</answer>``; this strategy

1. draws the step's images exactly as ``svg`` draws its inputs (same rows, seeds and group ids for
   a given ``(seed, step)``) from a pool with columns ``images``, ``degraded_images`` and ``mos``
   (:func:`genalign.trainers.quality_pool.quality_pool`);
2. rolls out with each row's image and encodes the same prompts with its degraded image, keeping
   the processor's image inputs in ``trajectory.extras["degraded:<input>"]`` (the ``q_hawkeye``
   loss re-scores the completion with them; the prompt tokens must be the same);
3. scores the completions with the row's ``mos`` as metadata (the ``iqa_answer`` reward) and parses
   each answer's score (UA-GRPO's parser; NaN when none);
4. with ``train.q_hawkeye.rank_weight`` w > 0, adds ``w`` times VisualQuality-R1's ranking term to
   each reward: the Thurstone fidelity of its parsed score against every other image of the step
   (:func:`genalign.algorithms.thurstone_fidelity_rewards`, over all processes' images; not part
   of Q-Hawkeye, whose accuracy term compares an answer with its own image's MOS only);
5. assigns uncertainty-aware advantages: ``A = (R - mean_g) / (unbiased std_g + 1e-4)`` times
   ``exp(-alpha clip(Var_pop(parsed scores of g) / 4, 0, 1))``
   (:func:`genalign.algorithms.q_hawkeye.uncertainty_aware_advantages`; without the weight when
   ``train.q_hawkeye.uncertainty`` is false), clipped to ``train.advantage_clip``.

Metrics: ``reward_rank_fidelity_mean`` (the ranking term's mean, when on),
``reward_answer_unparsed`` (completions without a parsable score over all processes),
``ua_weight_mean`` (the mean uncertainty weight, logged also when the weight is off), and the
learning signal the MOS carries apart from the format (:func:`accuracy_signal`):
``accuracy_group_std``, ``accuracy_zero_variance_groups``, ``accuracy_parsed_group_std`` and
``answer_identical_groups``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from genalign.algorithms import (
    clip_advantages,
    group_reward_statistics,
    parse_answer_score,
    score_uncertainty_weights,
    thurstone_fidelity_rewards,
    uncertainty_aware_advantages,
)
from genalign.trainers.losses.q_hawkeye import DEGRADED_PREFIX
from genalign.trainers.prompt_pool import PromptPool
from genalign.trainers.strategies.base import STRATEGIES, RolloutBatch, RolloutContext, rollout_indexed_groups
from genalign.trainers.strategies.groups import GroupRolloutStrategy

__all__ = ["QHawkeyeStrategy", "QualityRolloutBatch", "accuracy_signal"]

POOL_COLUMNS = ("images", "degraded_images", "mos")


@dataclass
class QualityRolloutBatch(RolloutBatch):
    """A :class:`RolloutBatch` with ``global_scores`` ``[B_global]``: each completion's parsed
    score (NaN: none), for the uncertainty weight."""

    global_scores: torch.Tensor | None = None


def accuracy_signal(
    accuracy: torch.Tensor, scores: torch.Tensor, group_ids: torch.Tensor
) -> dict[str, float]:
    """How much of a step's group-relative signal is about the MOS, not the format.

    Args:
        accuracy: ``[B]`` the ``iqa_answer`` reward's accuracy term (0 where no score parses).
        scores: ``[B]`` each completion's parsed score (NaN: none).
        group_ids: ``[B]`` each completion's group (one image).

    Returns:
        ``accuracy_group_std`` and ``accuracy_zero_variance_groups`` over all completions (a parse
        failure's 0 counts, so a group with one failure has variance); ``accuracy_parsed_group_std``
        over parsed completions only, and ``answer_identical_groups``: the fraction of groups with a
        parsed answer whose parsed scores are all equal (no accuracy signal left once the format
        is right). NaN for the parsed ones when nothing parses.
    """
    every = group_reward_statistics(accuracy, group_ids)
    out = {
        "accuracy_group_std": every["group_reward_std"],
        "accuracy_zero_variance_groups": every["zero_variance_groups"],
    }
    parsed = torch.isfinite(scores)
    if parsed.any():
        out["accuracy_parsed_group_std"] = group_reward_statistics(accuracy[parsed], group_ids[parsed])[
            "group_reward_std"
        ]
        out["answer_identical_groups"] = group_reward_statistics(scores[parsed], group_ids[parsed])[
            "zero_variance_groups"
        ]
    else:
        out["accuracy_parsed_group_std"] = out["answer_identical_groups"] = float("nan")
    return out


@STRATEGIES.register("q_hawkeye")
class QHawkeyeStrategy(GroupRolloutStrategy):
    """G judgements of each drawn image with its degraded copy kept (module docstring).

    Options: ``train.q_hawkeye`` (:class:`~genalign.trainers.method_config.QHawkeyeConfig`:
    ``uncertainty``, ``alpha``, ``score_min``, ``score_max``), ``train.advantage_clip``.
    """

    def _rows(self, pool: Any, indices: torch.Tensor) -> dict[str, Any]:
        if not isinstance(pool, PromptPool):
            raise ValueError(
                "train.strategy 'q_hawkeye' needs prompts with images, degraded copies and MOS: give "
                "prompts.source genalign.trainers.quality_pool:quality_pool (a PromptPool), not a plain prompt list"
            )
        for column in POOL_COLUMNS:
            pool.require(column, "train.strategy 'q_hawkeye'")
        return pool.rows(indices)

    @staticmethod
    def degraded_inputs(
        context: RolloutContext, trajectory: Any, degraded_images: torch.Tensor
    ) -> dict[str, Any]:
        """The processor's image inputs for the degraded images, keyed ``degraded:<name>``; the
        prompt tokens must equal the rollout's (same image size, same template)."""
        encoded = context.policy.encode_prompts(trajectory.prompts, trajectory.settings, degraded_images)
        prompt_ids = encoded.pop("input_ids").to(trajectory.input_ids.device)
        encoded.pop("attention_mask")
        if not torch.equal(prompt_ids, trajectory.input_ids[:, : trajectory.prompt_length]):
            raise ValueError(
                "the degraded images' prompt tokens differ from the originals' (resize both to one size)"
            )
        return {f"{DEGRADED_PREFIX}{name}": value for name, value in encoded.items()}

    def sample(self, context: RolloutContext, step: int) -> QualityRolloutBatch:
        trajectory, metadata, prompts, group_ids, rows = rollout_indexed_groups(
            context, self.config, step, self._rows, lambda metadata: metadata["images"]
        )
        trajectory.extras.update(self.degraded_inputs(context, trajectory, metadata["degraded_images"]))
        mos = torch.as_tensor(metadata["mos"], dtype=torch.float32)
        rewards, details, per_sample = context.score_per_sample(trajectory, mos=mos.to(context.device))
        parsed = [parse_answer_score(text, signed=True) for text in trajectory.completions]
        scores = torch.tensor([float("nan") if p is None else p for p in parsed], dtype=torch.float32)
        global_scores = context.gather(scores.to(context.device)).cpu()
        details["answer_unparsed"] = float(torch.isnan(global_scores).sum())
        rank_weight = self.config.q_hawkeye.rank_weight
        if rank_weight > 0:  # VisualQuality-R1's ranking term: each score against the step's other images
            global_mos = context.gather(mos.to(context.device)).cpu()
            ranking = thurstone_fidelity_rewards(global_scores, group_ids, global_mos)
            rewards = rewards + rank_weight * ranking[rows].to(rewards)
            details["rank_fidelity_mean"] = float(ranking.mean())
        metrics = {}
        if "accuracy" in per_sample:  # the iqa_answer reward: is there a signal beyond the format?
            accuracy = context.gather(per_sample["accuracy"]).cpu()
            metrics = accuracy_signal(accuracy, global_scores, group_ids)
        return QualityRolloutBatch.of_groups(
            context,
            trajectory,
            rewards,
            details,
            rows,
            prompts,
            group_ids,
            metrics=metrics,
            global_scores=global_scores,
        )

    def assign_advantages(self, batch: RolloutBatch, context: RolloutContext) -> None:
        options = self.config.q_hawkeye
        scores = getattr(batch, "global_scores", None)
        if scores is None:
            raise ValueError("the q_hawkeye strategy's advantages need the batch's parsed scores")
        range_ = (options.score_min, options.score_max)
        advantages = uncertainty_aware_advantages(
            batch.global_rewards,
            batch.global_group_ids,
            scores if options.uncertainty else None,
            options.alpha,
            *range_,
        )
        advantages = clip_advantages(advantages, self.config.advantage_clip)
        batch.advantages = advantages[batch.global_index].to(context.device)
        weights = score_uncertainty_weights(scores, batch.global_group_ids, options.alpha, *range_)
        batch.metrics["ua_weight_mean"] = float(weights.mean())
