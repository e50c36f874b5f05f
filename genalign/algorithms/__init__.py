"""Pure math of RL for generators: advantages, policy losses, KL terms and step selection.

One method's math per module where it has its own: :mod:`.nft` (DiffusionNFT's loss kernel),
:mod:`.b2diffurl` (B2-DiffuRL's schedule, selection and advantages), :mod:`.sol_rl` (Sol-RL's
candidate selection), :mod:`.rwr` and :mod:`.refl` (their objectives), :mod:`.token_ppo` (the
token-level clipped objective of language policies), :mod:`.token_truncation` (top-k / top-p
truncation of a token distribution, replayed when log-probs are recomputed), :mod:`.sft` (the next-token loss of
supervised fine-tuning), :mod:`.prompt_rewrite` (PromptRL's answer extraction, format reward
and prompt retention), :mod:`.q_hawkeye` (Q-Hawkeye's IQA rewards, uncertainty-aware advantages
and perception term), :mod:`.rank_fidelity` (VisualQuality-R1's Thurstone ranking reward), :mod:`.copy_order` (our
pair-order reward: a degraded copy scored below its original),
:mod:`.astrolabe` (Astrolabe's x0-space forward-process loss and old-policy
update) and :mod:`.selective_kl` (its selective KL: rank disagreement, the adaptive fraction and the
lagging reference's reset rule).

Nothing here knows about models; every function takes and returns tensors (or plain Python
state), so trainers compose them and tests check them against hand-computed numbers.
"""

from __future__ import annotations

from importlib import import_module

from genalign.algorithms.advantages import *  # noqa: F403
from genalign.algorithms.astrolabe import *  # noqa: F403
from genalign.algorithms.b2diffurl import *  # noqa: F403
from genalign.algorithms.copy_order import *  # noqa: F403
from genalign.algorithms.kl import *  # noqa: F403
from genalign.algorithms.losses import NO_CLIP, ppo_clip_loss, reduce_log_prob, score_function_loss
from genalign.algorithms.nft import *  # noqa: F403
from genalign.algorithms.prompt_rewrite import *  # noqa: F403
from genalign.algorithms.q_hawkeye import *  # noqa: F403
from genalign.algorithms.rank_fidelity import *  # noqa: F403
from genalign.algorithms.refl import *  # noqa: F403
from genalign.algorithms.rwr import *  # noqa: F403
from genalign.algorithms.selection import *  # noqa: F403
from genalign.algorithms.selective_kl import *  # noqa: F403
from genalign.algorithms.sft import *  # noqa: F403
from genalign.algorithms.sol_rl import *  # noqa: F403
from genalign.algorithms.token_ppo import *  # noqa: F403
from genalign.algorithms.token_truncation import *  # noqa: F403

# Each re-exported module's public names, written once (its ``__all__``); ``losses`` keeps
# ``clip_bounds`` to itself.
_REEXPORTED = (
    "advantages",
    "astrolabe",
    "b2diffurl",
    "copy_order",
    "kl",
    "nft",
    "prompt_rewrite",
    "q_hawkeye",
    "rank_fidelity",
    "refl",
    "rwr",
    "selection",
    "selective_kl",
    "sft",
    "sol_rl",
    "token_ppo",
    "token_truncation",
)
__all__ = [
    *(name for module in _REEXPORTED for name in import_module(f"{__name__}.{module}").__all__),
    "NO_CLIP",
    "ppo_clip_loss",
    "reduce_log_prob",
    "score_function_loss",
]
