"""The learning-signal diagnostics the trainer logs each step (issue 21): checked by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from genalign.algorithms import group_reward_statistics
from genalign.trainers import build_trainer, load_recipe

ROOT = Path(__file__).resolve().parents[2]
TINY_SD = ROOT / "configs" / "tiny" / "ddpo_jpeg.yaml"


def test_group_reward_statistics_by_hand():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.5])
    out = group_reward_statistics(rewards, 2)  # groups (1,1) (1,0) (1,0) (.5,.5)
    assert out["zero_variance_groups"] == pytest.approx(2 / 4)
    assert out["group_reward_std"] == pytest.approx((0 + 0.5 + 0.5 + 0) / 4)
    ids = torch.tensor([3, 3, 3, 7, 7, 7, 9, 9])  # groups (1,1,1) (0,1,0) (.5,.5)
    out = group_reward_statistics(rewards, ids)
    middle = [0.0, 1.0, 0.0]
    std = math.sqrt(sum((x - 1 / 3) ** 2 for x in middle) / 3)
    assert out["zero_variance_groups"] == pytest.approx(2 / 3)
    assert out["group_reward_std"] == pytest.approx(std / 3)


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def test_step_metrics_report_gradient_norm_parameter_change_and_groups(tmp_path):
    overrides = [
        "sampling.num_inference_steps=4",
        "train.prompts_per_step=2",
        "train.group_size=2",
        "train.minibatch_size=4",
        "train.max_grad_norm=1e9",  # nothing clipped: the logged norm is the raw one
        "logging.progress=false",
        f"logging.run_dir={tmp_path}/run",
    ]
    trainer = build_trainer(load_recipe(TINY_SD, overrides), base_dir=TINY_SD.parent)
    norms = []
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):  # the gradient the optimiser sees, norm taken by hand
        norms.append(math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in trainer.parameters)))
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    batches = []
    collect = trainer.strategy.collect

    def recording_collect(*args, **kwargs):
        batches.append(collect(*args, **kwargs))
        return batches[-1]

    trainer.strategy.collect = recording_collect
    before = [p.detach().clone() for p in trainer.parameters]
    metrics = trainer.train_step(0)
    after = [p.detach() for p in trainer.parameters]

    assert len(norms) == 1
    assert metrics["grad_norm"] == pytest.approx(norms[0], rel=1e-5)
    squared = sum(float((a.double() - b.double()).pow(2).sum()) for a, b in zip(after, before))
    count = sum(p.numel() for p in before)
    assert metrics["param_change"] == pytest.approx(math.sqrt(squared / count), rel=1e-5)
    norm = math.sqrt(sum(float(b.double().pow(2).sum()) for b in before))
    assert metrics["param_change_rel"] == pytest.approx(math.sqrt(squared) / norm, rel=1e-5)
    rewards = batches[0].global_rewards.double().reshape(2, 2)  # two prompts, groups of two
    spread = (rewards - rewards.mean(1, keepdim=True)).pow(2).mean(1).sqrt()
    assert metrics["group_reward_std"] == pytest.approx(float(spread.mean()), rel=1e-6)
    assert metrics["zero_variance_groups"] == pytest.approx(float((spread == 0).double().mean()))
    # the error of the mean reward with each prompt's group as a cluster: two equal groups -> the
    # error of their two means
    assert metrics["reward_stderr"] == pytest.approx(float(rewards.mean(1).std()) / math.sqrt(2), rel=1e-5)
    for key in ("approx_kl", "clipfrac"):
        assert math.isfinite(metrics[key]), key


def test_parameter_change_can_be_switched_off(tmp_path):
    overrides = [
        "sampling.num_inference_steps=4",
        "train.prompts_per_step=2",
        "train.group_size=2",
        "train.minibatch_size=4",
        "logging.progress=false",
        "logging.param_change=false",
        f"logging.run_dir={tmp_path}/run",
    ]
    trainer = build_trainer(load_recipe(TINY_SD, overrides), base_dir=TINY_SD.parent)
    metrics = trainer.train_step(0)
    assert "param_change" not in metrics and "grad_norm" in metrics
