"""Rollout strategies, one per file: which trajectories exist in a step and their advantages.

``STRATEGIES`` maps the recipe's ``train.strategy`` names to the classes: ``groups``
(:mod:`.groups`), ``b2diffurl`` (:mod:`.b2diffurl`), ``sol_rl`` (:mod:`.sol_rl`), ``svg`` (:mod:`.svg`, RLRF's SVG tasks for the ``language``
family), ``sft`` (:mod:`.sft`, its supervised fine-tuning), ``prompt_rewrite``
(:mod:`.prompt_rewrite`, PromptRL's rewriter -> generator chain), ``q_hawkeye`` (:mod:`.q_hawkeye`,
IQA judges with degraded copies), ``astrolabe`` (:mod:`.astrolabe`, the ``ar_video`` family's
video groups); a strategy
outside genalign is named ``"package.module:Class"``.
"""

from __future__ import annotations

from genalign.trainers.strategies.astrolabe import AstrolabeStrategy
from genalign.trainers.strategies.b2diffurl import B2DiffuRLStrategy
from genalign.trainers.strategies.base import (
    STRATEGIES,
    RolloutBatch,
    RolloutContext,
    RolloutStrategy,
    draw_prompt_groups,
    draw_step_groups,
    step_generator,
)
from genalign.trainers.strategies.groups import GroupRolloutStrategy
from genalign.trainers.strategies.prompt_rewrite import PromptRewriteStrategy
from genalign.trainers.strategies.q_hawkeye import QHawkeyeStrategy
from genalign.trainers.strategies.sft import SFTStrategy
from genalign.trainers.strategies.sol_rl import SolRLStrategy
from genalign.trainers.strategies.svg import SVGTaskStrategy

__all__ = [
    "STRATEGIES",
    "AstrolabeStrategy",
    "B2DiffuRLStrategy",
    "GroupRolloutStrategy",
    "PromptRewriteStrategy",
    "QHawkeyeStrategy",
    "RolloutBatch",
    "RolloutContext",
    "RolloutStrategy",
    "SFTStrategy",
    "SVGTaskStrategy",
    "SolRLStrategy",
    "draw_prompt_groups",
    "draw_step_groups",
    "step_generator",
]
