"""ddim_step against diffusers' DDIMScheduler.step, torch.distributions and itself (batching, dtypes)."""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers import DDIMScheduler
from torch.distributions import Normal

from genalign.sampling import ddim_step

SHAPE = (3, 4, 8, 8)


def snapshot(scheduler) -> dict:
    return {k: v.clone() if torch.is_tensor(v) else copy.deepcopy(v) for k, v in vars(scheduler).items()}


def assert_same_state(scheduler, before: dict) -> None:
    after = vars(scheduler)
    assert after.keys() == before.keys()
    for key, value in before.items():
        if torch.is_tensor(value):
            assert torch.equal(after[key], value), key
        elif key != "_internal_dict":
            assert repr(after[key]) == repr(value), key


def make_scheduler(num_inference_steps: int = 10, **config) -> DDIMScheduler:
    kwargs = dict(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    kwargs.update(config)
    scheduler = DDIMScheduler(**kwargs)
    scheduler.set_timesteps(num_inference_steps)
    return scheduler


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_mean_and_noisy_sample_match_diffusers_step(prediction_type, eta):
    scheduler = make_scheduler(prediction_type=prediction_type)
    for t in scheduler.timesteps:
        sample, model_output, z = torch.randn(SHAPE), torch.randn(SHAPE), torch.randn(SHAPE)
        out = ddim_step(scheduler, model_output, t, sample, eta=eta)
        reference = scheduler.step(model_output, t, sample, eta=eta, variance_noise=torch.zeros(SHAPE))
        torch.testing.assert_close(out.mean, reference.prev_sample)
        torch.testing.assert_close(out.pred_original_sample, reference.pred_original_sample)
        noisy = scheduler.step(model_output, t, sample, eta=eta, variance_noise=z).prev_sample
        torch.testing.assert_close(out.mean + out.std * z, noisy)
        assert out.std.shape == (SHAPE[0], 1, 1, 1)
        assert (out.std > 0).all() == (eta > 0)


@pytest.mark.parametrize(
    "config", [dict(clip_sample=True, clip_sample_range=1.0), dict(thresholding=True, sample_max_value=1.5)]
)
def test_clipping_and_thresholding_match_diffusers(config):
    scheduler = make_scheduler(prediction_type="sample", **config)
    t = scheduler.timesteps[3]
    sample, model_output = torch.randn(SHAPE), 3 * torch.randn(SHAPE)  # x0 far outside [-1, 1]
    out = ddim_step(scheduler, model_output, t, sample, eta=1.0)
    reference = scheduler.step(model_output, t, sample, eta=1.0, variance_noise=torch.zeros(SHAPE))
    assert not torch.allclose(out.pred_original_sample, model_output)  # the x0 was actually limited
    torch.testing.assert_close(out.pred_original_sample, reference.pred_original_sample)
    torch.testing.assert_close(out.mean, reference.prev_sample)


def test_log_prob_is_exact_gaussian_density():
    scheduler = make_scheduler()
    sample, model_output = torch.randn(SHAPE), torch.randn(SHAPE)
    out = ddim_step(scheduler, model_output, scheduler.timesteps[4], sample, eta=0.8)
    expected = Normal(out.mean, out.std).log_prob(out.prev_sample).sum(dim=(1, 2, 3))
    torch.testing.assert_close(out.log_prob, expected)
    assert out.log_prob.shape == (SHAPE[0],) and out.log_prob.dtype == torch.float32
    assert torch.equal(out.kl_std, out.std)  # DDPO's KL scale is the step std


def test_given_prev_sample_is_scored_and_rescoring_is_exact():
    scheduler = make_scheduler()
    t = scheduler.timesteps[2]
    sample, model_output, other = torch.randn(SHAPE), torch.randn(SHAPE), torch.randn(SHAPE)
    sampled = ddim_step(scheduler, model_output, t, sample, eta=1.0)
    rescored = ddim_step(scheduler, model_output, t, sample, eta=1.0, prev_sample=sampled.prev_sample)
    assert torch.equal(rescored.log_prob, sampled.log_prob)
    assert torch.equal(rescored.prev_sample, sampled.prev_sample)
    given = ddim_step(scheduler, model_output, t, sample, eta=1.0, prev_sample=other)
    assert torch.equal(given.prev_sample, other)
    expected = Normal(given.mean, given.std).log_prob(other).sum(dim=(1, 2, 3))
    torch.testing.assert_close(given.log_prob, expected)


def test_log_prob_gradient_flows_to_model_output_only():
    scheduler = make_scheduler()
    model_output = torch.randn(SHAPE, requires_grad=True)
    out = ddim_step(scheduler, model_output, scheduler.timesteps[5], torch.randn(SHAPE))
    (grad,) = torch.autograd.grad(out.log_prob.sum(), model_output)
    # with the sample held fixed the gradient is (x - mean) / std^2 * d mean / d eps != 0
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_eta_zero_is_deterministic_with_zero_log_prob():
    scheduler = make_scheduler()
    generator = torch.Generator().manual_seed(0)
    out = ddim_step(
        scheduler,
        torch.randn(SHAPE),
        scheduler.timesteps[1],
        torch.randn(SHAPE),
        eta=0.0,
        generator=generator,
    )
    assert torch.equal(out.prev_sample, out.mean)
    assert torch.equal(out.log_prob, torch.zeros(SHAPE[0]))
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(0).get_state())  # no noise drawn


