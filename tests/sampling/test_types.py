"""gaussian_log_prob against torch.distributions.Normal, and its point-mass convention."""

from __future__ import annotations

import torch
from torch.distributions import Normal

from genalign.sampling import gaussian_log_prob


def test_matches_torch_normal_summed_over_non_batch_dims():
    x, mean = torch.randn(3, 4, 5, 6), torch.randn(3, 4, 5, 6)
    std = torch.rand(3, 1, 1, 1) + 0.1  # (B, 1, 1, 1)
    expected = Normal(mean, std).log_prob(x).sum(dim=(1, 2, 3))
    torch.testing.assert_close(gaussian_log_prob(x, mean, std), expected)
    full_std = torch.rand(3, 4, 5, 6) + 0.1
    torch.testing.assert_close(
        gaussian_log_prob(x, mean, full_std), Normal(mean, full_std).log_prob(x).sum(dim=(1, 2, 3))
    )


def test_zero_std_is_a_point_mass_with_zero_log_prob_and_finite_gradient():
    x = torch.randn(2, 3, 4)
    mean = torch.randn(2, 3, 4, requires_grad=True)
    std = torch.tensor([0.0, 0.5]).view(2, 1, 1)
    log_prob = gaussian_log_prob(x, mean, std)
    assert log_prob[0] == 0
    torch.testing.assert_close(log_prob[1], Normal(mean[1], 0.5).log_prob(x[1]).sum())
    log_prob.sum().backward()
    assert torch.isfinite(mean.grad).all()
    assert (mean.grad[0] == 0).all() and (mean.grad[1] != 0).any()


def test_half_inputs_give_fp32_and_batch_of_scalars_is_not_summed_away():
    x, mean = torch.randn(4, 8).half(), torch.randn(4, 8).bfloat16()
    assert gaussian_log_prob(x, mean, torch.ones(4, 1)).dtype == torch.float32
    flat = gaussian_log_prob(torch.zeros(4), torch.zeros(4), torch.ones(4))
    assert flat.shape == (4,)
    torch.testing.assert_close(flat, Normal(0.0, 1.0).log_prob(torch.zeros(4)))
