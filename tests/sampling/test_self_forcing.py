"""Self-Forcing's grid and re-noising kernel against hand computations and torch.distributions."""

from __future__ import annotations

import pytest
import torch

from genalign.sampling.self_forcing import self_forcing_step, self_forcing_timesteps, uniform_denoising_steps


def test_the_warped_grid_is_wans_shifted_flow_schedule():
    # sigma(s) = 5 s / (1 + 4 s) at s = 1, 0.75, 0.5, 0.25 (Self-Forcing's warp_denoising_step)
    expected = [1000.0, 1000 * 3.75 / 4.0, 1000 * 2.5 / 3.0, 1000 * 1.25 / 2.0]
    assert uniform_denoising_steps(4) == [1000, 750, 500, 250]
    torch.testing.assert_close(
        self_forcing_timesteps([1000, 750, 500, 250], shift=5.0), torch.tensor(expected)
    )
    torch.testing.assert_close(self_forcing_timesteps([1000, 500], shift=1.0), torch.tensor([1000.0, 500.0]))
    with pytest.raises(ValueError, match="denoising_steps"):
        self_forcing_timesteps([0, 500])


def test_a_step_renoises_the_x0_prediction_and_scores_it_exactly():
    generator = torch.Generator().manual_seed(0)
    sample, velocity = (
        torch.randn(2, 4, 2, 3, 3, generator=generator),
        torch.randn(2, 4, 2, 3, 3, generator=generator),
    )
    sigma, sigma_next = torch.tensor([0.9, 0.6]), torch.tensor([0.5, 0.2])
    out = self_forcing_step(
        velocity, sample, sigma, sigma_next, generator=[torch.Generator().manual_seed(s) for s in (1, 2)]
    )
    x0 = sample - sigma.view(-1, 1, 1, 1, 1) * velocity
    torch.testing.assert_close(out.pred_original_sample, x0)
    torch.testing.assert_close(out.mean, (1 - sigma_next.view(-1, 1, 1, 1, 1)) * x0)
    # the noise is each sample's own generator's: x_next = mean + sigma_next * eps
    eps = torch.randn(4, 2, 3, 3, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(out.prev_sample[1], out.mean[1] + 0.2 * eps)
    normal = torch.distributions.Normal(out.mean, sigma_next.view(-1, 1, 1, 1, 1).expand_as(out.mean))
    torch.testing.assert_close(out.log_prob, normal.log_prob(out.prev_sample).flatten(1).sum(1))


def test_the_last_step_returns_x0_deterministically():
    sample, velocity = torch.randn(1, 4, 2, 3, 3), torch.randn(1, 4, 2, 3, 3)
    out = self_forcing_step(velocity, sample, 0.625, 0.0)
    torch.testing.assert_close(out.prev_sample, sample - 0.625 * velocity)
    assert out.log_prob.tolist() == [0.0]
