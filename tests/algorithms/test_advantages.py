from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from genalign.algorithms.advantages import PerPromptStatTracker, clip_advantages, group_advantages

# ---------------------------------------------------------------------------- group_advantages
# rewards [1, 3, 2, 6] in groups of 2: group 0 = {1, 3} (mean 2, std 1), group 1 = {2, 6} (mean 4, std 2).
REWARDS = torch.tensor([1.0, 3.0, 2.0, 6.0])


def test_group_std_hand_computed():
    advantages = group_advantages(REWARDS, 2, std="group", eps=0.0)
    torch.testing.assert_close(advantages, torch.tensor([-1.0, 1.0, -1.0, 1.0]))


def test_group_std_adds_eps_to_std():
    advantages = group_advantages(REWARDS, 2)  # eps = 1e-4
    expected = torch.tensor([-1 / (1 + 1e-4), 1 / (1 + 1e-4), -2 / (2 + 1e-4), 2 / (2 + 1e-4)])
    torch.testing.assert_close(advantages, expected)


def test_a_baseline_replaces_the_group_mean_and_keeps_the_groups_spread():
    # ReMax: the greedy answers scored 2.5 (group 0) and 7 (group 1); group stds 1 and 2 as above
    baseline = torch.tensor([2.5, 2.5, 7.0, 7.0])
    advantages = group_advantages(REWARDS, 2, std="group", eps=0.0, baseline=baseline)
    torch.testing.assert_close(advantages, torch.tensor([-1.5, 0.5, -2.5, -0.5]))
    plain = group_advantages(REWARDS, 2, std="none", baseline=baseline)
    torch.testing.assert_close(plain, REWARDS - baseline)
    with pytest.raises(ValueError, match="baseline must have shape"):
        group_advantages(REWARDS, 2, baseline=baseline[:3])


def test_global_std_hand_computed():
    # batch mean 3, deviations (-2, 0, -1, 3): variance 14 / 4 = 3.5; centred in-group (-1, 1, -2, 2)
    advantages = group_advantages(REWARDS, 2, std="global", eps=0.0)
    expected = torch.tensor([-1.0, 1.0, -2.0, 2.0]) / math.sqrt(3.5)
    torch.testing.assert_close(advantages, expected)


def test_no_std_only_centres():
    advantages = group_advantages(REWARDS, 2, std="none")
    torch.testing.assert_close(advantages, torch.tensor([-1.0, 1.0, -2.0, 2.0]))


@pytest.mark.parametrize("group_ids", [torch.tensor([5, 7, 5, 7]), ["cat", "dog", "cat", "dog"]])
def test_interleaved_group_ids(group_ids):
    # group "5"/"cat" = {1, 3}, group "7"/"dog" = {2, 6}
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0])
    advantages = group_advantages(rewards, group_ids, eps=0.0)
    torch.testing.assert_close(advantages, torch.tensor([-1.0, -1.0, 1.0, 1.0]))


def test_matches_numpy_reference():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=24)
    grouped = rewards.reshape(6, 4)
    mean = grouped.mean(axis=1, keepdims=True)
    expected_group = ((grouped - mean) / (grouped.std(axis=1, keepdims=True) + 1e-4)).reshape(-1)
    expected_global = ((grouped - mean) / (rewards.std() + 1e-4)).reshape(-1)
    got_group = group_advantages(torch.from_numpy(rewards), 4)
    got_global = group_advantages(torch.from_numpy(rewards), 4, std="global")
    assert got_group.dtype == torch.float64
    np.testing.assert_allclose(got_group.numpy(), expected_group, rtol=1e-12)
    np.testing.assert_allclose(got_global.numpy(), expected_global, rtol=1e-12)


def test_group_size_must_divide_batch():
    with pytest.raises(ValueError, match=r"group_size 3 does not divide the batch size 4"):
        group_advantages(REWARDS, 3)


def test_singleton_group_rejected_when_std_needed():
    with pytest.raises(ValueError, match=r"1 member"):
        group_advantages(REWARDS, torch.tensor([0, 0, 0, 1]))
    with pytest.raises(ValueError, match=r"at least 2"):
        group_advantages(REWARDS, 1)
    # Centring alone is defined: a lone sample's advantage is 0.
    advantages = group_advantages(REWARDS, torch.tensor([0, 0, 0, 1]), std="none")
    torch.testing.assert_close(advantages, torch.tensor([-1.0, 1.0, 0.0, 0.0]))


def test_bad_arguments():
    with pytest.raises(ValueError, match="std must be"):
        group_advantages(REWARDS, 2, std="batch")
    with pytest.raises(ValueError, match="got 3 group ids for 4 rewards"):
        group_advantages(REWARDS, ["a", "b", "a"])
    with pytest.raises(ValueError, match=r"shape \[B\]"):
        group_advantages(REWARDS.view(2, 2), 2)


def test_clip_advantages():
    clipped = clip_advantages(torch.tensor([-7.0, 0.5, 3.0]), 2.0)
    torch.testing.assert_close(clipped, torch.tensor([-2.0, 0.5, 2.0]))
    with pytest.raises(ValueError):
        clip_advantages(torch.zeros(2), 0.0)


# ---------------------------------------------------------------------------- PerPromptStatTracker
def test_tracker_falls_back_to_batch_statistics_below_min_count():
    tracker = PerPromptStatTracker(buffer_size=4, min_count=3)
    # batch [1, 3, 5]: mean 3, std sqrt(8/3); "a" has 2 entries and "b" 1, both < 3
    advantages = tracker.update(["a", "a", "b"], torch.tensor([1.0, 3.0, 5.0]))
    batch_std = math.sqrt(8 / 3) + 1e-6
    torch.testing.assert_close(advantages, torch.tensor([-2.0, 0.0, 2.0]) / batch_std)

    # "a" now holds [1, 3, 5]: its own mean 3, std sqrt(8/3), although this batch is [5, 100]
    advantages = tracker.update(["a", "b"], torch.tensor([5.0, 100.0]))
    assert advantages[0].item() == pytest.approx(2.0 / batch_std)
    # "b" has 2 entries: batch statistics (mean 52.5, std 47.5)
    assert advantages[1].item() == pytest.approx(47.5 / (47.5 + 1e-6))


