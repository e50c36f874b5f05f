"""The demo's fixed-seed measure of the learned reward: the same images' scores before and after."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from genalign.rewards.base import Reward, RewardOutput
from genalign.toy.demo import HackingCheck, demo_summary, hacking_check
from genalign.toy.evaluation import (
    SetEvaluation,
    eval_set,
    ground_truth_renders,
    paired_change_interval,
    pooled_within_std,
    reward_change,
)
from genalign.toy.hacking import _fixed_seed_lines
from genalign.toy.shapes_eval import evaluate


class MeanBrightness(Reward):
    """A reward that is the image's mean pixel: known scores for known images."""

    name = "mean_brightness"

    def score(self, images, prompts, **metadata):
        return RewardOutput(images.float().mean(dim=(1, 2, 3)))


def test_pooled_within_std_matches_a_hand_computation():
    scores = [1.0, 3.0, 10.0, 10.0, 16.0, 7.0]
    groups = ["a", "a", "b", "b", "b", "c"]  # c has one score: no within-prompt information
    # a: mean 2, squares 2; b: mean 12, squares 4 + 4 + 16 = 24; dof 1 + 2
    assert pooled_within_std(scores, groups) == pytest.approx(math.sqrt(26 / 3))
    assert math.isnan(pooled_within_std([1.0, 2.0], ["a", "b"]))


def test_reward_change_scores_the_same_images_before_and_after():
    items = eval_set("rl_train", images_per_category=4)
    n = len(items)
    generator = torch.Generator().manual_seed(0)
    levels_before = torch.rand(n, generator=generator)
    levels_after = (levels_before + 0.25).clamp(max=1.0)
    before = levels_before.view(n, 1, 1, 1).expand(n, 3, 8, 8).clone()
    after = levels_after.view(n, 1, 1, 1).expand(n, 3, 8, 8).clone()
    change = reward_change(MeanBrightness(), items, before, after, batch_size=5)
    b, a = levels_before.double().numpy(), levels_after.double().numpy()
    assert change.before == pytest.approx(b.mean(), abs=1e-6)
    assert change.after == pytest.approx(a.mean(), abs=1e-6)
    assert change.start_std == pytest.approx(b.std(ddof=1), abs=1e-6)
    expected = paired_change_interval(b, a, [p.category for p, _ in items])
    assert (change.change, change.low, change.high) == pytest.approx(expected, abs=1e-6)
    assert change.effect == pytest.approx(change.change / change.start_std)
    prompts = [p.caption for p, _ in items]
    assert change.within_std == pytest.approx(pooled_within_std(b, prompts), abs=1e-6) or (
        math.isnan(change.within_std) and math.isnan(pooled_within_std(b, prompts))
    )
    summary = change.summary("rl_train_reward")
    assert summary["rl_train_reward_effect_sd"] == pytest.approx(change.effect)
    assert all(np.isfinite(v) for k, v in summary.items() if k.endswith(("_before", "_after", "_change")))


def test_hacking_check_reports_the_within_group_effect():
    history = [
        {"step": i, "reward_mean": r, "reward_std": 0.4, "group_reward_std": 0.2, "monitor_shapes_eval": 0.5}
        for i, r in enumerate([0.2, 0.3, 0.4, 0.5, 0.6])
    ]
    check = hacking_check(history, 0.4, 0.5)
    # window 1: (0.6 - 0.2) / 0.4 across samples, / 0.2 within groups
    assert check.reward_effect == pytest.approx(1.0)
    assert check.reward_effect_within == pytest.approx(2.0)
    for row in history:
        del row["group_reward_std"]
    assert math.isnan(hacking_check(history, 0.4, 0.5).reward_effect_within)


