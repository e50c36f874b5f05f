"""consistency_step against diffusers' LCMScheduler.step, torch.distributions and itself."""

from __future__ import annotations

import pytest
import torch
from diffusers import LCMScheduler
from torch.distributions import Normal

from genalign.sampling import consistency_step, rlcm_timesteps

SHAPE = (3, 4, 8, 8)
NUM_STEPS = 4


def make_scheduler(num_inference_steps: int = NUM_STEPS, **config) -> LCMScheduler:
    kwargs = dict(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        original_inference_steps=50,
    )
    kwargs.update(config)
    scheduler = LCMScheduler(**kwargs)
    scheduler.set_timesteps(num_inference_steps)
    return scheduler


def reference_step(scheduler: LCMScheduler, index: int, model_output, sample, generator=None):
    """diffusers' stateful step at position ``index`` of the schedule (a copy of the state is set)."""
    scheduler._step_index = index
    return scheduler.step(model_output, scheduler.timesteps[index], sample, generator=generator)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize("timestep_scaling", [10.0, 0.002])  # the small one makes c_skip ~ 0.06-1, not ~1e-9
def test_mean_and_last_step_match_diffusers(prediction_type, timestep_scaling):
    config = dict(prediction_type=prediction_type, timestep_scaling=timestep_scaling)
    scheduler, reference = make_scheduler(**config), make_scheduler(**config)
    timesteps = scheduler.timesteps
    for i, t in enumerate(timesteps):
        sample, model_output = torch.randn(SHAPE), torch.randn(SHAPE)
        out = consistency_step(scheduler, model_output, t, sample)
        expected = reference_step(reference, i, model_output, sample)
        torch.testing.assert_close(out.pred_original_sample, expected.denoised)
        if i < len(timesteps) - 1:
            alpha_prev = scheduler.alphas_cumprod[timesteps[i + 1]]
            torch.testing.assert_close(out.mean / alpha_prev.sqrt(), expected.denoised)
            torch.testing.assert_close(out.std, (1 - alpha_prev).sqrt().expand(3, 1, 1, 1))
        else:
            torch.testing.assert_close(out.prev_sample, expected.prev_sample)
            assert (out.std == 0).all() and (out.log_prob == 0).all()
    assert scheduler.step_index is None


def test_sampled_step_equals_diffusers_with_the_same_generator():
    scheduler, reference = make_scheduler(), make_scheduler()
    sample, model_output = torch.randn(SHAPE), torch.randn(SHAPE)
    out = consistency_step(
        scheduler, model_output, scheduler.timesteps[1], sample, generator=torch.Generator().manual_seed(5)
    )
    expected = reference_step(reference, 1, model_output, sample, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(out.prev_sample, expected.prev_sample)


def test_clip_sample_matches_diffusers():
    scheduler = make_scheduler(prediction_type="sample", clip_sample=True, clip_sample_range=1.0)
    reference = make_scheduler(prediction_type="sample", clip_sample=True, clip_sample_range=1.0)
    sample, model_output = torch.randn(SHAPE), 3 * torch.randn(SHAPE)
    out = consistency_step(scheduler, model_output, scheduler.timesteps[0], sample)
    unclipped = consistency_step(
        make_scheduler(prediction_type="sample"), model_output, scheduler.timesteps[0], sample
    )
    assert not torch.allclose(out.pred_original_sample, unclipped.pred_original_sample)
    torch.testing.assert_close(
        out.pred_original_sample, reference_step(reference, 0, model_output, sample).denoised
    )


def test_log_prob_is_exact_gaussian_density_and_rescoring_is_exact():
    scheduler = make_scheduler()
    t = scheduler.timesteps[0]
    sample, model_output, other = torch.randn(SHAPE), torch.randn(SHAPE), torch.randn(SHAPE)
    out = consistency_step(scheduler, model_output, t, sample)
    expected = Normal(out.mean, out.std).log_prob(out.prev_sample).sum(dim=(1, 2, 3))
    torch.testing.assert_close(out.log_prob, expected)
    assert torch.equal(out.kl_std, out.std)
    rescored = consistency_step(scheduler, model_output, t, sample, prev_sample=out.prev_sample)
    assert torch.equal(rescored.log_prob, out.log_prob)
    given = consistency_step(scheduler, model_output, t, sample, prev_sample=other)
    torch.testing.assert_close(
        given.log_prob, Normal(given.mean, given.std).log_prob(other).sum(dim=(1, 2, 3))
    )


def test_batched_heterogeneous_timesteps_equal_per_sample_calls():
    scheduler = make_scheduler()
    timesteps = scheduler.timesteps[[0, 2, NUM_STEPS - 1]]  # includes the deterministic last step
    sample, model_output = torch.randn(SHAPE), torch.randn(SHAPE)
    generators = [torch.Generator().manual_seed(seed) for seed in range(3)]
    batched = consistency_step(scheduler, model_output, timesteps, sample, generator=generators)
    assert batched.log_prob[2] == 0 and (batched.log_prob[:2] != 0).all()
    for i in range(3):
        single = consistency_step(
            scheduler,
            model_output[i : i + 1],
            int(timesteps[i]),
            sample[i : i + 1],
            generator=torch.Generator().manual_seed(i),
        )
        torch.testing.assert_close(batched.mean[i : i + 1], single.mean)
        torch.testing.assert_close(batched.std[i : i + 1], single.std)
        torch.testing.assert_close(batched.prev_sample[i : i + 1], single.prev_sample)
        torch.testing.assert_close(batched.log_prob[i : i + 1], single.log_prob)


def test_one_step_schedule_is_deterministic():
    scheduler = make_scheduler(num_inference_steps=1)
    sample, model_output = torch.randn(SHAPE), torch.randn(SHAPE)
    generator = torch.Generator().manual_seed(0)
    out = consistency_step(scheduler, model_output, scheduler.timesteps[0], sample, generator=generator)
    assert torch.equal(out.prev_sample, out.pred_original_sample) and (out.log_prob == 0).all()
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(0).get_state())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_compute_in_fp32(dtype):
    scheduler = make_scheduler()
    t = scheduler.timesteps[1]
    sample, model_output = torch.randn(SHAPE).to(dtype), torch.randn(SHAPE).to(dtype)
    low = consistency_step(scheduler, model_output, t, sample, generator=torch.Generator().manual_seed(0))
    full = consistency_step(
        scheduler, model_output.float(), t, sample.float(), generator=torch.Generator().manual_seed(0)
    )
    assert low.prev_sample.dtype == dtype
    assert low.mean.dtype == low.std.dtype == low.log_prob.dtype == torch.float32
    assert torch.equal(low.mean, full.mean)
    torch.testing.assert_close(low.prev_sample, full.prev_sample.to(dtype))
    rescored = consistency_step(scheduler, model_output, t, sample, prev_sample=low.prev_sample)
    assert torch.equal(rescored.log_prob, low.log_prob)


