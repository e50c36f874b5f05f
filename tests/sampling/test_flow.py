"""flow_sde_step against diffusers' Euler step, the closed forms of Flow-GRPO and CPS, and Normal."""

from __future__ import annotations

import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from torch.distributions import Normal

from genalign.sampling import FLOW_MODES, flow_sde_step

SHAPE = (3, 4, 8, 8)
NUM_STEPS = 6


def make_scheduler() -> FlowMatchEulerDiscreteScheduler:
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    scheduler.set_timesteps(NUM_STEPS)
    return scheduler


def forward_process(sigma: float):
    """x = (1 - sigma) x0 + sigma eps with the exact velocity v = eps - x0."""
    x0, eps = torch.randn(SHAPE), torch.randn(SHAPE)
    return x0, eps, (1 - sigma) * x0 + sigma * eps, eps - x0


@pytest.mark.parametrize("mode, noise_level", [("ode", 0.7), ("sde", 0.0)])
def test_deterministic_modes_equal_diffusers_euler_step(mode, noise_level):
    scheduler, reference = make_scheduler(), make_scheduler()
    for i, t in enumerate(scheduler.timesteps):
        sample, velocity = torch.randn(SHAPE), torch.randn(SHAPE)
        out = flow_sde_step(scheduler, velocity, i, sample, noise_level=noise_level, mode=mode)
        reference._step_index = i  # diffusers' step reads its own counter; ours must not
        expected = reference.step(velocity, t, sample).prev_sample
        torch.testing.assert_close(out.mean, expected)
        assert torch.equal(out.prev_sample, out.mean)
        assert (out.std == 0).all() and (out.log_prob == 0).all()
    assert scheduler.step_index is None


def test_sde_mean_is_euler_maruyama_of_the_marginal_preserving_sde():
    # with the exact velocity, score = -eps / sigma, and the drift is v - std_t^2 / 2 * score (Flow-GRPO eq. 9)
    scheduler, noise_level = make_scheduler(), 0.7
    sigmas = scheduler.sigmas.tolist()
    for i in range(NUM_STEPS):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        x0, eps, sample, velocity = forward_process(sigma)
        out = flow_sde_step(scheduler, velocity, i, sample, noise_level=noise_level)
        denominator = 1 - (sigmas[1] if sigma == 1 else sigma)  # flow_grpo's guard at sigma = 1
        std_t = noise_level * math.sqrt(sigma / denominator)
        dt = sigma_next - sigma
        expected_mean = sample + (velocity + std_t**2 / (2 * sigma) * eps) * dt
        torch.testing.assert_close(out.mean, expected_mean, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.std, torch.full((3, 1, 1, 1), std_t * math.sqrt(-dt)))
        # Flow-GRPO's KL scale: its std_dev_t, without sqrt(-dt)
        torch.testing.assert_close(out.kl_std, torch.full((3, 1, 1, 1), std_t))
        torch.testing.assert_close(out.pred_original_sample, x0, rtol=1e-5, atol=1e-5)
        assert torch.isfinite(out.log_prob).all()


