from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from genalign.algorithms.kl import estimate_kl, gaussian_step_kl, kl_k1, kl_k2, kl_k3


def test_gaussian_step_kl_hand_computed():
    mean_theta = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    mean_ref = torch.zeros(2, 2)
    # sample 0: (1 + 4) / (2 * 2^2) = 0.625; sample 1: 0
    torch.testing.assert_close(gaussian_step_kl(mean_theta, mean_ref, 2.0), torch.tensor([0.625, 0.0]))
    torch.testing.assert_close(
        gaussian_step_kl(mean_theta, mean_ref, 2.0, reduction="mean"), torch.tensor([0.3125, 0.0])
    )


@pytest.mark.parametrize("std_kind", ["float", "per_sample", "per_element"])
def test_gaussian_step_kl_matches_torch_distributions(std_kind):
    generator = torch.Generator().manual_seed(0)
    mean_theta = torch.randn(3, 2, 4, 4, generator=generator)
    mean_ref = torch.randn(3, 2, 4, 4, generator=generator)
    if std_kind == "float":
        std, full_std = 0.7, torch.full_like(mean_theta, 0.7)
    elif std_kind == "per_sample":
        std = torch.tensor([0.3, 0.7, 1.5])
        full_std = std.view(3, 1, 1, 1).expand_as(mean_theta)
    else:
        std = full_std = torch.rand(3, 2, 4, 4, generator=generator) + 0.1
    expected = kl_divergence(Normal(mean_theta, full_std), Normal(mean_ref, full_std)).sum(dim=(1, 2, 3))
    torch.testing.assert_close(gaussian_step_kl(mean_theta, mean_ref, std), expected)
    torch.testing.assert_close(gaussian_step_kl(mean_theta, mean_ref, std, reduction="mean"), expected / 32)


def test_gaussian_step_kl_gradient_flows_to_theta_only():
    mean_theta = torch.ones(2, 3, requires_grad=True)
    gaussian_step_kl(mean_theta, torch.zeros(2, 3), 1.0).sum().backward()
    torch.testing.assert_close(mean_theta.grad, torch.ones(2, 3))  # d/dmu (mu^2 / 2) = mu


def test_gaussian_step_kl_errors():
    with pytest.raises(ValueError, match="shapes differ"):
        gaussian_step_kl(torch.zeros(2, 3), torch.zeros(2, 4), 1.0)
    with pytest.raises(ValueError, match=r"shape \[B\]"):
        gaussian_step_kl(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3))
    with pytest.raises(ValueError, match="reduction"):
        gaussian_step_kl(torch.zeros(2, 3), torch.zeros(2, 3), 1.0, reduction="max")


def test_sample_estimators_hand_computed():
    # log pi_theta = 0, log pi_ref = log 2: log r = log 2, r = 2
    log_prob, ref_log_prob = torch.tensor([0.0]), torch.tensor([math.log(2.0)])
    assert kl_k1(log_prob, ref_log_prob).item() == pytest.approx(-math.log(2))
    assert kl_k2(log_prob, ref_log_prob).item() == pytest.approx(math.log(2) ** 2 / 2)
    assert kl_k3(log_prob, ref_log_prob).item() == pytest.approx(2 - 1 - math.log(2))
    assert estimate_kl(log_prob, ref_log_prob, "k2").item() == pytest.approx(math.log(2) ** 2 / 2)
    with pytest.raises(ValueError, match="estimator"):
        estimate_kl(log_prob, ref_log_prob, "k4")


def test_k1_and_k3_are_unbiased_and_k3_non_negative():
    # KL(N(0, 1) || N(0.5, 1)) = 0.5^2 / 2 = 0.125, estimated from samples of N(0, 1)
    policy, reference = Normal(0.0, 1.0), Normal(0.5, 1.0)
    samples = policy.sample(torch.Size([200_000]))
    log_prob, ref_log_prob = policy.log_prob(samples), reference.log_prob(samples)
    exact = kl_divergence(policy, reference).item()
    assert exact == pytest.approx(0.125)
    assert kl_k1(log_prob, ref_log_prob).mean().item() == pytest.approx(exact, abs=5e-3)
    k3 = kl_k3(log_prob, ref_log_prob)
    assert k3.mean().item() == pytest.approx(exact, abs=5e-3)
    assert bool((k3 >= 0).all())
    assert bool((kl_k2(log_prob, ref_log_prob) >= 0).all())
