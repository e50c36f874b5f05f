"""The tiny DDPO recipe at test size, shared by the trainer tests that build it end to end."""

from __future__ import annotations

from pathlib import Path

import torch

from genalign.trainers import build_trainer, load_recipe

ROOT = Path(__file__).resolve().parents[2]
TINY_SD = ROOT / "configs" / "tiny" / "ddpo_jpeg.yaml"
SMALL = [  # 4 samples in minibatches of 2: two optimizer steps per training step
    "sampling.num_inference_steps=4",
    "train.prompts_per_step=2",
    "train.group_size=2",
    "train.minibatch_size=2",
    "train.timestep_fraction=0.5",
    "train.adam_weight_decay=0.0",
    "logging.progress=false",
]


def make_trainer(folder: Path, *overrides: str, recipe: Path = TINY_SD):
    """The trainer of ``recipe`` (the tiny DDPO one) at test size, writing to ``folder/run``."""
    config = load_recipe(recipe, [*SMALL, f"logging.run_dir={folder}/run", *overrides])
    return build_trainer(config, base_dir=recipe.parent)


def params(trainer) -> dict[str, torch.Tensor]:
    """Copies of the trainable parameters by name."""
    return {n: p.detach().clone() for n, p in trainer.policy.named_trainable_parameters().items()}
