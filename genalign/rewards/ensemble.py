"""Weighted ensembles of rewards: ``score = sum_i w_i * normalise_i(score_i)``.

Multi-reward alignment (ReNO combines HPS v2.1, PickScore, ImageReward and CLIPScore; many RL
recipes mix an aesthetic and an alignment reward) needs one scalar per sample. Members are built
by name from specs, or passed as built rewards::

    load_reward("ensemble", members=[
        {"name": "hpsv2", "weight": 1.0, "kwargs": {"version": "v2.1"}},
        {"name": "pickscore", "weight": 0.05, "normalize": "batch"},
        {"reward": my_reward, "weight": 0.5, "key": "mine"},
    ])

Normalisation puts members on one scale before weighting: ``"batch"`` is a z-score over the
batch, ``(s - mean_B(s)) / (std_B(s) + eps)``, with the statistics treated as constants (so each
image's gradient is its own member gradient, rescaled); ``{"mean": m, "std": s}`` is a fixed
affine map, e.g. a member's statistics measured on a reference set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from genalign.rewards.base import Reward, RewardOutput, load_reward, register_reward

SPEC_KEYS = ("name", "reward", "weight", "kwargs", "normalize", "key")
BATCH_EPS = 1e-6


@dataclass(frozen=True)
class Normalization:
    """How a member's scores are rescaled: ``kind`` "none", "batch" or "fixed" (with mean/std)."""

    kind: str = "none"
    mean: float = 0.0
    std: float = 1.0

    @classmethod
    def parse(cls, spec: Any, key: str) -> Normalization:
        if spec is None or spec == "none":
            return cls()
        if spec == "batch":
            return cls("batch")
        if isinstance(spec, Mapping):
            unknown = set(spec) - {"mean", "std"}
            if unknown or "std" not in spec or "mean" not in spec:
                raise ValueError(
                    f"ensemble member {key!r}: normalize must be {{'mean': m, 'std': s}}, got {dict(spec)}"
                )
            if float(spec["std"]) <= 0:
                raise ValueError(f"ensemble member {key!r}: normalize std must be > 0, got {spec['std']}")
            return cls("fixed", float(spec["mean"]), float(spec["std"]))
        raise ValueError(
            f"ensemble member {key!r}: normalize must be None, 'batch' or {{'mean', 'std'}}, got {spec!r}"
        )

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        if self.kind == "batch":  # statistics of the finite scores: one NaN stays that sample's own
            finite = scores.detach()[torch.isfinite(scores.detach())]
            mean = finite.mean() if finite.numel() else scores.new_zeros(())
            std = finite.std(unbiased=False) if finite.numel() > 1 else torch.zeros_like(mean)
            return (scores - mean) / (std + BATCH_EPS)
        if self.kind == "fixed":
            return (scores - self.mean) / self.std
        return scores


@register_reward("ensemble")
class EnsembleReward(Reward):
    """Weighted sum of member rewards, each optionally normalised.

    Args:
        members: specs ``{"name": registered name, "kwargs": {...}}`` or ``{"reward": Reward}``,
            each with optional ``"weight"`` (default 1.0), ``"normalize"`` (None, "batch",
            ``{"mean", "std"}``) and ``"key"`` (its name in ``details``; default the reward's
            name, suffixed ``_1``, ``_2`` ... when repeated); or plain ``Reward`` instances.
        strict: raise on NaN scores.

    Scores ``[B]``: ``sum_i weight_i * normalize_i(score_i)``; the range follows the members.
    ``details[key]`` holds each member's raw scores, ``details[key + "/normalized"]`` the
    normalised ones when normalised, ``details[key + "/" + name]`` each member's own details.
    Differentiable iff every member is.
    """

    def __init__(self, members: Sequence[Mapping[str, Any] | Reward], strict: bool = False) -> None:
        super().__init__(strict=strict)
        if not members:
            raise ValueError("ensemble: needs at least one member")
        rewards, self.keys, self.weights, self.normalizations = [], [], [], []
        for position, spec in enumerate(members):
            if isinstance(spec, Reward):
                spec = {"reward": spec}
            if not isinstance(spec, Mapping):
                raise ValueError(
                    f"ensemble member {position}: expected a spec dict or a Reward, got {type(spec).__name__}"
                )
            unknown = sorted(set(spec) - set(SPEC_KEYS))
            if unknown:
                raise ValueError(
                    f"ensemble member {position}: unknown key(s) {unknown}; allowed: {list(SPEC_KEYS)}"
                )
            if ("name" in spec) == ("reward" in spec):
                raise ValueError(f"ensemble member {position}: give exactly one of 'name' or 'reward'")
            reward = (
                spec["reward"]
                if "reward" in spec
                else load_reward(spec["name"], **dict(spec.get("kwargs", {})))
            )
            if not isinstance(reward, Reward):
                raise ValueError(f"ensemble member {position}: {type(reward).__name__} is not a Reward")
            key = str(spec.get("key") or reward.name)
            if key in self.keys:
                if "key" in spec:
                    raise ValueError(f"ensemble: duplicate member key {key!r}")
                key = next(f"{key}_{i}" for i in range(1, len(members) + 1) if f"{key}_{i}" not in self.keys)
            rewards.append(reward)
            self.keys.append(key)
            self.weights.append(float(spec.get("weight", 1.0)))
            self.normalizations.append(Normalization.parse(spec.get("normalize"), key))
        kinds = {reward.input_kind for reward in rewards}
        if len(kinds) > 1:
            raise ValueError(f"ensemble: members take different inputs {sorted(kinds)}")
        self.input_kind = kinds.pop()
        self.members = torch.nn.ModuleList(rewards)
        self.differentiable = all(reward.differentiable for reward in rewards)

    def score(self, images: Any, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        total: torch.Tensor | None = None
        details: dict[str, Any] = {}
        for key, reward, weight, normalization in zip(
            self.keys, self.members, self.weights, self.normalizations
        ):
            out = reward(images, prompts, **metadata)
            scores = out.scores.float()
            details[key] = scores.detach()
            for name, value in out.details.items():
                details[f"{key}/{name}"] = value
            if normalization.kind != "none":
                scores = normalization(scores)
                details[f"{key}/normalized"] = scores.detach()
            term = weight * scores
            total = term if total is None else total + term.to(total.device)
        return RewardOutput(total, details)

    def extra_repr(self) -> str:
        parts = [
            f"{k}: weight={w}, normalize={n.kind}"
            for k, w, n in zip(self.keys, self.weights, self.normalizations)
        ]
        return "\n".join(parts)
