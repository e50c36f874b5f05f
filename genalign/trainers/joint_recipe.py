"""A joint run from a recipe: PromptRL's generator (``model``) and rewriter (``rewriter``).

:func:`build_trainer` loads the generator as for any recipe; when the recipe has a ``rewriter``
section, :func:`joint_policy_and_loss` loads the language model beside it and returns the
:class:`~genalign.policies.JointPolicy` and :class:`~genalign.trainers.losses.JointLoss` the
``prompt_rewrite`` strategy trains (arXiv 2602.01382; UniRL's joint trainers): the generator's
loss is ``train.loss`` (Flow-GRPO's ``ppo_clip``, KL beta ``train.kl_coef``), the rewriter's
``token_ppo`` with the k3 coefficient ``train.prompt_rewrite.rewriter_kl_coef``.
``train.prompt_rewrite.trains`` leaves one of them frozen (no parameter group, no loss).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from genalign import policies
from genalign.policies import JointPolicy, LoRASpec
from genalign.trainers.losses.base import PolicyLoss
from genalign.trainers.losses.joint import JointLoss
from genalign.trainers.losses.token_ppo import TokenPPOLoss
from genalign.trainers.strategies.prompt_rewrite import GENERATOR, REWRITER

__all__ = ["generator_training", "joint_policy_and_loss"]


def generator_training(config: Any, lora: LoRASpec | None) -> tuple[LoRASpec | None, bool]:
    """The generator's LoRA and whether it is trained: ``(lora, True)`` unless the recipe is a
    PromptRL run with the generator frozen (``train.prompt_rewrite.trains: rewriter``)."""
    if config.rewriter is not None and config.train.prompt_rewrite.trains == "rewriter":
        return None, False
    return lora, True


def joint_policy_and_loss(
    config: Any, generator: Any, generator_loss: PolicyLoss, device: Any
) -> tuple[JointPolicy, JointLoss]:
    """The rewriter of ``config.rewriter`` loaded on ``device`` beside ``generator``, and the
    joint loss of the trained ones (``config``: a :class:`~genalign.trainers.config.RecipeConfig`)."""
    from genalign.config import to_dict

    spec = config.rewriter
    trains = config.train.prompt_rewrite.trains
    train_rewriter = trains != "generator"
    lora = LoRASpec(**to_dict(spec.lora)) if spec.lora is not None and train_rewriter else None
    rewriter = policies.load_policy(  # looked up at call time, as build_trainer's own
        spec.family, spec.path, lora=lora, train=train_rewriter, dtype=spec.dtype, device=device
    )
    policy = JointPolicy({GENERATOR: generator, REWRITER: rewriter})
    rewriter_train = dataclasses.replace(config.train, kl_coef=config.train.prompt_rewrite.rewriter_kl_coef)
    losses: dict[str, PolicyLoss] = {}
    if trains != "rewriter":
        losses[GENERATOR] = generator_loss
    if train_rewriter:
        losses[REWRITER] = TokenPPOLoss(rewriter_train)
    return policy, JointLoss(losses, primary=GENERATOR if GENERATOR in losses else REWRITER)
