"""Video rewards: per-frame scoring of an image reward, aggregated as Astrolabe does."""

from __future__ import annotations

import pytest
import torch

from genalign.rewards import Reward, RewardOutput, load_reward
from genalign.rewards.video import VideoReward, aggregate_frame_scores, per_reward_ranks


class Brightness(Reward):
    """Mean pixel value per image, plus the image's own prompt length and a metadata value."""

    name = "brightness"

    def score(self, images, prompts, offsets=None):
        scores = images.mean(dim=(1, 2, 3)) + torch.tensor([len(p) for p in prompts], dtype=torch.float32)
        if offsets is not None:
            scores = scores + torch.as_tensor(offsets, dtype=torch.float32)
        return RewardOutput(scores, {"calls": 1})


def video_of(levels: list[list[float]]) -> torch.Tensor:
    """``[B, F, 3, 4, 4]`` frames of constant brightness ``levels[b][f]``."""
    return torch.tensor(levels)[:, :, None, None, None].expand(-1, -1, 3, 4, 4).contiguous()


def test_aggregations_against_hand_computed_values():
    scores = torch.tensor([[1.0, 5.0, 3.0, 2.0, 4.0, 0.0, 6.0, 7.0, 8.0, 9.0], [2.0] * 9 + [-1.0]])
    # top 30% of 10 frames: the best 3 (9, 8, 7) and (2, 2, 2)
    assert aggregate_frame_scores(scores, "top_fraction", 0.3).tolist() == [8.0, 2.0]
    assert aggregate_frame_scores(scores, "mean").tolist() == pytest.approx([4.5, 1.7])
    assert aggregate_frame_scores(scores, "min").tolist() == [0.0, -1.0]
    # int(F * fraction) floors, at least one frame: 4 frames x 0.3 -> the best 1; 7 x 0.3 -> 2
    assert aggregate_frame_scores(torch.tensor([[1.0, 4.0, 2.0, 3.0]])).tolist() == [4.0]
    assert aggregate_frame_scores(torch.tensor([[1.0, 4.0, 2.0, 3.0, 0.0, 6.0, 5.0]])).tolist() == [5.5]
    assert aggregate_frame_scores(torch.tensor([[1.0, 4.0]]), "top_fraction", 0.3).tolist() == [4.0]
    with pytest.raises(ValueError, match="aggregation"):
        aggregate_frame_scores(scores, "median")


def test_video_reward_scores_every_frame_with_its_prompt_and_metadata():
    videos = video_of([[0.1, 0.9, 0.5], [0.2, 0.4, 0.3]])
    reward = VideoReward(Brightness(), aggregation="mean", frame_batch_size=2)
    out = reward(videos, ["ab", "abcd"], offsets=[10.0, 20.0])
    frames = torch.tensor([[12.1, 12.9, 12.5], [24.2, 24.4, 24.3]])
    torch.testing.assert_close(out.details["frame_scores"], frames)
    torch.testing.assert_close(out.scores, frames.mean(dim=1))
    assert out.details["frames/calls"] == 3  # 6 frames in chunks of 2
    top = VideoReward(Brightness(), aggregation="top_fraction", fraction=0.5)(videos, ["", ""])
    torch.testing.assert_close(top.scores, torch.tensor([0.9, 0.4]))
    worst = VideoReward(Brightness(), aggregation="min")(videos, ["", ""])
    torch.testing.assert_close(worst.scores, torch.tensor([0.1, 0.2]))


def test_a_registered_image_reward_becomes_a_video_reward_and_ensembles_expose_ranks():
    generator = torch.Generator().manual_seed(0)
    videos = torch.rand(3, 4, 3, 16, 16, generator=generator)
    video = load_reward("video", reward="jpeg_compressibility")
    image = load_reward("jpeg_compressibility")
    per_frame = image(videos.flatten(0, 1), [""] * 12).scores.reshape(3, 4)
    torch.testing.assert_close(video(videos, ["", "", ""]).scores, per_frame.max(dim=1).values)
    ensemble = load_reward(
        "ensemble",
        members=[
            {"reward": VideoReward(Brightness(), aggregation="mean"), "key": "bright"},
            {"name": "video", "kwargs": {"reward": "jpeg_compressibility"}, "key": "jpeg"},
        ],
    )
    out = ensemble(videos, ["", "", ""])
    ranks = per_reward_ranks(out.details, ["bright", "jpeg"])
    brightness = videos.mean(dim=(1, 2, 3, 4))
    expected = torch.empty(3, dtype=torch.long)
    expected[brightness.argsort(descending=True)] = torch.arange(1, 4)
    assert ranks["bright"].tolist() == expected.tolist()
    with pytest.raises(KeyError, match="missing"):
        per_reward_ranks(out.details, ["missing"])


def test_bad_inputs_fail_with_a_message():
    with pytest.raises(ValueError, match=r"videos must be a torch.Tensor \[B, F, 3, H, W\]"):
        VideoReward(Brightness())(torch.rand(2, 3, 8, 8), ["", ""])
    with pytest.raises(ValueError, match="aggregation must be one of"):
        VideoReward(Brightness(), aggregation="median")
    with pytest.raises(ValueError, match="fraction must lie in"):
        VideoReward(Brightness(), fraction=0.0)
