"""`train.svg.rollout: branch` on the shipped toy SVG writer with the oracle reward: each sample is
a one-token branch off its group's greedy answer, trained on that token alone against the greedy
answer's reward (genalign.trainers.strategies.svg_branch)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from genalign.config import ConfigError
from genalign.policies.language_branch import BranchSampler
from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.strategies.svg_branch import branch_token_mask

from .svg_helpers import ONE_STEP, greedy_answers_by_hand, greedy_baseline_advantages

ROOT = Path(__file__).resolve().parents[2]
ORACLE_RECIPE = ROOT / "configs" / "toy" / "rlrf_im2svg_oracle.yaml"


def branch_trainer(tmp_path, *overrides: str):
    """The oracle recipe with branch rollouts: one step of 2 scenes x 4 branches."""
    small = ["train.svg.rollout=branch", *ONE_STEP]
    config = load_recipe(ORACLE_RECIPE, [f"logging.run_dir={tmp_path}/run", *small, *overrides])
    return build_trainer(config, base_dir=ROOT)


def test_branch_token_mask_by_hand():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    kept = branch_token_mask(mask, torch.tensor([2, 0, -1]))
    assert kept.tolist() == [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]


def test_a_branch_step_trains_one_token_per_sample_against_the_greedy_answer(tmp_path):
    trainer = branch_trainer(tmp_path)
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    trajectory, train = batch.trajectory, trainer.config.train
    assert torch.equal(trajectory.group_ids, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))
    assert trajectory.completion_mask.sum(dim=1).tolist() == [1] * 8  # one trained token each
    # each group's greedy answer, written here by the argmax sampler, scored by the verifier
    answers, expected = greedy_answers_by_hand(trainer, temperature=1.1, sampler=BranchSampler())
    torch.testing.assert_close(batch.sample_details["greedy_reward"], expected.repeat_interleave(4))
    # every branch copies its group's greedy answer up to the trained token, and differs there
    reference = answers.completion_ids.repeat_interleave(4, dim=0)
    for b in range(8):
        position = int(trajectory.completion_mask[b].nonzero())
        assert torch.equal(trajectory.completion_ids[b, :position], reference[b, :position])
        assert trajectory.completion_ids[b, position] != reference[b, position]
    # advantages: the reward minus the greedy answer's, over the group's std (GRPO's scale), clipped
    want = greedy_baseline_advantages(batch.rewards, expected, 4, train.advantage_clip)
    torch.testing.assert_close(batch.advantages, want)
    better = float((batch.rewards > expected.repeat_interleave(4)).float().mean())
    assert batch.metrics["branch_better_fraction"] == pytest.approx(better)
    assert batch.metrics["greedy_reward_mean"] == pytest.approx(float(expected.mean()))
    history = trainer.train()
    assert len(history) == 1 and math.isfinite(history[0]["reward_mean"])
    assert 0.0 <= history[0]["branch_position"] < 1.0


def test_the_branch_option_is_checked():
    with pytest.raises(ConfigError, match="train.svg.rollout"):
        load_recipe(ORACLE_RECIPE, ["train.svg.rollout=tree"])
    with pytest.raises(ConfigError, match="leave train.svg.credit at 'sequence'"):
        load_recipe(
            ORACLE_RECIPE,
            ["train.svg.rollout=branch", "train.svg.baseline=greedy", "train.svg.credit=divergence"],
        )