def test_summary_carries_the_fixed_seed_reward_change():
    items = eval_set("rl_train", images_per_category=2)
    n = len(items)
    images = torch.rand(n, 3, 8, 8)
    check = HackingCheck(1.0, 0.5, 0.1, 1, "test", reward_effect_within=2.0)
    check.fixed_seed = reward_change(MeanBrightness(), items, images, images * 0.5)
    summary = demo_summary({}, check, [(0, 0.1)], 1.0)
    assert summary["reward_effect_within_prompt"] == 2.0
    assert summary["rl_train_reward_change"] < 0
    assert summary["rl_train_reward_before"] == pytest.approx(images.mean().item(), abs=1e-6)


def test_ground_truth_renders_satisfy_their_prompts_and_measure_the_reachable_gain():
    items = eval_set("rl_train", images_per_category=3)
    renders = ground_truth_renders(items)
    assert renders.shape == (len(items), 3, 48, 48) and 0.0 <= renders.min() and renders.max() <= 1.0
    assert torch.equal(renders, ground_truth_renders(items))  # the same pairs give the same renders
    assert evaluate(renders, [p.spec for p, _ in items])["image_accuracy"] >= 0.95  # the verifier agrees
    n = len(items)
    before = torch.full((n, 3, 8, 8), 0.2)
    before[: n // 2] = 0.4  # start: mean 0.3, std > 0
    after = before + 0.1
    truth = torch.full((n, 3, 8, 8), 0.5)
    change = reward_change(MeanBrightness(), items, before, after, ground_truth_images=truth)
    assert change.ground_truth == pytest.approx(0.5)
    assert change.gap_closed == pytest.approx(0.1 / (0.5 - change.before))  # half of the 0.2 gap
    assert change.ground_truth_effect == pytest.approx((0.5 - change.before) / change.start_std)
    summary = change.summary("rl_train_reward")
    assert summary["rl_train_reward_gap_closed"] == pytest.approx(0.5, abs=1e-6)
    # a ground truth the reward scores below the start: no gap to close
    low = reward_change(MeanBrightness(), items, before, after, ground_truth_images=truth * 0.1)
    assert low.gap_closed is None and low.ground_truth_effect < 0
    assert reward_change(MeanBrightness(), items, before, after).summary("r")["r_ground_truth"] is None


def test_per_category_effects_are_in_each_categorys_own_starting_sd():
    items = eval_set("rl_train", images_per_category=4)
    n = len(items)
    categories = [p.category for p, _ in items]
    generator = torch.Generator().manual_seed(3)
    levels = torch.rand(n, generator=generator) * 0.5
    gains = torch.tensor([0.05 * (1 + sorted(set(categories)).index(c)) for c in categories])
    before = levels.view(n, 1, 1, 1).expand(n, 3, 8, 8).clone()
    after = (levels + gains).view(n, 1, 1, 1).expand(n, 3, 8, 8).clone()
    truth = torch.full((n, 3, 8, 8), 0.9)
    change = reward_change(MeanBrightness(), items, before, after, ground_truth_images=truth)
    assert list(change.per_category) == list(dict.fromkeys(categories))
    for category, effect in change.per_category.items():  # against numpy on that category's images
        mask = np.asarray(categories) == category
        b = levels.double().numpy()[mask]
        gain = 0.05 * (1 + sorted(set(categories)).index(category))
        assert effect.count == mask.sum() == 4
        assert effect.effect == pytest.approx(gain / b.std(ddof=1), rel=1e-5)
        assert effect.ground_truth_effect == pytest.approx((0.9 - b.mean()) / b.std(ddof=1), rel=1e-5)
    summary = change.summary("rl_train_reward")["rl_train_reward_per_category"]
    assert summary["counting"]["effect_sd"] == pytest.approx(change.per_category["counting"].effect)
    lines = "\n".join(_fixed_seed_lines(change, SetEvaluation("rl_train", items, {}, {}), None))
    header = next(line for line in lines.splitlines() if line.startswith("| |"))
    assert header == "| | " + " | ".join(change.per_category) + " |"
    assert "| ground-truth renders |" in lines
    flat = reward_change(MeanBrightness(), items, after * 0 + 0.5, after)  # no spread at the start
    assert all(c.effect is None for c in flat.per_category.values())
