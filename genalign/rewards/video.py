"""Video rewards from image rewards: score every frame, aggregate per video.

Astrolabe (arXiv 2603.17051; ``astrolabe/rewards.py`` @ 35a5347) scores each frame of a video with
an image reward (HPSv3's mu, HPSv2) and takes the mean of the best 30% of frames,
``top_k = max(1, int(F * 0.3))``, "to reduce noise from low-quality frames"; it also logs the mean
over all frames. :class:`VideoReward` does that for any registered image reward::

    reward = load_reward("video", reward="jpeg_compressibility", aggregation="top_fraction", fraction=0.3)
    out = reward(videos, prompts)      # videos: float [B, F, 3, H, W] in [0, 1]
    out.scores                          # [B]
    out.details["frame_scores"]         # [B, F] every frame's score

Several video rewards combine with the ``ensemble`` reward (its ``details[key]`` holds each
member's per-video scores); :func:`per_reward_ranks` ranks them over a batch (1 = best), the input
of Astrolabe's selective KL (:func:`genalign.algorithms.selective_kl.select_kl_samples`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from genalign.algorithms.selective_kl import reward_ranks
from genalign.rewards.base import Reward, RewardOutput, load_image_reward, register_reward

__all__ = ["FRAME_AGGREGATIONS", "VideoReward", "aggregate_frame_scores", "per_reward_ranks"]

FRAME_AGGREGATIONS = ("top_fraction", "mean", "min")


def aggregate_frame_scores(
    frame_scores: torch.Tensor, aggregation: str = "top_fraction", fraction: float = 0.3
) -> torch.Tensor:
    """Per-video scores ``[B]`` from per-frame scores ``[B, F]``.

    ``top_fraction``: the mean of the ``max(1, int(F * fraction))`` highest frames (Astrolabe's
    top-30% mean); ``mean``: over all frames; ``min``: the worst frame.
    """
    if frame_scores.ndim != 2 or frame_scores.shape[1] == 0:
        raise ValueError(f"frame_scores must have shape [B, F] with F >= 1, got {tuple(frame_scores.shape)}")
    if aggregation == "mean":
        return frame_scores.mean(dim=1)
    if aggregation == "min":
        return frame_scores.min(dim=1).values
    if aggregation == "top_fraction":
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
        top_k = max(1, int(frame_scores.shape[1] * fraction))
        return frame_scores.topk(top_k, dim=1).values.mean(dim=1)
    raise ValueError(f"aggregation must be one of {FRAME_AGGREGATIONS}, got {aggregation!r}")


def per_reward_ranks(details: Mapping[str, Any], keys: Sequence[str]) -> dict[str, torch.Tensor]:
    """Each named reward's rank ``[B]`` over the batch (1 = best; ties: the earlier sample first),
    from an ensemble's ``details`` (``details[key]``: a member's per-sample scores ``[B]``)."""
    missing = [key for key in keys if key not in details]
    if missing:
        raise KeyError(f"details hold no scores for {missing}; they have {sorted(details)}")
    return {key: reward_ranks(torch.as_tensor(details[key]).float()) for key in keys}


def _per_frame(value: Any, batch: int, num_frames: int) -> Any:
    """A per-sample metadata value (list or tensor of length B) repeated for each frame."""
    if torch.is_tensor(value) and value.ndim > 0 and value.shape[0] == batch:
        return value.repeat_interleave(num_frames, dim=0)
    if isinstance(value, (list, tuple)) and len(value) == batch:
        return [item for item in value for _ in range(num_frames)]
    return value


@register_reward("video")
class VideoReward(Reward):
    """An image reward applied to every frame, aggregated per video (module docstring).

    Args:
        reward: the image reward: a registered name, a ``Reward``, or ``{"name", "kwargs"}``.
        kwargs: keyword arguments of a reward given by name.
        aggregation: ``"top_fraction"`` (Astrolabe's), ``"mean"`` or ``"min"``.
        fraction: the share of best frames ``top_fraction`` averages (0.3).
        frame_batch_size: frames scored per call of the image reward (None: all at once).
        strict: raise on NaN scores.

    ``details``: ``frame_scores`` ``[B, F]``, ``frame_mean`` ``[B]`` (the official
    ``all_frame_avg``) and the image reward's numeric details summed over frames (``frames/<key>``).
    """

    input_kind = "video"

    def __init__(
        self,
        reward: str | Reward | Mapping[str, Any],
        kwargs: Mapping[str, Any] | None = None,
        aggregation: str = "top_fraction",
        fraction: float = 0.3,
        frame_batch_size: int | None = None,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        if aggregation not in FRAME_AGGREGATIONS:
            raise ValueError(
                f"video reward: aggregation must be one of {FRAME_AGGREGATIONS}, got {aggregation!r}"
            )
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"video reward: fraction must lie in (0, 1], got {fraction}")
        if frame_batch_size is not None and frame_batch_size <= 0:
            raise ValueError(f"video reward: frame_batch_size must be positive, got {frame_batch_size}")
        image_reward = load_image_reward(reward, kwargs, "video reward")
        self.image_reward = image_reward
        self.aggregation, self.fraction, self.frame_batch_size = (
            aggregation,
            float(fraction),
            frame_batch_size,
        )
        self.differentiable = image_reward.differentiable

    def score(self, videos: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        batch, num_frames = videos.shape[:2]
        frames = videos.reshape(batch * num_frames, *videos.shape[2:])  # (B * F, 3, H, W)
        frame_prompts = [p for p in prompts for _ in range(num_frames)]
        frame_metadata = {k: _per_frame(v, batch, num_frames) for k, v in metadata.items()}
        size = self.frame_batch_size or frames.shape[0]
        scores, details = [], {}
        for start in range(0, frames.shape[0], size):
            part = slice(start, start + size)
            chunk = {
                k: v[part] if torch.is_tensor(v) or isinstance(v, list) else v
                for k, v in frame_metadata.items()
            }
            out = self.image_reward(frames[part], frame_prompts[part], **chunk)
            scores.append(out.scores.float())
            for key, value in out.details.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    details[f"frames/{key}"] = details.get(f"frames/{key}", 0) + value
        frame_scores = torch.cat(scores).reshape(batch, num_frames)  # (B, F)
        details.update(frame_scores=frame_scores.detach(), frame_mean=frame_scores.detach().mean(dim=1))
        return RewardOutput(aggregate_frame_scores(frame_scores, self.aggregation, self.fraction), details)
