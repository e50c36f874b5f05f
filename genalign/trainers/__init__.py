"""Trainers: the RL loop (rollout -> score -> advantage -> update), strategies and losses.

``trainer`` is the loop, ``strategies/`` the rollout strategies (one per file), ``losses/`` the
losses (one per file, the hook contract in ``losses/base``); their pure math is in
:mod:`genalign.algorithms`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from genalign.utils.lazy import lazy_exports

# Exported lazily (as genalign.pipelines): ``genalign.trainers.config`` alone loads no diffusers or
# transformers, so ``genalign train`` reports a mistyped recipe key in seconds, not after every model
# library has been imported.
_EXPORTS = {
    "Checkpoint": "checkpoint",
    "latest_checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
    "RecipeConfig": "config",
    "load_recipe": "config",
    "ParameterEMA": "ema",
    "LOSSES": "losses",
    "NFTLoss": "losses",
    "PolicyLoss": "losses",
    "PPOClipLoss": "losses",
    "ReFLLoss": "losses",
    "RWRLoss": "losses",
    "TokenPPOLoss": "losses",
    "STRATEGIES": "strategies",
    "B2DiffuRLStrategy": "strategies",
    "GroupRolloutStrategy": "strategies",
    "RolloutBatch": "strategies",
    "RolloutContext": "strategies",
    "RolloutStrategy": "strategies",
    "SolRLStrategy": "strategies",
    "Trainer": "trainer",
    "build_trainer": "trainer",
}

if TYPE_CHECKING:  # the same names, for type checkers
    from genalign.trainers.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, save_checkpoint
    from genalign.trainers.config import RecipeConfig, load_recipe
    from genalign.trainers.ema import ParameterEMA
    from genalign.trainers.losses import (
        LOSSES,
        NFTLoss,
        PolicyLoss,
        PPOClipLoss,
        ReFLLoss,
        RWRLoss,
        TokenPPOLoss,
    )
    from genalign.trainers.strategies import (
        STRATEGIES,
        B2DiffuRLStrategy,
        GroupRolloutStrategy,
        RolloutBatch,
        RolloutContext,
        RolloutStrategy,
        SolRLStrategy,
    )
    from genalign.trainers.trainer import Trainer, build_trainer


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


METHODS = {
    "ddpo": "sd family, DDIM eta=1, per-prompt stat tracker, PPO-clip (Black et al. 2023)",
    "grpo": "any family, group-relative advantages, PPO-clip; language family: token_ppo (Shao et al. 2024)",
    "flow_grpo": "flow family, SDE rollouts, group advantages, KL to reference (Liu et al. 2025)",
    "rlcm": "consistency family, RLCM step policy, PPO-clip (Oertell et al. 2024)",
    "diffusion_nft": "flow or sd family, forward-process NFT loss, EMA old policy (Zheng et al. 2025)",
    "sol_rl": "flow family, low-precision candidate pool + full-precision regeneration, NFT (Sol-RL 2025)",
    "b2diffurl": "sd/flow, backward progressive window + branch sampling, PPO-clip (Hu et al. 2025)",
    "rwr": "sd/flow/consistency, reward-weighted denoising loss on own samples (DDPO's RWR, Black et al. 2023)",
    "refl": "sd/flow/consistency, differentiable reward through a one-step x0 prediction (ReFL, Xu et al. 2023)",
    "promptrl": "sd/flow + a language rewriter trained jointly, prompt_rewrite strategy (PromptRL, arXiv 2602.01382)",
    "sft": "language family, next-token loss on (input, target) pairs; RLRF's stage 1 (Rodriguez et al. 2025)",
    "q_hawkeye": "language family, IQA judge: uncertainty-aware GRPO + perception term on degraded images (Xie et al. 2026)",
}


def list_trainers() -> dict[str, list[str]]:
    """Sections for ``genalign list``."""
    from genalign.trainers.losses import LOSSES
    from genalign.trainers.strategies import STRATEGIES

    return {
        "methods": [f"{name}: {text}" for name, text in METHODS.items()],
        "rollout strategies": STRATEGIES.names(),
        "losses": LOSSES.names(),
    }


__all__ = [
    "LOSSES",
    "B2DiffuRLStrategy",
    "METHODS",
    "STRATEGIES",
    "Checkpoint",
    "GroupRolloutStrategy",
    "NFTLoss",
    "PPOClipLoss",
    "RWRLoss",
    "ReFLLoss",
    "ParameterEMA",
    "PolicyLoss",
    "RecipeConfig",
    "RolloutBatch",
    "RolloutContext",
    "RolloutStrategy",
    "SolRLStrategy",
    "TokenPPOLoss",
    "Trainer",
    "build_trainer",
    "latest_checkpoint",
    "list_trainers",
    "load_checkpoint",
    "load_recipe",
    "save_checkpoint",
]
