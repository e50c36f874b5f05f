"""Fixtures and helpers of the fault-injection tests: tiny SD recipe, small batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genalign.trainers import build_trainer, load_recipe

ROOT = Path(__file__).resolve().parents[2]
TINY_SD = ROOT / "configs" / "tiny" / "ddpo_jpeg.yaml"
SMALL = [
    "sampling.num_inference_steps=4",
    "train.prompts_per_step=2",
    "train.group_size=2",
    "train.minibatch_size=2",
    "train.timestep_fraction=0.5",
    "train.adam_weight_decay=0.0",
    "logging.progress=false",
]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def make_trainer(run_dir: Path, *overrides: str, recipe: Path = TINY_SD):
    """The tiny DDPO trainer writing to ``run_dir``."""
    config = load_recipe(recipe, [*SMALL, f"logging.run_dir={run_dir}", *overrides])
    return build_trainer(config, base_dir=recipe.parent)


def params(trainer) -> dict[str, torch.Tensor]:
    """Copies of the trainable parameters by name."""
    return {n: p.detach().clone() for n, p in trainer.policy.named_trainable_parameters().items()}
