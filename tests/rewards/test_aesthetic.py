"""LAION improved aesthetic predictor: the official MLP layout on normalised CLIP embeddings."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from genalign.rewards import AestheticMLP, load_reward

from .helpers import to_pil, transformers_features, uint8_images

# state-dict keys of sac+logos+ava1-l14-linearMSE.pth (Linear layers at Sequential indices 0, 2, 4, 6, 7)
OFFICIAL_KEYS = {f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias")}


def reference_head(state: dict[str, torch.Tensor]) -> nn.Sequential:
    """The official architecture written out independently (ReLUs commented out upstream)."""
    dim = state["layers.0.weight"].shape[1]
    head = nn.Sequential(
        nn.Linear(dim, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
        nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1),
    )  # fmt: skip
    head.load_state_dict({k.removeprefix("layers."): v for k, v in state.items()})
    return head.eval()


def test_head_has_the_official_layout():
    head = AestheticMLP()
    assert set(head.state_dict()) == OFFICIAL_KEYS
    assert head.layers[0].in_features == 768 and head.layers[-1].out_features == 1


def test_score_formula(tiny_hf_clip, aesthetic_checkpoint):
    images = uint8_images(3, 32, 32, seed=9)
    reward = load_reward("aesthetic", checkpoint=str(aesthetic_checkpoint), model=str(tiny_hf_clip.folder))
    image_features, _ = transformers_features(tiny_hf_clip, images)
    head = reference_head(torch.load(aesthetic_checkpoint, weights_only=True))
    with torch.no_grad():
        expected = head(F.normalize(image_features, dim=-1)).squeeze(-1)
    torch.testing.assert_close(reward(images, None).scores, expected, atol=1e-5, rtol=0)


def test_safetensors_head_and_open_clip_backend(tiny_open_clip, aesthetic_checkpoint, tmp_path):
    state = torch.load(aesthetic_checkpoint, weights_only=True)
    path = tmp_path / "aesthetic.safetensors"
    save_file(state, str(path))
    reward = load_reward(
        "aesthetic", checkpoint=str(path), backend="open_clip", model=tiny_open_clip.name,
        pretrained=str(tiny_open_clip.weights),
    )  # fmt: skip
    images = uint8_images(2, 32, 32, seed=10)
    pixels = torch.stack([tiny_open_clip.preprocess(to_pil(image)) for image in images])
    with torch.no_grad():
        expected = reference_head(state)(
            F.normalize(tiny_open_clip.model.encode_image(pixels), dim=-1)
        ).squeeze(-1)
    torch.testing.assert_close(reward(images).scores, expected, atol=1e-5, rtol=0)


def test_embedding_size_mismatch(tiny_hf_clip, tmp_path):
    path = tmp_path / "head768.pth"
    torch.save(AestheticMLP(768).state_dict(), path)
    with pytest.raises(ValueError, match="768"):
        load_reward("aesthetic", checkpoint=str(path), model=str(tiny_hf_clip.folder))


def test_missing_checkpoint_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="linearMSE.pth"):
        load_reward("aesthetic", checkpoint=str(tmp_path / "sac+logos+ava1-l14-linearMSE.pth"))


def test_not_an_aesthetic_checkpoint(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"weight": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match="layers.0.weight"):
        load_reward("aesthetic", checkpoint=str(path))
