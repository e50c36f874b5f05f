"""Class names spell acronyms in upper case (CLIP, JPEG, LoRA; #22). The old spellings stay
importable, from the defining module and from its package, as aliases of the same classes."""

from __future__ import annotations

import importlib

import pytest

ALIASES = [
    ("genalign.rewards.clip_models", "ClipEmbedder", "CLIPEmbedder"),
    ("genalign.rewards.clip_models", "OpenClipEmbedder", "OpenCLIPEmbedder"),
    ("genalign.rewards.clip_models", "TransformersClipEmbedder", "TransformersCLIPEmbedder"),
    ("genalign.rewards.clip_score", "ClipScoreReward", "CLIPScoreReward"),
    ("genalign.rewards.iqa", "ClipIQAReward", "CLIPIQAReward"),
    ("genalign.rewards.jpeg", "JpegCompressibilityReward", "JPEGCompressibilityReward"),
    ("genalign.rewards.jpeg", "JpegIncompressibilityReward", "JPEGIncompressibilityReward"),
    ("genalign.rewards", "ClipScoreReward", "CLIPScoreReward"),
    ("genalign.rewards", "ClipIQAReward", "CLIPIQAReward"),
    ("genalign.rewards", "ClipEmbedder", "CLIPEmbedder"),
    ("genalign.rewards", "JpegCompressibilityReward", "JPEGCompressibilityReward"),
    ("genalign.policies.base", "LoraSpec", "LoRASpec"),
    ("genalign.policies", "LoraSpec", "LoRASpec"),
    ("genalign.trainers.config", "LoraConfig", "LoRAConfig"),
    ("genalign.toy.reward_models.clip", "ClipRecipe", "CLIPRecipe"),
    ("genalign.toy.reward_models", "ClipRecipe", "CLIPRecipe"),
]


@pytest.mark.parametrize(("module", "old", "new"), ALIASES)
def test_old_name_is_the_new_class(module: str, old: str, new: str) -> None:
    namespace = importlib.import_module(module)
    assert getattr(namespace, old) is getattr(namespace, new)


def test_registry_names_are_unchanged() -> None:
    from genalign.rewards import CLIPScoreReward, JPEGCompressibilityReward
    from genalign.rewards.base import REWARDS

    assert REWARDS.get("clip") is CLIPScoreReward
    assert REWARDS.get("jpeg_compressibility") is JPEGCompressibilityReward
