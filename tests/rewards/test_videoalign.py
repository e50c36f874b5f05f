"""VideoAlign (VideoReward) on a tiny Qwen2-VL: scores against a hand computation, frame sampling,
padding, grayscale input, dimension choice, the official checkpoint layouts and bad input."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms.functional import InterpolationMode, resize

from genalign.rewards import list_rewards, load_reward
from genalign.rewards.videoalign import VIDEOALIGN_PROMPT, VideoAlignReward, sample_frames
from genalign.tiny.qwen_rm import qwen2_vl_base, videoreward_checkpoint

from .helpers import qwen_hidden_by_hand

PROMPTS = ["a red circle rolls", "two blue squares slide to the left", "a star"]
STATS = {"VQ": (0.5, 2.0), "MQ": (-1.0, 4.0), "TA": (0.25, 0.5)}  # three different (mean, std)
PIXELS = {"min_pixels": 64, "max_pixels": 512}  # 24 x 32 frames -> 16 x 24 on the 8-px grid


def _videos(batch: int, frames: int = 8, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, frames, 3, 24, 32), generator=generator).float() / 255


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A base folder and two VideoReward folders: LoRA + 3-output head, full + 1-output head."""
    folder = tmp_path_factory.mktemp("videoreward")
    base, processor = qwen2_vl_base(save_to=folder / "base")
    inference = {f"{d}_{k}": v for d, (m, s) in STATS.items() for k, v in (("mean", m), ("std", s))}
    lora = videoreward_checkpoint(
        base, processor, folder / "lora", folder / "base", output_dim=3, inference_config=inference
    )
    full = videoreward_checkpoint(
        base, processor, folder / "full", folder / "base", output_dim=1, layout="full"
    )
    return folder, lora, full


def _reward(model, **options) -> VideoAlignReward:
    return VideoAlignReward(model=model, normalization=STATS, batch_size=3, **{**PIXELS, **options})


def _by_hand(reference, video: torch.Tensor, prompt: str) -> torch.Tensor:
    """Raw (VQ, MQ, TA) without the reward's code: frames 0, 2, 5, 7 (8 frames at 16 fps read at
    2 fps: 4 frames, the minimum), torchvision's bicubic resize to 16 x 24, the chat template, the
    backbone with positions 0..L-1 and the head at the three tokens."""
    frames = (video[[0, 2, 5, 7]] * 255).round().to(torch.uint8)
    frames = resize(frames, [16, 24], interpolation=InterpolationMode.BICUBIC, antialias=True)
    text = VIDEOALIGN_PROMPT.format(text_prompt=prompt)
    message = {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}
    input_ids, hidden = qwen_hidden_by_hand(reference, message, videos=[frames], do_resize=False)
    tokenizer = reference.processor.tokenizer
    rows = []
    for k, token in enumerate(["<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>"]):
        index = (input_ids == tokenizer.convert_tokens_to_ids(token)).nonzero().item()
        out = hidden[index] @ reference.head.weight.T  # (out,)
        rows.append(out[k] if out.numel() == 3 else out[0])
    return torch.stack(rows)


def test_sample_frames_follows_the_official_rule():
    assert sample_frames(8, video_fps=16, fps=2) == [0, 2, 5, 7]  # 1 frame by fps, clamped to 4
    assert sample_frames(81, video_fps=16, fps=2) == torch.linspace(0, 80, 10).round().long().tolist()
    assert sample_frames(3, video_fps=16, fps=2) == [0, 2]  # fewer than 4: all, rounded to even
    assert (
        sample_frames(81, video_fps=16, target_frames=7) == torch.linspace(0, 80, 8).round().long().tolist()
    )


@pytest.mark.parametrize("which", ["lora", "full"])
def test_scores_equal_the_hand_computation(tiny, which):
    reference = tiny[1] if which == "lora" else tiny[2]
    videos = _videos(2, seed=1)
    out = _reward(reference)(videos, PROMPTS[:2])
    for i in range(2):
        raw = _by_hand(reference, videos[i], PROMPTS[i])
        normalised = [(raw[k] - STATS[d][0]) / STATS[d][1] for k, d in enumerate(("VQ", "MQ", "TA"))]
        for k, d in enumerate(("VQ", "MQ", "TA")):
            torch.testing.assert_close(out.details[f"raw_{d}"][i], raw[k], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out.details[d][i], normalised[k], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.scores[i], sum(normalised), atol=1e-5, rtol=1e-5)
    assert out.details["num_frames"] == 4


