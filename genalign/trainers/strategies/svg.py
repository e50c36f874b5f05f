"""RLRF's SVG-writing tasks on the ``language`` family: image-to-SVG and text-to-SVG.

Rodriguez et al., "Rendering-Aware Reinforcement Learning for Vector Graphics Generation"
(RLRF, arXiv 2505.20793), Sec. 3.2: for each input the policy samples G SVG programs; each is
rendered and compared with the target (the ``svg_fidelity`` reward); advantages are
group-normalised, ``A_i = (R_i - mean(R)) / std(R)`` over the G rollouts of one input (GRPO,
Shao et al. 2024, eq. 3). The prompt pool is a :class:`~genalign.trainers.prompt_pool.PromptPool`
whose rows carry each input's metadata; this strategy

1. draws the step's prompt groups exactly as ``groups`` does (same prompts, seeds and group ids
   for a given ``(seed, step)``), keeping each sample's row of the pool;
2. rolls out: ``image_to_svg`` shows a VLM the row's image (``images``) with the prompt as the
   instruction; ``text_to_svg`` gives the prompt (a caption) alone;
3. extracts the SVG from every completion (:func:`genalign.rewards.svg.extract_svg`: fences,
   trailing prose, a root cut off by ``max_new_tokens``); a completion without one is scored as
   the empty document, which the reward's sanitiser rejects, so it gets the floor;
4. scores the SVGs with the row's ``targets`` (its image), ``reference_svgs`` and, where the pool
   has them, ``specs`` (the toy oracle ``toy_svg_verifier``'s) as metadata, and
   counts missing, repaired and invalid SVGs in the step's metrics (``reward_svg_*``).

Invalid, hostile or timed-out SVGs never raise: the reward floors and counts them (DESIGN.md,
"Rewards"). Advantages are those of ``groups`` (``train.advantage``), or with ``train.svg.baseline:
greedy`` ReMax's (Li et al. 2023, arXiv 2310.10505, Alg. 1): each group's input is also answered
at ``greedy_temperature`` (~greedy, without gradient), that answer is scored as the samples are, and
its reward replaces the group mean, ``A_i = (R_i - R_greedy) / (group std + eps)``. GRPO's group
mean at temperature 1.1 can lie far below the greedy answer's reward, so samples that beat their
group but not the mode are reinforced and the mode drifts towards them (docs/language.md 5.2);
against the greedy answer, only samples better than the mode are. With ``train.svg.credit:
divergence`` a sample's advantage is carried only by its tokens from the first one where it leaves
its group's greedy answer (:func:`divergence_mask`); the prefix it shares with the mode is not its
own choice, and a sequence-level advantage would push the mode's prefix with it. Measured on the
toy writer, neither option lifted its greedy answer (docs/language.md section 5.2). With
``train.svg.rollout: branch`` the G samples are one-token branches off the greedy answer, each
trained on its branch token alone against the greedy answer's reward
(:mod:`genalign.trainers.strategies.svg_branch`, docs/language.md section 5.4).
"""

from __future__ import annotations

from typing import Any

import torch

from genalign.algorithms import clip_advantages, group_advantages
from genalign.rewards.svg.extract import extract_svg_details
from genalign.trainers.prompt_pool import PromptPool
from genalign.trainers.strategies.base import (
    STRATEGIES,
    RolloutBatch,
    RolloutContext,
    draw_indexed_groups,
    rollout_indexed_groups,
)
from genalign.trainers.strategies.groups import GroupRolloutStrategy
from genalign.trainers.strategies.svg_branch import BranchRollout, group_representatives

__all__ = ["SVGTaskStrategy", "divergence_mask", "draw_indexed_groups"]