def test_final_step_with_alpha_set_to_one_is_deterministic():
    scheduler = make_scheduler(set_alpha_to_one=True, steps_offset=0)
    t = scheduler.timesteps[-1]
    sample, model_output = torch.randn(SHAPE), torch.randn(SHAPE)
    out = ddim_step(scheduler, model_output, t, sample, eta=1.0)
    reference = scheduler.step(model_output, t, sample, eta=1.0, variance_noise=torch.zeros(SHAPE))
    assert (out.std == 0).all() and (out.log_prob == 0).all()
    torch.testing.assert_close(out.prev_sample, reference.prev_sample)
    torch.testing.assert_close(out.prev_sample, out.pred_original_sample)  # a_prev = 1: x_{t-1} = x0_hat


def test_batched_heterogeneous_timesteps_equal_per_sample_calls():
    scheduler = make_scheduler(set_alpha_to_one=True, steps_offset=0)
    timesteps = scheduler.timesteps[[0, 4, -1]]  # includes the deterministic final step
    sample, model_output = torch.randn(SHAPE), torch.randn(SHAPE)
    generators = [torch.Generator().manual_seed(seed) for seed in range(3)]
    batched = ddim_step(scheduler, model_output, timesteps, sample, eta=1.0, generator=generators)
    for i in range(3):
        single = ddim_step(
            scheduler,
            model_output[i : i + 1],
            int(timesteps[i]),
            sample[i : i + 1],
            eta=1.0,
            generator=torch.Generator().manual_seed(i),
        )
        torch.testing.assert_close(batched.mean[i : i + 1], single.mean)
        torch.testing.assert_close(batched.std[i : i + 1], single.std)
        torch.testing.assert_close(batched.prev_sample[i : i + 1], single.prev_sample)
        torch.testing.assert_close(batched.log_prob[i : i + 1], single.log_prob)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_compute_in_fp32(dtype):
    scheduler = make_scheduler()
    t = scheduler.timesteps[3]
    sample, model_output = torch.randn(SHAPE).to(dtype), torch.randn(SHAPE).to(dtype)
    low = ddim_step(scheduler, model_output, t, sample, generator=torch.Generator().manual_seed(0))
    full = ddim_step(
        scheduler, model_output.float(), t, sample.float(), generator=torch.Generator().manual_seed(0)
    )
    assert low.prev_sample.dtype == dtype
    assert low.mean.dtype == low.std.dtype == low.log_prob.dtype == torch.float32
    assert torch.equal(low.mean, full.mean)  # same fp32 arithmetic on the same (upcast) inputs
    torch.testing.assert_close(low.prev_sample, full.prev_sample.to(dtype))
    # the log-prob is that of the returned low-precision sample, so re-scoring it is exact
    rescored = ddim_step(scheduler, model_output, t, sample, prev_sample=low.prev_sample)
    assert torch.equal(rescored.log_prob, low.log_prob)


def test_generator_determinism_and_scheduler_left_untouched():
    scheduler = make_scheduler()
    t = scheduler.timesteps[3]
    sample, model_output = torch.randn(SHAPE), torch.randn(SHAPE)
    before = snapshot(scheduler)
    first = ddim_step(scheduler, model_output, t, sample, generator=torch.Generator().manual_seed(7))
    second = ddim_step(scheduler, model_output, t, sample, generator=torch.Generator().manual_seed(7))
    third = ddim_step(scheduler, model_output, t, sample, generator=torch.Generator().manual_seed(8))
    assert torch.equal(first.prev_sample, second.prev_sample)
    assert not torch.equal(first.prev_sample, third.prev_sample)
    assert_same_state(scheduler, before)


def test_rejects_bad_arguments():
    scheduler = make_scheduler()
    sample = torch.randn(SHAPE)
    with pytest.raises(ValueError, match="eta"):
        ddim_step(scheduler, sample, 901, sample, eta=-0.1)
    with pytest.raises(ValueError, match="one value per sample"):
        ddim_step(scheduler, sample, torch.tensor([901, 801]), sample)
    with pytest.raises(ValueError, match="set_timesteps"):
        ddim_step(DDIMScheduler(), sample, 901, sample)
