"""Pure math of RL for generators: advantages, policy losses, KL terms and step selection.

Nothing here knows about models; every function takes and returns tensors (or plain Python
state), so trainers compose them and tests check them against hand-computed numbers.
"""

from __future__ import annotations

from genalign.algorithms.advantages import (
    PerPromptStatTracker,
    clip_advantages,
    group_advantages,
    group_reward_statistics,
)
from genalign.algorithms.kl import estimate_kl, gaussian_step_kl, kl_k1, kl_k2, kl_k3
from genalign.algorithms.losses import ppo_clip_loss, reduce_log_prob, score_function_loss
from genalign.algorithms.selection import (
    num_selected_timesteps,
    select_timesteps,
    select_timesteps_per_sample,
)

__all__ = [
    "PerPromptStatTracker",
    "clip_advantages",
    "estimate_kl",
    "gaussian_step_kl",
    "group_advantages",
    "group_reward_statistics",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "num_selected_timesteps",
    "ppo_clip_loss",
    "reduce_log_prob",
    "score_function_loss",
    "select_timesteps",
    "select_timesteps_per_sample",
]
