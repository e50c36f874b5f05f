"""Pure math of RL for generators: advantages, policy losses, KL terms and step selection.

One method's math per module where it has its own: :mod:`.nft` (DiffusionNFT's loss kernel),
:mod:`.b2diffurl` (B2-DiffuRL's schedule, selection and advantages), :mod:`.sol_rl` (Sol-RL's
candidate selection), :mod:`.rwr` and :mod:`.refl` (their objectives), :mod:`.token_ppo` (the
token-level clipped objective of language policies), :mod:`.sft` (the next-token loss of
supervised fine-tuning), :mod:`.prompt_rewrite` (PromptRL's answer extraction, format reward
and prompt retention), :mod:`.q_hawkeye` (Q-Hawkeye's IQA rewards, uncertainty-aware advantages
and perception term), :mod:`.astrolabe` (Astrolabe's x0-space forward-process loss and old-policy
update) and :mod:`.selective_kl` (its selective KL: rank disagreement, the adaptive fraction and the
lagging reference's reset rule).

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
from genalign.algorithms.astrolabe import (
    ASTROLABE_TIMESTEPS,
    astrolabe_advantages,
    astrolabe_loss,
    astrolabe_old_policy_decay,
    flow_forward_noise,
    frame_timesteps,
    masked_sample_mean,
    sample_noise_level,
    soft_update_,
)
from genalign.algorithms.b2diffurl import (
    PromptRewardHistory,
    branch_advantages,
    select_in_branch_groups,
    split_step_at,
    train_window,
)
from genalign.algorithms.kl import estimate_kl, gaussian_step_kl, kl_k1, kl_k2, kl_k3
from genalign.algorithms.losses import ppo_clip_loss, reduce_log_prob, score_function_loss
from genalign.algorithms.nft import nft_loss, nft_loss_in_x0, nft_old_policy_decay, optimality_probability
from genalign.algorithms.prompt_rewrite import (
    GENEVAL_TEMPLATE,
    extract_answer,
    format_rewards,
    refine_prompts,
    retained_format_rewards,
    retained_rows,
)
from genalign.algorithms.q_hawkeye import (
    accuracy_reward,
    cosine_annealed,
    format_reward,
    parse_answer_score,
    perception_k3,
    perception_term,
    repetition_penalty,
    score_uncertainty_weights,
    uncertainty_aware_advantages,
)
from genalign.algorithms.refl import refl_objective
from genalign.algorithms.rwr import rwr_weights
from genalign.algorithms.selection import (
    num_selected_timesteps,
    select_timesteps,
    select_timesteps_per_sample,
)
from genalign.algorithms.selective_kl import (
    SelectiveKLConfig,
    SelectiveKLState,
    kl_selection_threshold,
    observe_reference_kl,
    rank_disagreement,
    reset_reference_at_epoch,
    reward_ranks,
    select_kl_samples,
    selective_kl_reward_names,
    update_selection_fraction,
)
from genalign.algorithms.sft import SFT_AGGREGATIONS, next_token_loss
from genalign.algorithms.sol_rl import ranking_fidelity, select_candidates
from genalign.algorithms.token_ppo import TOKEN_AGGREGATIONS, aggregate_tokens, token_ppo_loss

__all__ = [
    "ASTROLABE_TIMESTEPS",
    "astrolabe_advantages",
    "astrolabe_loss",
    "astrolabe_old_policy_decay",
    "flow_forward_noise",
    "frame_timesteps",
    "masked_sample_mean",
    "sample_noise_level",
    "soft_update_",
    "SelectiveKLConfig",
    "SelectiveKLState",
    "reset_reference_at_epoch",
    "kl_selection_threshold",
    "observe_reference_kl",
    "rank_disagreement",
    "reward_ranks",
    "select_kl_samples",
    "selective_kl_reward_names",
    "update_selection_fraction",
    "GENEVAL_TEMPLATE",
    "extract_answer",
    "format_rewards",
    "refine_prompts",
    "retained_format_rewards",
    "retained_rows",
    "SFT_AGGREGATIONS",
    "next_token_loss",
    "PerPromptStatTracker",
    "PromptRewardHistory",
    "branch_advantages",
    "nft_loss",
    "nft_loss_in_x0",
    "nft_old_policy_decay",
    "optimality_probability",
    "ranking_fidelity",
    "refl_objective",
    "rwr_weights",
    "select_candidates",
    "select_in_branch_groups",
    "split_step_at",
    "train_window",
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
    "TOKEN_AGGREGATIONS",
    "aggregate_tokens",
    "token_ppo_loss",
    "accuracy_reward",
    "cosine_annealed",
    "format_reward",
    "parse_answer_score",
    "perception_k3",
    "perception_term",
    "repetition_penalty",
    "score_uncertainty_weights",
    "uncertainty_aware_advantages",
]
