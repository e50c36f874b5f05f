"""Tiny reward models of the real architectures, saved in the official checkpoint layouts.

Built once per test session and loaded by the tests through the same code path users take
(``load_reward(name, checkpoint=..., model=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from genalign.rewards.aesthetic import AestheticMLP
from genalign.tiny.clip import OPEN_CLIP_WEIGHTS_NAME, TINY_OPEN_CLIP_NAME, clip_model, open_clip_model

from .helpers import uint8_images


@dataclass
class TinyTransformersClip:
    folder: Path
    model: Any
    processor: Any


@dataclass
class TinyOpenClip:
    folder: Path
    weights: Path
    name: str
    model: Any
    preprocess: Any
    tokenizer: Any
    config: dict


@pytest.fixture(scope="session")
def tiny_hf_clip(tmp_path_factory) -> TinyTransformersClip:
    """A transformers CLIPModel folder (the PickScore_v1 / openai CLIP layout), 32-px images."""
    folder = tmp_path_factory.mktemp("tiny_hf_clip")
    model, processor = clip_model(seed=0, save_to=folder)
    return TinyTransformersClip(folder, model, processor)


@pytest.fixture(scope="session")
def tiny_open_clip(tmp_path_factory) -> TinyOpenClip:
    """A custom tiny open_clip architecture with its weights in open_clip's layout."""
    folder = tmp_path_factory.mktemp("tiny_open_clip")
    model, preprocess, tokenizer, config = open_clip_model(seed=1, save_to=folder)
    return TinyOpenClip(
        folder, folder / OPEN_CLIP_WEIGHTS_NAME, TINY_OPEN_CLIP_NAME, model, preprocess, tokenizer, config
    )


@pytest.fixture(scope="session")
def hps_checkpoints(tmp_path_factory, tiny_open_clip) -> dict[str, Path]:
    """The tiny open_clip weights saved as HPS v2 ships them ({"state_dict": ...}) and as variants."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("hps")
    state = {key: value.clone() for key, value in tiny_open_clip.model.state_dict().items()}
    paths = {
        "official": folder / "HPS_v2.1_compressed.pt",
        "bare": folder / "hps_bare.pt",
        "ddp": folder / "hps_ddp.pt",
        "safetensors": folder / "hps.safetensors",
    }
    torch.save({"state_dict": state}, paths["official"])
    torch.save(state, paths["bare"])
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, paths["ddp"])
    save_file(state, str(paths["safetensors"]))
    return paths


@pytest.fixture(scope="session")
def aesthetic_checkpoint(tmp_path_factory, tiny_hf_clip) -> Path:
    """An aesthetic-predictor head for the tiny CLIP's 16-d embeddings, official key layout (.pth)."""
    folder = tmp_path_factory.mktemp("aesthetic")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        head = AestheticMLP(input_size=tiny_hf_clip.model.config.projection_dim)
    path = folder / "sac+logos+ava1-l14-linearMSE.pth"
    torch.save(head.state_dict(), path)
    return path


@pytest.fixture
def images() -> torch.Tensor:
    """Four 40x48 images (non-square, not the models' 32 px: the resize and crop are exercised)."""
    return uint8_images(4, 40, 48)
