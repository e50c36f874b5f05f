"""Learning-rate schedules: factors against hand numbers and torch's own LinearLR, and the
trainer's optimiser following the recipe's schedule."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genalign.algorithms.schedules import learning_rate_factor
from genalign.config import ConfigError
from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def test_factors_on_hand_numbers():
    assert [learning_rate_factor(n) for n in range(3)] == [1.0, 1.0, 1.0]
    assert [learning_rate_factor(n, schedule="linear", decay_steps=4) for n in range(6)] == [
        1.0, 0.75, 0.5, 0.25, 0.0, 0.0,
    ]  # fmt: skip
    # warm-up (n + 1) / 2, then the linear decay over the 4 - 2 steps after it: 1 - (n - 2) / 2
    assert [learning_rate_factor(n, 2, "linear", 4) for n in range(6)] == [0.5, 1.0, 1.0, 0.5, 0.0, 0.0]
    with pytest.raises(ValueError, match="decay_steps"):
        learning_rate_factor(0, schedule="linear")
    with pytest.raises(ValueError, match="schedule"):
        learning_rate_factor(0, schedule="cosine")


def test_linear_schedule_equals_torch_linear_lr_to_zero():
    """RLCM's optimiser: Adam with LinearLR(start_factor=1, end_factor=0, total_iters)."""
    ours = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)
    theirs = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)
    ours_schedule = torch.optim.lr_scheduler.LambdaLR(
        ours, lambda n: learning_rate_factor(n, 0, "linear", 30)
    )
    theirs_schedule = torch.optim.lr_scheduler.LinearLR(
        theirs, start_factor=1.0, end_factor=0.0, total_iters=30
    )
    for _ in range(40):
        assert ours_schedule.get_last_lr()[0] == pytest.approx(theirs_schedule.get_last_lr()[0], abs=1e-12)
        ours.step(), theirs.step(), ours_schedule.step(), theirs_schedule.step()


def test_planned_optimizer_steps_and_config_checks():
    config = TrainConfig(
        num_steps=10, prompts_per_step=4, group_size=4, minibatch_size=4, gradient_accumulation_steps=3
    )
    assert config.planned_optimizer_steps == 10 * 2  # 4 minibatches, an update every 3 and one for the rest
    config = TrainConfig(
        num_steps=5, lr_schedule="linear", prompts_per_step=4, group_size=2, minibatch_size=8, inner_epochs=2
    )
    assert config.planned_optimizer_steps == 10 and config.learning_rate_factor(5) == 0.5
    with pytest.raises(ConfigError, match="train.lr_decay_steps"):
        TrainConfig(lr_decay_steps=0)


def test_the_planned_steps_count_the_q_hawkeye_copies_and_b2diffurl_needs_a_horizon():
    from genalign.trainers.method_config import QHawkeyeConfig

    shape = {"num_steps": 4, "prompts_per_step": 4, "group_size": 8, "minibatch_size": 8}
    shape |= {"gradient_accumulation_steps": 4, "strategy": "q_hawkeye", "method": "q_hawkeye"}
    plain = TrainConfig(**shape)
    copies = TrainConfig(**shape, q_hawkeye=QHawkeyeConfig(copy_weight=0.5))
    # the copies double the trained batch (8 minibatches a step): 8 optimiser steps, not 4, so a
    # cosine schedule over the run does not reach 0 halfway
    assert (plain.planned_optimizer_steps, copies.planned_optimizer_steps) == (4, 8)
    b2diffurl = {"strategy": "b2diffurl", "method": "b2diffurl", "lr_schedule": "cosine"}
    b2diffurl |= {"prompts_per_step": 2, "group_size": 1, "minibatch_size": 2}
    with pytest.raises(ConfigError, match="train.lr_decay_steps: a cosine schedule with b2diffurl"):
        TrainConfig(**b2diffurl)
    assert TrainConfig(**b2diffurl, lr_decay_steps=10).lr_decay_steps == 10


def test_trainer_optimizer_follows_the_recipe_schedule(tmp_path, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path / "tiny-cache"))
    recipe = ROOT / "configs" / "tiny" / "ddpo_jpeg.yaml"
    overrides = ["train.lr_schedule=linear", "train.lr_decay_steps=4", f"logging.run_dir={tmp_path}/run"]
    trainer = build_trainer(load_recipe(recipe, overrides), base_dir=recipe.parent)
    base = trainer.config.train.learning_rate
    seen = []
    for _ in range(5):
        seen.append(trainer.optimizer.param_groups[0]["lr"] / base)
        trainer.lr_scheduler.step()
    assert seen == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
