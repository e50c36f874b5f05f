"""Non-finite rewards, losses and weights never reach the optimizer or a checkpoint (issue 23.1)."""

from __future__ import annotations

import pytest
import torch

from genalign.rewards import Reward, RewardOutput
from genalign.trainers.checkpoint import latest_checkpoint
from genalign.trainers.guards import NonFiniteWeightsError

from .conftest import make_trainer, params


class PoisonedReward(Reward):
    """Scores by mean brightness, with sample 0 replaced by ``value`` (NaN, +inf or -inf)."""

    name = "poisoned_test"

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def score(self, images, prompts, **metadata):
        scores = images.mean(dim=(1, 2, 3))
        scores[0] = self.value
        return RewardOutput(scores)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "+inf", "-inf"])
def test_nonfinite_reward_skips_the_step_and_is_counted(tmp_path, value):
    trainer = make_trainer(tmp_path / "run")
    trainer.reward = PoisonedReward(value)
    before = params(trainer)
    tracker_before = trainer.strategy.tracker.state_dict()
    metrics = trainer.train_step(0)
    assert metrics["skipped"] and "not finite" in metrics["skip_reason"], metrics.get("skip_reason")
    assert metrics["nonfinite_rewards"] == 1
    assert all(torch.equal(before[n], p) for n, p in params(trainer).items())
    assert trainer.optimizer_steps == 0
    # the stat tracker's history never saw the poisoned rewards
    assert trainer.strategy.tracker.state_dict() == tracker_before


def test_finite_rewards_report_zero_nonfinite(tmp_path):
    metrics = make_trainer(tmp_path / "run").train_step(0)
    assert metrics["nonfinite_rewards"] == 0 and metrics["nonfinite_grad_steps"] == 0


def test_nonfinite_loss_skips_the_optimizer_step(tmp_path):
    trainer = make_trainer(tmp_path / "run", "train.advantage=batch")
    loss = trainer.loss

    def nan_loss(*args, **kwargs):
        value, info = loss(*args, **kwargs)
        return value * float("nan"), info

    trainer.loss = nan_loss
    before = params(trainer)
    metrics = trainer.train_step(0)
    assert metrics["nonfinite_grad_steps"] >= 1
    assert trainer.optimizer_steps == 0
    assert all(torch.equal(before[n], p) for n, p in params(trainer).items())
    assert all(
        torch.isfinite(state).all()
        for s in trainer.optimizer.state.values()
        for state in s.values()
        if torch.is_tensor(state)
    )


def test_no_checkpoint_is_written_from_nonfinite_weights(tmp_path):
    trainer = make_trainer(tmp_path / "run")
    trainer.step = 1
    first = trainer.save()
    name, parameter = next(iter(trainer.policy.named_trainable_parameters().items()))
    with torch.no_grad():
        parameter.view(-1)[0] = float("inf")
    trainer.step = 2
    with pytest.raises(NonFiniteWeightsError, match="NaN or inf"):
        trainer.save()
    assert latest_checkpoint(trainer.run_dir) == first