def test_generator_determinism():
    scheduler = make_scheduler()
    t = scheduler.timesteps[0]
    sample, model_output = torch.randn(SHAPE), torch.randn(SHAPE)
    first = consistency_step(scheduler, model_output, t, sample, generator=torch.Generator().manual_seed(1))
    second = consistency_step(scheduler, model_output, t, sample, generator=torch.Generator().manual_seed(1))
    third = consistency_step(scheduler, model_output, t, sample, generator=torch.Generator().manual_seed(2))
    assert torch.equal(first.prev_sample, second.prev_sample)
    assert not torch.equal(first.prev_sample, third.prev_sample)


def test_rejects_timestep_outside_the_schedule():
    scheduler = make_scheduler()
    sample = torch.randn(SHAPE)
    with pytest.raises(ValueError, match="not in scheduler.timesteps"):
        consistency_step(scheduler, sample, 500, sample)


# RLCM's patched LCMScheduler.set_timesteps, worked out by hand: the 50 LCM training timesteps
# 20 k - 1 (k = 1..50) walked from 999 with stride 50 // n, the first n kept
RLCM_SCHEDULES = {
    8: [999, 879, 759, 639, 519, 399, 279, 159],
    4: [999, 759, 519, 279],
    2: [999, 499],
    1: [999],
    3: [999, 679, 359],
}
DIFFUSERS_8 = [999, 879, 759, 639, 499, 379, 259, 139]


@pytest.mark.parametrize("steps", sorted(RLCM_SCHEDULES))
def test_rlcm_timesteps_are_the_patched_schedule(steps):
    assert rlcm_timesteps(steps) == RLCM_SCHEDULES[steps]
    if steps == 8:  # where diffusers' LCMScheduler differs: the tail
        assert make_scheduler(8).timesteps.tolist() == DIFFUSERS_8
    with pytest.raises(ValueError, match="num_inference_steps"):
        rlcm_timesteps(51)


def test_final_noise_scores_the_renoised_last_step_as_a_gaussian():
    """RLCM's last step: t' = t, x = sqrt(a_t) f + sqrt(1 - a_t) z, its Gaussian counted."""
    scheduler = make_scheduler(num_inference_steps=8)
    scheduler.set_timesteps(timesteps=RLCM_SCHEDULES[8])
    t = 159
    sample, model_output = torch.randn(SHAPE), torch.randn(SHAPE)
    generator = torch.Generator().manual_seed(3)
    out = consistency_step(scheduler, model_output, t, sample, generator=generator, final_noise=True)

    # by hand: the eps-model x0, the boundary scalings at t, the re-noising to t itself
    a_t = scheduler.alphas_cumprod[t].double()
    x, eps = sample.double(), model_output.double()
    x0 = (x - (1 - a_t).sqrt() * eps) / a_t.sqrt()
    scaled = t * 10.0
    c_skip, c_out = 0.25 / (scaled**2 + 0.25), scaled / (scaled**2 + 0.25) ** 0.5
    denoised = c_out * x0 + c_skip * x
    mean, std = a_t.sqrt() * denoised, (1 - a_t).sqrt()
    expected = Normal(mean, std).log_prob(out.prev_sample.double()).sum(dim=(1, 2, 3))
    torch.testing.assert_close(out.pred_original_sample.double(), denoised, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.log_prob.double(), expected, rtol=1e-5, atol=1e-3)
    assert (out.log_prob != 0).all() and (out.std > 0).all()
    noise = (out.prev_sample.double() - mean) / std  # the draw is N(0, 1) noise from the generator
    torch.testing.assert_close(
        noise.float(), torch.randn(SHAPE, generator=torch.Generator().manual_seed(3)), rtol=1e-3, atol=1e-3
    )
    # the default keeps the last step deterministic; other steps are unchanged by the option
    plain = consistency_step(scheduler, model_output, t, sample)
    assert (plain.log_prob == 0).all() and torch.equal(plain.prev_sample, plain.pred_original_sample)
    first = [consistency_step(scheduler, model_output, 999, sample, final_noise=f) for f in (False, True)]
    assert torch.equal(first[0].mean, first[1].mean) and torch.equal(first[0].std, first[1].std)
