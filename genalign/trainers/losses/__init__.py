"""Losses, one per file: how sampled trajectories and their advantages become gradients.

``LOSSES`` maps the recipe's ``train.loss`` names to the classes: ``ppo_clip``
(:mod:`.ppo_clip`), ``nft`` (:mod:`.nft`), ``rwr`` (:mod:`.rwr`), ``refl`` (:mod:`.refl`),
``token_ppo`` (:mod:`.token_ppo`, the ``language`` family's), ``sft`` (:mod:`.sft`, its
supervised fine-tuning), ``astrolabe`` (:mod:`.astrolabe`, the ``ar_video`` family's);
:class:`JointLoss` (:mod:`.joint`)
sums the losses of a joint run's policies; the
contract and its hooks are :mod:`.base`; a loss outside genalign is named ``"package.module:Class"``.
"""

from __future__ import annotations

from genalign.trainers.losses.astrolabe import AstrolabeLoss
from genalign.trainers.losses.base import LOSSES, FunctionLoss, PolicyLoss, as_policy_loss
from genalign.trainers.losses.forward_process import (
    conditional_settings,
    reference_output_kl,
    seeded_noise,
    with_reference_kl,
)
from genalign.trainers.losses.joint import JointLoss
from genalign.trainers.losses.nft import NFTLoss
from genalign.trainers.losses.ppo_clip import PPOClipLoss
from genalign.trainers.losses.q_hawkeye import QHawkeyeLoss
from genalign.trainers.losses.refl import ReFLLoss
from genalign.trainers.losses.rwr import RWRLoss
from genalign.trainers.losses.sft import SFTLoss
from genalign.trainers.losses.token_ppo import TokenPPOLoss

__all__ = [
    "LOSSES",
    "AstrolabeLoss",
    "FunctionLoss",
    "JointLoss",
    "NFTLoss",
    "PPOClipLoss",
    "PolicyLoss",
    "QHawkeyeLoss",
    "RWRLoss",
    "ReFLLoss",
    "SFTLoss",
    "TokenPPOLoss",
    "as_policy_loss",
    "conditional_settings",
    "reference_output_kl",
    "seeded_noise",
    "with_reference_kl",
]