def test_batch_equals_rows_one_at_a_time(tiny):
    reward = _reward(tiny[1])
    videos = _videos(3, seed=2)
    rows = torch.cat([reward(videos[i : i + 1], [PROMPTS[i]]).scores for i in range(3)])
    out = reward(videos, PROMPTS)  # prompts of three lengths: left padding
    torch.testing.assert_close(out.scores, rows, atol=1e-5, rtol=1e-5)
    assert out.scores.unique().numel() == 3


def test_dimension_picks_one_score(tiny):
    videos = _videos(2, seed=3)
    details = _reward(tiny[1])(videos, PROMPTS[:2]).details
    for name, key in (("VQ", "VQ"), ("mq", "MQ"), ("TA", "TA"), ("Overall", "overall")):
        torch.testing.assert_close(_reward(tiny[1], dimension=name)(videos, PROMPTS[:2]).scores, details[key])
    raw = _reward(tiny[1], normalize=False, dimension="overall")(videos, PROMPTS[:2])
    torch.testing.assert_close(
        raw.scores, raw.details["raw_VQ"] + raw.details["raw_MQ"] + raw.details["raw_TA"]
    )


def test_grayscale_changes_mq_not_the_input(tiny):
    colour = _videos(2, seed=4)
    kept = colour.clone()
    rgb = _reward(tiny[1], dimension="MQ")(colour, PROMPTS[:2]).scores
    gray = _reward(tiny[1], dimension="MQ", grayscale=True)(colour, PROMPTS[:2]).scores
    assert torch.equal(colour, kept) and gray.shape == rgb.shape == (2,)
    assert (gray - rgb).abs().min() > 1e-4
    # the luma of a gray video is the video itself: grayscale leaves it as it is
    luma = (0.299 * colour[:, :, :1] + 0.587 * colour[:, :, 1:2] + 0.114 * colour[:, :, 2:]).expand_as(colour)
    luma = (luma * 255).round() / 255
    torch.testing.assert_close(
        _reward(tiny[1], dimension="MQ", grayscale=True)(luma, PROMPTS[:2]).scores,
        _reward(tiny[1], dimension="MQ")(luma, PROMPTS[:2]).scores,
    )
    torch.testing.assert_close(gray, _reward(tiny[1], dimension="MQ")(luma, PROMPTS[:2]).scores)


@pytest.mark.parametrize("which", ["lora", "full"])
def test_loads_the_official_folder_layout(tiny, which):
    folder, lora, full = tiny
    videos = _videos(2, seed=5)
    if which == "lora":  # the folder's inference_config holds STATS
        expected = _reward(lora)(videos, PROMPTS[:2])
        loaded = VideoAlignReward(checkpoint=folder / "lora", **PIXELS)(videos, PROMPTS[:2])
    else:  # no inference_config: scores stay raw, as the official inference leaves them
        expected = _reward(full, normalize=False)(videos, PROMPTS[:2])
        loaded = load_reward("videoalign", checkpoint=str(folder / "full"), **PIXELS)(videos, PROMPTS[:2])
    torch.testing.assert_close(loaded.scores, expected.scores, atol=1e-5, rtol=1e-5)
    for key in ("raw_VQ", "raw_MQ", "raw_TA"):
        torch.testing.assert_close(loaded.details[key], expected.details[key], atol=1e-5, rtol=1e-5)
    assert "videoalign" in list_rewards()


def test_bad_input_raises_one_line_errors(tiny, tmp_path):
    reward = _reward(tiny[1])
    cases = [
        (lambda: reward(torch.rand(2, 8, 4, 24, 32), PROMPTS[:2]), r"3 channels.*\(16, 4, 24, 32\)"),
        (lambda: reward(torch.rand(2, 3, 24, 32), PROMPTS[:2]), r"\[B, F, 3, H, W\], got \(2, 3, 24, 32\)"),
        (lambda: reward(torch.rand(1, 1, 3, 24, 32), PROMPTS[:1]), "at least 2 frames, got 1"),
        (lambda: _reward(tiny[1], dimension="motion"), "dimension must be one of .* got 'motion'"),
        (
            lambda: VideoAlignReward(model=tiny[1], normalization={"VQ": (0, 1)}),
            r"normalization lacks \['MQ', 'TA'\]",
        ),
        (lambda: VideoAlignReward(checkpoint=tmp_path / "nothing"), "checkpoint folder not found: .*nothing"),
    ]
    for call, message in cases:
        with pytest.raises((ValueError, FileNotFoundError), match=message) as error:
            call()
        assert "\n" not in str(error.value)