def test_tracker_evicts_oldest():
    tracker = PerPromptStatTracker(buffer_size=4, min_count=1)
    tracker.update(["a"] * 3, [1.0, 3.0, 5.0])
    advantages = tracker.update(["a", "a"], [7.0, 9.0])
    # buffer is [3, 5, 7, 9]: mean 6, population std sqrt(5)
    assert tracker.get_stats() == {"a": {"mean": 6.0, "std": pytest.approx(math.sqrt(5)), "count": 4}}
    expected = torch.tensor([1.0, 3.0]) / (math.sqrt(5) + 1e-6)
    torch.testing.assert_close(advantages, expected)
    assert advantages.dtype == torch.float32


def test_tracker_keeps_tensor_dtype_and_rejects_non_strings():
    tracker = PerPromptStatTracker(buffer_size=8, min_count=2)
    advantages = tracker.update(["a", "a"], torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert advantages.dtype == torch.float64
    with pytest.raises(TypeError, match="prompts must be strings"):
        tracker.update([1, 2], [0.0, 1.0])
    with pytest.raises(ValueError, match="2 prompts"):
        tracker.update(["a", "b"], [0.0, 1.0, 2.0])


def test_tracker_state_round_trip_through_json():
    tracker = PerPromptStatTracker(buffer_size=3, min_count=2)
    tracker.update(["a", "b", "a", "b"], [1.0, 2.0, 4.0, 8.0])
    tracker.update(["a", "c"], [0.5, 3.0])
    state = json.loads(json.dumps(tracker.state_dict()))

    restored = PerPromptStatTracker(buffer_size=3, min_count=2)
    restored.load_state_dict(state)
    assert restored.get_stats() == tracker.get_stats()
    prompts, rewards = ["a", "b", "c", "d"], [2.0, 5.0, 1.0, 0.0]
    torch.testing.assert_close(restored.update(prompts, rewards), tracker.update(prompts, rewards))


def test_tracker_load_truncates_to_own_buffer_size():
    big = PerPromptStatTracker(buffer_size=None, min_count=0)
    big.update(["a"] * 5, [1.0, 2.0, 3.0, 4.0, 5.0])
    small = PerPromptStatTracker(buffer_size=2, min_count=0)
    small.load_state_dict(big.state_dict())
    assert small.state_dict()["stats"] == {"a": [4.0, 5.0]}
    small.clear()
    assert small.get_stats() == {}


def test_tracker_rejects_unusable_settings():
    with pytest.raises(ValueError, match="exceeds buffer_size"):
        PerPromptStatTracker(buffer_size=2, min_count=3)
    with pytest.raises(ValueError):
        PerPromptStatTracker(buffer_size=0, min_count=0)


@pytest.mark.parametrize("std", ["group", "global"])
def test_a_tied_group_gets_zero_advantages_against_a_baseline_too(std):
    # group 0 ties at 0.5 against a greedy baseline of 0.51: (0.5 - 0.51) / 1e-4 = -100 before
    rewards = torch.tensor([0.5, 0.5, 0.0, 1.0]) if std == "group" else torch.full((4,), 0.5)
    baseline = torch.tensor([0.51, 0.51, 0.2, 0.2])
    advantages = group_advantages(rewards, 2, std=std, baseline=baseline)
    assert advantages[:2].tolist() == [0.0, 0.0]
    if std == "group":  # the spread group keeps (r - b) / (s + eps), s = 0.5
        torch.testing.assert_close(advantages[2:], (rewards[2:] - 0.2) / (0.5 + 1e-4))


def test_clustered_stderr_is_the_error_of_the_group_means_for_equal_groups():
    from genalign.algorithms import clustered_stderr

    torch.manual_seed(0)
    rewards = torch.randn(6, 8) + 3 * torch.randn(6, 1)  # 6 prompts x 8 samples, strongly clustered
    means = rewards.mean(dim=1)
    expected = float(means.std(unbiased=True)) / 6**0.5
    assert clustered_stderr(rewards.reshape(-1), 8) == pytest.approx(expected, rel=1e-6)
    naive = float(rewards.std(unbiased=True)) / 48**0.5
    assert clustered_stderr(rewards.reshape(-1), 8) > 1.5 * naive  # the iid formula understates it


def test_clustered_stderr_reduces_to_the_iid_error_for_singletons_and_one_group():
    from genalign.algorithms import clustered_stderr

    rewards = torch.tensor([0.1, 0.7, 0.3, 0.9, 0.4])
    iid = float(rewards.std(unbiased=True)) / 5**0.5
    assert clustered_stderr(rewards, 1) == pytest.approx(iid, rel=1e-6)
    assert clustered_stderr(rewards, torch.zeros(5)) == pytest.approx(iid, rel=1e-6)  # one prompt
    assert clustered_stderr(rewards[:1], 1) == 0.0
    ids = torch.tensor([7, 7, 2, 2, 9])  # ids need not be dense
    residual = rewards - rewards.mean()
    sums = torch.stack([residual[:2].sum(), residual[2:4].sum(), residual[4:].sum()])
    by_hand = (3 / 2 * float((sums**2).sum())) ** 0.5 / 5
    assert clustered_stderr(rewards, ids) == pytest.approx(by_hand, rel=1e-6)
