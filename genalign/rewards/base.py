"""The reward protocol, its output type and the reward registry.

Contract (DESIGN.md)::

    reward = load_reward("clip", model="ViT-B-32", pretrained="openai")
    out = reward(images, prompts, **metadata)   # images: float [B, 3, H, W] in [0, 1]
    out.scores    # float [B]
    out.details   # dict of named per-sample components
    reward.differentiable   # gradients flow from scores to images

A reward that cannot score an input returns a defined penalty and counts it in ``details``;
it never crashes the batch. Non-finite scores (NaN or infinite) are counted in
``details["nan_count"]`` and raise in strict mode.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from genalign.registry import Registry, unknown_option_message

logger = logging.getLogger(__name__)

REWARDS: Registry[type[Reward]] = Registry("reward")


def register_reward(name: str):
    """Class decorator: ``@register_reward("clip")`` makes ``load_reward("clip")`` build it."""

    def decorator(cls):
        REWARDS.add(name, cls)
        if getattr(cls, "name", None) in (None, "reward"):
            cls.name = name
        return cls

    return decorator


@dataclass
class RewardOutput:
    """What every reward returns.

    Attributes:
        scores: float tensor ``[B]``; differentiable w.r.t. the images when the reward is.
        details: named per-sample components (tensors ``[B]`` or lists of length B) and counters.
    """

    scores: torch.Tensor
    details: dict[str, Any] = field(default_factory=dict)


class Reward(torch.nn.Module):
    """Base class of all rewards.

    Subclasses implement :meth:`score` on validated inputs. ``__call__`` validates images and
    prompts, runs ``score`` under ``torch.no_grad`` unless gradients are wanted, and checks the
    result for NaNs.

    Attributes:
        name: the registry name.
        differentiable: True when gradients flow from scores to images.
        strict: raise on non-finite (NaN or infinite) scores instead of reporting them.
    """

    name: str = "reward"
    differentiable: bool = False
    # "image" ([B,3,H,W] in [0,1]), "video" ([B,F,3,H,W] in [0,1]), "svg" (list of SVG strings) or
    # "text" (a language policy's completions: a list of strings)
    input_kind: str = "image"

    def __init__(self, strict: bool = False) -> None:
        super().__init__()
        self.strict = strict

    # -- to implement -------------------------------------------------------------------------
    def score(self, images: Any, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        raise NotImplementedError

    # -- the protocol -------------------------------------------------------------------------
    def forward(self, images: Any, prompts: Sequence[str] | None = None, **metadata: Any) -> RewardOutput:
        batch = self.validate(images, prompts)
        prompts = list(prompts) if prompts is not None else [""] * batch
        want_grad = self.differentiable and torch.is_tensor(images) and images.requires_grad
        with torch.set_grad_enabled(want_grad and torch.is_grad_enabled()):
            out = self.score(images, prompts, **metadata)
        return self._check_output(out, batch)

    def validate(self, images: Any, prompts: Sequence[str] | None) -> int:
        """Check shapes and ranges; return the batch size."""
        if self.input_kind == "image":
            batch = validate_images(images)
        elif self.input_kind == "video":
            batch = validate_videos(images)
        else:
            if isinstance(images, str) or not isinstance(images, Sequence):
                what = "SVG strings" if self.input_kind == "svg" else "strings"
                raise ValueError(f"{self.name}: expected a list of {what}, got {type(images).__name__}")
            batch = len(images)
        if prompts is not None:
            if isinstance(prompts, str):
                raise ValueError(f"{self.name}: prompts must be a list of strings, not a single string")
            if len(prompts) != batch:
                shape = f" (shape {tuple(images.shape)})" if torch.is_tensor(images) else ""
                noun = "texts" if self.input_kind == "text" else "images"
                raise ValueError(f"{self.name}: got {batch} {noun}{shape} but {len(prompts)} prompts")
        return batch

    def _check_output(self, out: RewardOutput, batch: int) -> RewardOutput:
        scores = out.scores
        if scores.shape != (batch,):
            raise RuntimeError(
                f"{self.name} returned scores of shape {tuple(scores.shape)}, expected ({batch},)"
            )
        bad = ~torch.isfinite(scores.detach())
        count = int(bad.sum())
        out.details.setdefault("nan_count", count)  # NaN or infinite
        if count:
            message = (
                f"{self.name}: {count} of {batch} scores are not finite "
                f"(indices {bad.nonzero().flatten().tolist()})"
            )
            if self.strict:
                raise FloatingPointError(message)
            logger.warning(message)
        return out


def validate_images(images: Any) -> int:
    """Images must be a float tensor ``[B, 3, H, W]`` with values in [0, 1]; returns B."""
    if not torch.is_tensor(images):
        raise ValueError(f"images must be a torch.Tensor [B, 3, H, W], got {type(images).__name__}")
    if images.ndim != 4:
        raise ValueError(f"images must have shape [B, 3, H, W], got shape {tuple(images.shape)}")
    if images.shape[1] != 3:
        raise ValueError(f"images must have 3 channels in dim 1, got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(f"images must be floating point in [0, 1], got dtype {images.dtype}")
    if images.numel() and not torch.isfinite(images.detach()).all():
        bad = (~torch.isfinite(images.detach())).flatten(1).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(
            f"images contain NaN or infinite values (samples {bad}, shape {tuple(images.shape)})"
        )
    if images.numel():
        lo, hi = float(images.detach().min()), float(images.detach().max())
        if lo < -1e-4 or hi > 1 + 1e-4:
            raise ValueError(
                f"images must be in [0, 1], got values in [{lo:.4g}, {hi:.4g}] (shape {tuple(images.shape)})"
            )
    return images.shape[0]


def validate_videos(videos: Any) -> int:
    """Videos must be a float tensor ``[B, F, 3, H, W]`` in [0, 1] (each frame an image); returns B."""
    if not torch.is_tensor(videos) or videos.ndim != 5:
        shape = tuple(videos.shape) if torch.is_tensor(videos) else type(videos).__name__
        raise ValueError(f"videos must be a torch.Tensor [B, F, 3, H, W], got {shape}")
    validate_images(videos.reshape(-1, *videos.shape[2:]))
    return videos.shape[0]


def load_reward(name: str, **kwargs: Any) -> Reward:
    """Build a registered reward by name (or ``"module.path:Class"``) with keyword arguments.

    A keyword the reward does not take, or a value its constructor rejects (a ``TypeError`` or
    ``ValueError``), raises ``ValueError`` naming the reward and its options, not the constructor's
    bare message."""
    cls = REWARDS.get(name)
    message = unknown_option_message(cls, kwargs, f"reward {name!r}")
    if message is not None:
        raise ValueError(message)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:
        if not kwargs:
            raise
        given = ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
        raise ValueError(f"reward {name!r} ({given}): {error}") from error


def load_image_reward(reward: Any, kwargs: Any = None, owner: str = "reward") -> Reward:
    """The image reward a wrapper reward applies (``video``, ``svg_render``): a ``Reward``, a
    registered name with ``kwargs``, or ``{"name", "kwargs"}``. Raises ``ValueError`` (naming
    ``owner``) when it does not score images."""
    if isinstance(reward, Mapping):
        reward, kwargs = reward["name"], reward.get("kwargs", kwargs)
    image_reward = reward if isinstance(reward, Reward) else load_reward(reward, **dict(kwargs or {}))
    if image_reward.input_kind != "image":
        raise ValueError(f"{owner}: {image_reward.name!r} scores {image_reward.input_kind}, not images")
    return image_reward


def list_rewards() -> list[str]:
    """Names of all registered rewards."""
    return REWARDS.names()