def divergence_mask(samples: torch.Tensor, mask: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``mask`` ``[B, L]`` with each row's tokens before its first difference from ``reference``
    ``[B, L']`` (the row's greedy answer, right-padded) set to 0: a row equal to its reference over
    its whole completion keeps no token. Positions past ``L'`` count as different."""
    length = samples.shape[1]
    shared = torch.zeros_like(mask, dtype=torch.bool)
    width = min(length, reference.shape[1])
    shared[:, :width] = samples[:, :width] == reference[:, :width].to(samples.device)
    prefix = torch.cumprod(shared.long(), dim=1).bool()  # [B, L]: True while every token so far matched
    return mask * (~prefix).to(mask.dtype)


@STRATEGIES.register("svg")
class SVGTaskStrategy(GroupRolloutStrategy):
    """Prompt groups of an SVG task with per-sample metadata for the reward (module docstring).

    Options: ``train.svg`` (:class:`~genalign.trainers.method_config.SVGTaskConfig`: ``task``,
    ``repair``, ``baseline``, ``greedy_temperature``, ``credit``, ``rollout``) and the advantages of
    ``groups``.
    """

    def _metadata(self, pool: Any, rows: torch.Tensor) -> dict[str, Any]:
        if not isinstance(pool, PromptPool):
            if self.config.svg.task == "image_to_svg":
                raise ValueError(
                    "train.svg.task 'image_to_svg' needs prompts with images: give prompts.records "
                    "or prompts.source (a PromptPool), not a plain prompt list"
                )
            return {}
        if self.config.svg.task == "image_to_svg":
            pool.require("images", "train.svg.task 'image_to_svg'")
        return pool.rows(rows)

    def sample(self, context: RolloutContext, step: int) -> RolloutBatch:
        config = self.config
        branch = BranchRollout(context) if config.svg.rollout == "branch" else None
        trajectory, metadata, prompts, group_ids, rows = rollout_indexed_groups(
            context,
            config,
            step,
            self._metadata,
            lambda metadata, rows: metadata.get("images") if config.svg.task == "image_to_svg" else None,
            rollout=branch,
        )
        found = self._extract(trajectory.completions)
        svgs = [f.svg if f.svg is not None else "" for f in found]
        trajectory.extras["svgs"] = svgs
        reward_metadata = self._reward_metadata(context, metadata)
        rewards, details = context.score(trajectory, outputs=svgs, **reward_metadata)
        details.update(self._counts(context, found, details, len(prompts)))
        fields: dict[str, Any] = {}
        if branch is not None:
            greedy = self._score_answers(context, branch.answers, branch.first, reward_metadata)
            greedy = greedy[branch.answer_of.to(greedy.device)]
            fields["sample_details"] = {"greedy_reward": greedy}
            fields["metrics"] = {"greedy_reward_mean": float(context.gather(greedy).mean())}
            fields["metrics"].update(branch.metrics(rewards.to(greedy.device), greedy))
        elif config.svg.baseline == "greedy":
            greedy, answers = self._greedy_rewards(context, trajectory, metadata, reward_metadata)
            fields["sample_details"] = {"greedy_reward": greedy}
            fields["metrics"] = {"greedy_reward_mean": float(context.gather(greedy).mean())}
            if config.svg.credit == "divergence":
                before = trajectory.completion_mask.sum()
                trajectory.completion_mask = divergence_mask(
                    trajectory.completion_ids, trajectory.completion_mask, answers
                )
                fields["metrics"]["divergence_token_fraction"] = float(
                    trajectory.completion_mask.sum() / before.clamp(min=1)
                )
        return RolloutBatch.of_groups(
            context, trajectory, rewards, details, rows, prompts, group_ids, **fields
        )

    def _extract(self, completions: list[str]) -> list:
        return [extract_svg_details(text, repair=self.config.svg.repair) for text in completions]

    @staticmethod
    def _reward_metadata(context: RolloutContext, metadata: dict[str, Any]) -> dict[str, Any]:
        """The reward's per-sample metadata: the row's image as ``targets``, its ``reference_svgs``
        and, where the pool has them, ``specs`` (the toy oracle's, genalign.toy.svg_oracle)."""
        out: dict[str, Any] = {}
        if "images" in metadata:
            out["targets"] = metadata["images"].to(context.device)
        for name in ("reference_svgs", "specs"):
            if name in metadata:
                out[name] = metadata[name]
        return out

    @torch.no_grad()
    def _greedy_rewards(
        self,
        context: RolloutContext,
        trajectory: Any,
        metadata: dict[str, Any],
        reward_metadata: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ReMax's baseline ``[B_local]``: the reward of a ~greedy answer to each local group's
        input (one rollout per group, at ``train.svg.greedy_temperature``), per sample; and that
        answer's completion tokens per sample ``[B_local, L']``."""
        index, position = group_representatives(trajectory.group_ids)
        images = metadata["images"][index] if self.config.svg.task == "image_to_svg" else None
        kwargs = context.rollout_kwargs() | {"temperature": self.config.svg.greedy_temperature}
        with context.precision():
            answers = context.policy.rollout(
                [trajectory.prompts[i] for i in index.tolist()],
                seeds=torch.zeros(len(index), dtype=torch.long),
                images=images,
                **kwargs,
            )
        scores = self._score_answers(context, answers, index, reward_metadata)
        return scores[position.to(scores.device)], answers.completion_ids[position]

    def _score_answers(
        self, context: RolloutContext, answers: Any, index: torch.Tensor, reward_metadata: dict[str, Any]
    ) -> torch.Tensor:
        """The rewards ``[len(index)]`` of ``answers``, row k answering local sample ``index[k]``
        (whose metadata it is scored against)."""
        svgs = [f.svg if f.svg is not None else "" for f in self._extract(answers.completions)]
        picked = {
            name: value[index.to(value.device)]
            if torch.is_tensor(value)
            else [value[i] for i in index.tolist()]
            for name, value in reward_metadata.items()
        }
        scores, _ = context.score(answers, outputs=svgs, **picked)
        return scores

    def assign_advantages(self, batch: RolloutBatch, context: RolloutContext) -> None:
        if self.config.svg.baseline != "greedy" and self.config.svg.rollout != "branch":
            super().assign_advantages(batch, context)
            return
        config = self.config
        baseline = context.gather(batch.sample_details["greedy_reward"]).cpu().float()
        rewards = batch.global_rewards.float()
        group_mean = rewards - group_advantages(rewards, batch.global_group_ids, std="none")
        baseline = torch.where(torch.isfinite(baseline), baseline, group_mean)  # a failed score: the mean
        advantages = group_advantages(
            rewards, batch.global_group_ids, std=config.advantage_std, baseline=baseline
        )
        advantages = clip_advantages(advantages.float(), config.advantage_clip)
        batch.advantages = advantages[batch.global_index].to(context.device)

    @staticmethod
    def _counts(
        context: RolloutContext, found: list, details: dict[str, Any], total: int
    ) -> dict[str, float]:
        """Missing, repaired and invalid SVGs summed over processes (``invalid``: the reward's
        ``failure_count``, which includes the missing ones), and the valid fraction."""
        local = torch.tensor(
            [
                sum(f.svg is None for f in found),
                sum(f.repaired for f in found),
                float(details.get("failure_count", 0)),
            ],
            dtype=torch.float32,
            device=context.device,
        )
        missing, repaired, invalid = context.gather(local.view(1, 3)).sum(dim=0).tolist()
        return {
            "svg_missing": missing,
            "svg_repaired": repaired,
            "svg_invalid": invalid,
            "svg_valid_fraction": 1.0 - invalid / max(total, 1),
        }
