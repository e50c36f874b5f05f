"""HPS v2 / v2.1 (Wu et al. 2023): open_clip checkpoints in the official and other layouts."""

from __future__ import annotations

import pytest
import torch

from genalign.rewards import load_reward

from .helpers import PROMPTS, open_clip_cosine, uint8_images


@pytest.mark.parametrize("layout", ["official", "bare", "ddp", "safetensors"])
def test_checkpoint_layouts_score_the_cosine(tiny_open_clip, hps_checkpoints, layout):
    images = uint8_images(4, 32, 32, seed=8)
    reward = load_reward(
        "hpsv2",
        checkpoint=str(hps_checkpoints[layout]),
        model=tiny_open_clip.name,
        model_config=tiny_open_clip.config,
    )
    expected = open_clip_cosine(tiny_open_clip, images, PROMPTS)
    torch.testing.assert_close(reward(images, PROMPTS).scores, expected, atol=1e-5, rtol=0)


def test_missing_checkpoint_names_the_file(tiny_open_clip, tmp_path):
    missing = tmp_path / "HPS_v2.1_compressed.pt"
    with pytest.raises(FileNotFoundError, match="HPS_v2.1_compressed.pt"):
        load_reward("hpsv2", checkpoint=str(missing), model=tiny_open_clip.name)


def test_unknown_version():
    with pytest.raises(ValueError, match="v2.1"):
        load_reward("hpsv2", version="v3")
