"""ReNO's objective (Eyring et al., NeurIPS 2024): the weighted reward ensemble and the noise-norm
regulariser,

    L(z) = -sum_i w_i R_i(G(z), prompt) + lambda * K(z)                          (the paper's objective)
    K(z) = ||z||^2 / 2 - (d - 1) log ||z||                                       (the norm regulariser)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from genalign.rewards import EnsembleReward, Reward, list_rewards, load_reward

logger = logging.getLogger(__name__)

__all__ = [
    "RENO_REWARD_KWARGS",
    "RENO_REWARD_WEIGHTS",
    "RewardsSpec",
    "build_reward_ensemble",
    "norm_regularizer",
]

RENO_REWARD_WEIGHTS: dict[str, float] = {"hpsv2": 5.0, "imagereward": 1.0, "pickscore": 0.05, "clip": 0.01}
"""The paper's default ensemble weights (HPS v2.1, ImageReward, PickScore, CLIP; ReNO code
``arguments.py``), each on the scale of the official loss it weighs: HPS v2.1's cosine, PickScore's
and CLIP's logit (``exp(logit_scale) * cos``; :data:`RENO_REWARD_KWARGS` sets CLIP to ReNO's model
and logit, where our ``clip`` defaults to CLIPScore on ViT-B/32). ImageReward joins when a reward
of that name is registered."""

RENO_REWARD_KWARGS: dict[str, dict[str, Any]] = {
    "clip": {
        "backend": "transformers",
        "model": "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
        "convention": "logit",
    },
}
"""What the default ensemble loads each member with (ReNO's ``rewards/clip.py``: the LAION ViT-H/14,
``100 - exp(logit_scale) * cos`` as the loss); ``reward_kwargs`` given for a name update these."""

RewardsSpec = (
    Reward | Mapping[str, float | tuple[float, Mapping[str, Any]]] | Sequence[Reward | tuple[Reward, float]]
)


def norm_regularizer(latents: torch.Tensor, weight: float = 0.01) -> torch.Tensor:
    """ReNO's noise-norm regulariser (the norm regulariser), one value per sample.

    ``weight * (||z_b||^2 / 2 - (d - 1) log ||z_b||)`` with ``d`` the number of elements of one
    sample; computed in fp32. Its gradient ``weight * z (1 - (d - 1) / ||z||^2)`` vanishes on
    the chi mode ``||z|| = sqrt(d - 1)``.

    Args:
        latents: ``[B, ...]`` initial noise.
        weight: lambda.

    Returns:
        ``[B]`` regulariser values.
    """
    flat = latents.float().flatten(1)  # (B, d)
    dim = flat.shape[1]
    norm = torch.linalg.vector_norm(flat, dim=1)  # (B,)
    return weight * (0.5 * norm**2 - (dim - 1) * torch.log(norm))


def build_reward_ensemble(
    rewards: RewardsSpec | None, reward_kwargs: Mapping[str, Mapping] | None = None
) -> Reward:
    """Turn a rewards spec into one differentiable reward ``sum_i w_i R_i``.

    Args:
        rewards: a ``Reward`` (used as is); a mapping ``{registered name: weight}`` (or
            ``{name: (weight, kwargs)}``), loaded with :func:`load_reward`; a list of ``Reward``
            or ``(Reward, weight)``. ``None``: the paper's ensemble :data:`RENO_REWARD_WEIGHTS`,
            restricted to the registered names, each loaded with :data:`RENO_REWARD_KWARGS`.
        reward_kwargs: per-name keyword arguments for :func:`load_reward` (mapping form only).

    Raises:
        ValueError: on an empty spec, an unknown name or a member that is not differentiable
            (ReNO needs gradients of the reward with respect to the image).
    """
    reward_kwargs = dict(reward_kwargs or {})
    if rewards is None:
        known = set(list_rewards())
        rewards = {
            name: (weight, {**RENO_REWARD_KWARGS.get(name, {}), **reward_kwargs.get(name, {})})
            for name, weight in RENO_REWARD_WEIGHTS.items()
            if name in known
        }
        skipped = sorted(set(RENO_REWARD_WEIGHTS) - known)
        if skipped:
            logger.warning("ReNO default ensemble: %s not registered, left out", ", ".join(skipped))
    if isinstance(rewards, Reward):
        members: list[dict[str, Any]] = [{"reward": rewards}]
    elif isinstance(rewards, Mapping):
        members = []
        for name, value in rewards.items():
            weight, kwargs = value if isinstance(value, tuple) else (value, reward_kwargs.get(name, {}))
            members.append(
                {"reward": load_reward(name, **dict(kwargs)), "weight": float(weight), "key": name}
            )
    else:
        members = []
        for item in rewards:
            reward, weight = item if isinstance(item, tuple) else (item, 1.0)
            members.append({"reward": reward, "weight": float(weight)})
    if not members:
        raise ValueError("ReNO: no rewards given")
    for member in members:
        reward = member["reward"]
        if not isinstance(reward, Reward):
            raise ValueError(f"ReNO: {type(reward).__name__} is not a genalign Reward")
        if not reward.differentiable:
            raise ValueError(
                f"ReNO: reward {reward.name!r} is not differentiable; noise optimisation needs "
                "gradients from the reward to the image (use e.g. clip, pickscore, hpsv2, aesthetic)"
            )
    if len(members) == 1 and isinstance(members[0]["reward"], EnsembleReward) and "weight" not in members[0]:
        return members[0]["reward"]
    return EnsembleReward(members)