def test_cps_preserves_forward_process_coefficients():
    scheduler, noise_level = make_scheduler(), 0.5
    sigmas = scheduler.sigmas.tolist()
    for i in range(NUM_STEPS - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        x0, eps, sample, velocity = forward_process(sigma)
        out = flow_sde_step(scheduler, velocity, i, sample, noise_level=noise_level, mode="cps")
        std = sigma_next * math.sin(noise_level * math.pi / 2)
        # x_next = (1 - s') x0 + sqrt(s'^2 - std^2) eps + std z: total noise variance s'^2, as in the forward process
        expected_mean = (1 - sigma_next) * x0 + math.sqrt(sigma_next**2 - std**2) * eps
        torch.testing.assert_close(out.mean, expected_mean, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.std, torch.full((3, 1, 1, 1), std))
        assert torch.equal(out.kl_std, out.std)  # flow_grpo's CPS std_dev_t is the step std


def test_cps_final_step_is_deterministic_and_sde_final_step_is_finite():
    scheduler = make_scheduler()
    last = NUM_STEPS - 1  # sigma_next = 0
    x0, _, sample, velocity = forward_process(scheduler.sigmas[last].item())
    cps = flow_sde_step(scheduler, velocity, last, sample, mode="cps")
    torch.testing.assert_close(cps.prev_sample, x0, rtol=1e-5, atol=1e-5)
    assert (cps.std == 0).all() and (cps.log_prob == 0).all()
    sde = flow_sde_step(scheduler, velocity, last, sample, mode="sde")
    assert (sde.std > 0).all() and torch.isfinite(sde.log_prob).all() and torch.isfinite(sde.mean).all()


@pytest.mark.parametrize("mode", ["sde", "cps"])
def test_log_prob_is_exact_gaussian_density(mode):
    scheduler = make_scheduler()
    sample, velocity = torch.randn(SHAPE), torch.randn(SHAPE)
    out = flow_sde_step(scheduler, velocity, 2, sample, mode=mode)
    expected = Normal(out.mean, out.std).log_prob(out.prev_sample).sum(dim=(1, 2, 3))
    torch.testing.assert_close(out.log_prob, expected)
    assert out.log_prob.shape == (SHAPE[0],) and out.log_prob.dtype == torch.float32


@pytest.mark.parametrize("mode", ["sde", "cps"])
def test_given_prev_sample_is_scored_and_rescoring_is_exact(mode):
    scheduler = make_scheduler()
    sample, velocity, other = torch.randn(SHAPE), torch.randn(SHAPE), torch.randn(SHAPE)
    sampled = flow_sde_step(scheduler, velocity, 1, sample, mode=mode)
    rescored = flow_sde_step(scheduler, velocity, 1, sample, mode=mode, prev_sample=sampled.prev_sample)
    assert torch.equal(rescored.log_prob, sampled.log_prob)
    given = flow_sde_step(scheduler, velocity, 1, sample, mode=mode, prev_sample=other)
    expected = Normal(given.mean, given.std).log_prob(other).sum(dim=(1, 2, 3))
    torch.testing.assert_close(given.log_prob, expected)


@pytest.mark.parametrize("mode", FLOW_MODES)
def test_batched_heterogeneous_step_indices_equal_per_sample_calls(mode):
    scheduler = make_scheduler()
    step_index = torch.tensor([0, 3, NUM_STEPS - 1])  # sigma = 1, a middle step, sigma_next = 0
    sample, velocity = torch.randn(SHAPE), torch.randn(SHAPE)
    generators = [torch.Generator().manual_seed(seed) for seed in range(3)]
    batched = flow_sde_step(scheduler, velocity, step_index, sample, mode=mode, generator=generators)
    for i in range(3):
        single = flow_sde_step(
            scheduler,
            velocity[i : i + 1],
            torch.tensor(int(step_index[i])),
            sample[i : i + 1],
            mode=mode,
            generator=torch.Generator().manual_seed(i),
        )
        torch.testing.assert_close(batched.mean[i : i + 1], single.mean)
        torch.testing.assert_close(batched.std[i : i + 1], single.std)
        torch.testing.assert_close(batched.prev_sample[i : i + 1], single.prev_sample)
        torch.testing.assert_close(batched.log_prob[i : i + 1], single.log_prob)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_compute_in_fp32(dtype):
    scheduler = make_scheduler()
    sample, velocity = torch.randn(SHAPE).to(dtype), torch.randn(SHAPE).to(dtype)
    low = flow_sde_step(scheduler, velocity, 2, sample, generator=torch.Generator().manual_seed(0))
    full = flow_sde_step(
        scheduler, velocity.float(), 2, sample.float(), generator=torch.Generator().manual_seed(0)
    )
    assert low.prev_sample.dtype == dtype
    assert low.mean.dtype == low.std.dtype == low.log_prob.dtype == torch.float32
    assert torch.equal(low.mean, full.mean)
    torch.testing.assert_close(low.prev_sample, full.prev_sample.to(dtype))
    rescored = flow_sde_step(scheduler, velocity, 2, sample, prev_sample=low.prev_sample)
    assert torch.equal(rescored.log_prob, low.log_prob)


def test_generator_determinism_and_scheduler_left_untouched():
    scheduler = make_scheduler()
    sample, velocity = torch.randn(SHAPE), torch.randn(SHAPE)
    sigmas = scheduler.sigmas.clone()
    first = flow_sde_step(scheduler, velocity, 1, sample, generator=torch.Generator().manual_seed(3))
    second = flow_sde_step(scheduler, velocity, 1, sample, generator=torch.Generator().manual_seed(3))
    third = flow_sde_step(scheduler, velocity, 1, sample, generator=torch.Generator().manual_seed(4))
    assert torch.equal(first.prev_sample, second.prev_sample)
    assert not torch.equal(first.prev_sample, third.prev_sample)
    assert scheduler.step_index is None and torch.equal(scheduler.sigmas, sigmas)


def test_rejects_bad_arguments():
    scheduler = make_scheduler()
    sample = torch.randn(SHAPE)
    with pytest.raises(ValueError, match="mode"):
        flow_sde_step(scheduler, sample, 0, sample, mode="euler")
    with pytest.raises(ValueError, match="noise_level"):
        flow_sde_step(scheduler, sample, 0, sample, noise_level=-1.0)
    with pytest.raises(ValueError, match="step_index"):
        flow_sde_step(scheduler, sample, NUM_STEPS, sample)
