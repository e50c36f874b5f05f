from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from genalign.algorithms.losses import ppo_clip_loss, reduce_log_prob, score_function_loss


def _leaf(values):
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def test_on_policy_ratio_is_exactly_one():
    log_prob = torch.tensor([-3.0, -1.5, -7.25])
    advantages = torch.tensor([1.0, -2.0, 0.5])
    loss, info = ppo_clip_loss(log_prob.clone().requires_grad_(), log_prob, advantages, clip_range=0.2)
    assert info["ratio"].item() == 1.0
    assert info["clipfrac"].item() == 0.0
    assert info["approx_kl"].item() == 0.0
    # loss = mean(-A * 1) = -(1 - 2 + 0.5) / 3
    assert loss.item() == pytest.approx(0.5 / 3)


# (advantage, ratio, expected loss, expected d loss / d log_prob_new) for clip_range 0.2:
#   A=+1, rho=1.5: max(-1.5, -1.2) = -1.2, clipped branch -> no gradient
#   A=+1, rho=0.5: max(-0.5, -0.8) = -0.5, unclipped -> d(-rho)/dlogp = -0.5
#   A=-1, rho=1.5: max( 1.5,  1.2) =  1.5, unclipped -> d(rho)/dlogp = 1.5
#   A=-1, rho=0.5: max( 0.5,  0.8) =  0.8, clipped branch -> no gradient
@pytest.mark.parametrize(
    "advantage, ratio, expected_loss, expected_grad",
    [(1.0, 1.5, -1.2, 0.0), (1.0, 0.5, -0.5, -0.5), (-1.0, 1.5, 1.5, 1.5), (-1.0, 0.5, 0.8, 0.0)],
)
def test_clip_branches(advantage, ratio, expected_loss, expected_grad):
    log_prob_new = _leaf([math.log(ratio)])
    loss, info = ppo_clip_loss(log_prob_new, torch.zeros(1), torch.tensor([advantage]), clip_range=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    assert log_prob_new.grad.item() == pytest.approx(expected_grad, abs=1e-6)
    assert info["clipfrac"].item() == 1.0


def test_inside_clip_range_is_plain_importance_sampling():
    log_prob_new = _leaf([math.log(1.1), math.log(0.9)])
    loss, info = ppo_clip_loss(log_prob_new, torch.zeros(2), torch.tensor([2.0, -3.0]), clip_range=0.2)
    loss.backward()
    # mean(-2 * 1.1, 3 * 0.9) = (-2.2 + 2.7) / 2
    assert loss.item() == pytest.approx(0.25, abs=1e-6)
    torch.testing.assert_close(log_prob_new.grad, torch.tensor([-2.0 * 1.1, 3.0 * 0.9]) / 2)
    assert info["clipfrac"].item() == 0.0


def test_asymmetric_clip_range():
    # range [0.9, 1.3]: rho 1.25 with A=+1 is inside; rho 0.85 with A=-1 clips to 0.9
    log_prob_new = _leaf([math.log(1.25), math.log(0.85)])
    loss, info = ppo_clip_loss(log_prob_new, torch.zeros(2), torch.tensor([1.0, -1.0]), clip_range=(0.1, 0.3))
    assert loss.item() == pytest.approx((-1.25 + 0.9) / 2, abs=1e-6)
    assert info["clipfrac"].item() == 0.5


def test_matches_numpy_reference_and_diagnostics():
    rng = np.random.default_rng(1)
    new, old, advantages = rng.normal(size=(3, 64)) * np.array([[0.3], [0.3], [1.0]])
    ratio = np.exp(new - old)
    expected = np.maximum(-advantages * ratio, -advantages * np.clip(ratio, 0.8, 1.2)).mean()
    loss, info = ppo_clip_loss(*(torch.tensor(x) for x in (new, old, advantages)), clip_range=0.2)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert info["ratio"].item() == pytest.approx(ratio.mean(), rel=1e-5)
    assert info["clipfrac"].item() == pytest.approx(np.mean(np.abs(ratio - 1) > 0.2))
    assert info["approx_kl"].item() == pytest.approx(0.5 * np.mean((new - old) ** 2), rel=1e-5)
    assert info["policy_loss"].item() == pytest.approx(expected, rel=1e-5)


def test_mean_reduction_divides_log_probs_by_num_dims():
    # summed log-probs differ by 10 over 100 elements: per-element ratio exp(0.1), exact ratio exp(10)
    loss_mean, info_mean = ppo_clip_loss(
        torch.tensor([10.0]),
        torch.tensor([0.0]),
        torch.tensor([-1.0]),
        0.5,
        ratio_reduction="mean",
        num_dims=100,
    )
    assert info_mean["ratio"].item() == pytest.approx(math.exp(0.1))
    assert loss_mean.item() == pytest.approx(math.exp(0.1))
    _, info_sum = ppo_clip_loss(torch.tensor([10.0]), torch.tensor([0.0]), torch.tensor([-1.0]), 0.5)
    assert info_sum["ratio"].item() == pytest.approx(math.exp(10.0), rel=1e-5)
    with pytest.raises(ValueError, match="num_dims"):
        ppo_clip_loss(torch.zeros(1), torch.zeros(1), torch.ones(1), 0.2, ratio_reduction="mean")
    with pytest.raises(ValueError, match="ratio_reduction"):
        reduce_log_prob(torch.zeros(1), "max")


def test_positive_advantage_raises_log_prob_under_gradient_descent():
    # log p_theta(x) = -(x - theta)^2 / 2 (unit Gaussian); x = 1 sampled with theta = 0
    theta = torch.zeros(1, requires_grad=True)
    x = torch.ones(1)
    log_prob_old = -0.5 * (x - theta.detach()) ** 2
    optimizer = torch.optim.SGD([theta], lr=0.1)
    loss, _ = ppo_clip_loss(-0.5 * (x - theta) ** 2, log_prob_old, torch.tensor([1.0]), clip_range=0.2)
    loss.backward()
    optimizer.step()
    assert (-0.5 * (x - theta) ** 2).item() > log_prob_old.item()

    theta.grad = None
    loss, _ = ppo_clip_loss(-0.5 * (x - theta) ** 2, log_prob_old, torch.tensor([-1.0]), clip_range=0.2)
    loss.backward()
    assert theta.grad.item() > 0  # a negative advantage pushes theta away from x


def test_old_log_prob_and_advantages_are_constants():
    log_prob_old = _leaf([0.1])
    advantages = _leaf([1.0])
    loss, _ = ppo_clip_loss(_leaf([0.0]), log_prob_old, advantages, clip_range=0.2)
    loss.backward()
    assert log_prob_old.grad is None and advantages.grad is None


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="matching shapes"):
        ppo_clip_loss(torch.zeros(4), torch.zeros(4), torch.zeros(4, 1), clip_range=0.2)
    with pytest.raises(ValueError, match="clip_range"):
        ppo_clip_loss(torch.zeros(4), torch.zeros(4), torch.zeros(4), clip_range=1.5)


def test_score_function_loss():
    log_prob = _leaf([1.0, 2.0])
    loss = score_function_loss(log_prob, torch.tensor([1.0, -1.0]))
    loss.backward()
    assert loss.item() == pytest.approx(0.5)  # -(1 * 1 + (-1) * 2) / 2
    torch.testing.assert_close(log_prob.grad, torch.tensor([-0.5, 0.5]))
    scaled = score_function_loss(torch.tensor([10.0, 20.0]), torch.tensor([1.0, -1.0]), "mean", num_dims=10)
    assert scaled.item() == pytest.approx(0.5)
