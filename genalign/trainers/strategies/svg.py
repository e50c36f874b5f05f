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
"Rewards"). Advantages are those of ``groups`` (``train.advantage``).
"""

from __future__ import annotations

from typing import Any

import torch

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

__all__ = ["SVGTaskStrategy", "draw_indexed_groups"]


@STRATEGIES.register("svg")
class SVGTaskStrategy(GroupRolloutStrategy):
    """Prompt groups of an SVG task with per-sample metadata for the reward (module docstring).

    Options: ``train.svg`` (:class:`~genalign.trainers.method_config.SVGTaskConfig`: ``task``,
    ``repair``) and the advantages of ``groups``.
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
        trajectory, metadata, prompts, group_ids, rows = rollout_indexed_groups(
            context,
            config,
            step,
            self._metadata,
            lambda metadata: metadata.get("images") if config.svg.task == "image_to_svg" else None,
        )
        found = [extract_svg_details(text, repair=config.svg.repair) for text in trajectory.completions]
        svgs = [f.svg if f.svg is not None else "" for f in found]
        trajectory.extras["svgs"] = svgs
        reward_metadata: dict[str, Any] = {}
        if "images" in metadata:
            reward_metadata["targets"] = metadata["images"].to(context.device)
        for name in ("reference_svgs", "specs"):  # specs: the toy oracle's (genalign.toy.svg_oracle)
            if name in metadata:
                reward_metadata[name] = metadata[name]
        rewards, details = context.score(trajectory, outputs=svgs, **reward_metadata)
        details.update(self._counts(context, found, details, len(prompts)))
        return RolloutBatch.of_groups(context, trajectory, rewards, details, rows, prompts, group_ids)

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
