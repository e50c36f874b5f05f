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
5. with ``train.q_hawkeye.copy_weight`` w > 0 (our variant, not Q-Hawkeye's), also rolls out every
   drawn image's degraded copy as a group of its own (group id ``P + g``, the same seeds; the copy
   is its own "degraded" input, so its perception term is 0), scores it without a MOS (no
   accuracy term: format and repetition only) and adds ``w`` to each copy completion whose score is
   below the mean of its original's group (:func:`genalign.algorithms.copy_below_original_rewards`);
6. assigns uncertainty-aware advantages: ``A = (R - mean_g) / (unbiased std_g + 1e-4)`` times
   ``exp(-alpha clip(Var_pop(parsed scores of g) / 4, 0, 1))``
   (:func:`genalign.algorithms.q_hawkeye.uncertainty_aware_advantages`; without the weight when
   ``train.q_hawkeye.uncertainty`` is false), clipped to ``train.advantage_clip``.

Metrics: ``reward_rank_fidelity_mean`` (the ranking term's mean, when on),
``reward_copy_below_original`` (the fraction of copy completions scored below their original's
group, when copies are on),
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
    copy_below_original_rewards,
    group_reward_statistics,
    parse_answer_score,
    perception_row_scale,
    score_uncertainty_weights,
    thurstone_fidelity_rewards,
    uncertainty_aware_advantages,
)
from genalign.trainers.losses.q_hawkeye import COPY_ROWS_KEY, DEGRADED_PREFIX, ROW_SCALE_KEY
from genalign.trainers.prompt_pool import PromptPool
from genalign.trainers.strategies.base import (
    STRATEGIES,
    RolloutBatch,
    RolloutContext,
    draw_indexed_groups,
    rollout_indexed_groups,
)
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

    def _with_copies(
        self, pool_size: int, prompts_per_step: int, group_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step's draw, then the same rows again as the copies' groups (ids ``P + g``)."""
        indices, group_ids, seeds = draw_indexed_groups(pool_size, prompts_per_step, group_size, generator)
        return (
            torch.cat([indices, indices]),
            torch.cat([group_ids, group_ids + prompts_per_step]),
            torch.cat([seeds, seeds]),
        )

    def sample(self, context: RolloutContext, step: int) -> QualityRolloutBatch:
        options = self.config.q_hawkeye
        copies = options.copy_weight > 0
        originals = self.config.prompts_per_step * self.config.group_size  # the first rows; copies after

        def shown(metadata: dict[str, Any], rows: torch.Tensor) -> torch.Tensor:
            if not copies:
                return metadata["images"]
            is_copy = (rows >= originals).view(-1, *[1] * (metadata["images"].dim() - 1))
            return torch.where(is_copy, metadata["degraded_images"], metadata["images"])

        trajectory, metadata, prompts, group_ids, rows = rollout_indexed_groups(
            context,
            self.config,
            step,
            self._rows,
            shown,
            draw=self._with_copies if copies else draw_indexed_groups,
        )
        # a copy row is shown the degraded image, which is also its degraded input (perception
        # term 0), and has no MOS (accuracy term 0)
        trajectory.extras.update(self.degraded_inputs(context, trajectory, metadata["degraded_images"]))
        if copies:  # the loss skips their re-scoring
            trajectory.extras[COPY_ROWS_KEY] = rows >= originals
        # the perception term's per-image token mean, whatever rows a minibatch holds
        lengths = context.gather(trajectory.completion_mask.sum(dim=1).float().to(context.device)).cpu()
        scale = perception_row_scale(lengths, group_ids)
        trajectory.extras[ROW_SCALE_KEY] = scale[rows].to(trajectory.completion_mask.device)
        mos = torch.as_tensor(metadata["mos"], dtype=torch.float32)
        if copies:
            mos = torch.where(rows >= originals, torch.full_like(mos, float("nan")), mos)
        rewards, details, per_sample = context.score_per_sample(trajectory, mos=mos.to(context.device))
        parsed = [parse_answer_score(text, signed=True) for text in trajectory.completions]
        scores = torch.tensor([float("nan") if p is None else p for p in parsed], dtype=torch.float32)
        global_scores = context.gather(scores.to(context.device)).cpu()
        global_copy = torch.arange(len(prompts)) >= originals
        details["answer_unparsed"] = float(torch.isnan(global_scores).sum())
        if options.rank_weight > 0:  # VisualQuality-R1's: each image's scores against the others'
            global_mos = context.gather(mos.to(context.device)).cpu()
            keep = ~global_copy
            ranking = torch.zeros_like(global_scores)
            ranking[keep] = thurstone_fidelity_rewards(global_scores[keep], group_ids[keep], global_mos[keep])
            rewards = rewards + options.rank_weight * ranking[rows].to(rewards)
            details["rank_fidelity_mean"] = float(ranking[keep].mean())
        if copies:  # our pair-order term: each copy answer against its original's group
            partner = torch.where(
                global_copy, group_ids - self.config.prompts_per_step, torch.full_like(group_ids, -1)
            )
            below = copy_below_original_rewards(
                global_scores, group_ids, partner, options.score_min, options.score_max
            )
            rewards = rewards + options.copy_weight * below[rows].to(rewards)
            details["copy_below_original"] = float(below[global_copy].mean())
        metrics = {}
        if "accuracy" in per_sample:  # the iqa_answer reward: is there a signal beyond the format?
            accuracy = context.gather(per_sample["accuracy"]).cpu()
            keep = ~global_copy
            metrics = accuracy_signal(accuracy[keep], global_scores[keep], group_ids[keep])
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
