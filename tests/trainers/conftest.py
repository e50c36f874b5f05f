"""Fixtures shared by the trainer tests."""

from __future__ import annotations

import os

import pytest

from genalign.policies import LoRASpec, load_policy


@pytest.fixture(scope="module")
def sd_policy(tmp_path_factory):
    """The tiny SD policy with a rank-4 LoRA, one per test module (the loss tests set its LoRA
    weights themselves)."""
    os.environ["GENALIGN_TINY_CACHE"] = str(tmp_path_factory.getbasetemp() / "tiny-cache")
    return load_policy("sd", "tiny:sd", lora=LoRASpec(rank=4))
