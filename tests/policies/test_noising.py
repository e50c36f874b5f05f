"""Each family's forward noising (x_t and the regression target, for the RWR loss) against
diffusers' schedulers, and its one-step x0 prediction (for ReFL) as the inverse of it."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

from genalign.policies.flow import FlowPolicy
from genalign.policies.sd import SDPolicy


def scheduler_only(cls, scheduler):
    """A policy object with only a scheduler: forward_noise and predict_x0 read nothing else."""
    policy = cls.__new__(cls)
    torch.nn.Module.__init__(policy)
    policy.scheduler = scheduler
    return policy


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
def test_sd_forward_noise_matches_diffusers(prediction_type):
    scheduler = DDIMScheduler(num_train_timesteps=1000, prediction_type=prediction_type)
    scheduler.set_timesteps(10)
    policy = scheduler_only(SDPolicy, scheduler)
    x0, noise = torch.randn(3, 4, 6, 6), torch.randn(3, 4, 6, 6)
    step_index = torch.tensor([0, 4, 9])
    x_t, target = policy.forward_noise(x0, noise, step_index)
    t = scheduler.timesteps[step_index]
    torch.testing.assert_close(x_t, scheduler.add_noise(x0, noise, t))
    expected = {"epsilon": noise, "v_prediction": scheduler.get_velocity(x0, noise, t), "sample": x0}
    torch.testing.assert_close(target, expected[prediction_type])


def test_flow_forward_noise_matches_diffusers_and_x0_prediction_inverts_it():
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(6)
    policy = scheduler_only(FlowPolicy, scheduler)
    x0, noise = torch.randn(2, 4, 5, 5), torch.randn(2, 4, 5, 5)
    step_index = torch.tensor([1, 5])
    x_t, target = policy.forward_noise(x0, noise, step_index)
    for row, index in enumerate(step_index.tolist()):
        t = scheduler.timesteps[index : index + 1]
        torch.testing.assert_close(
            x_t[row : row + 1], scheduler.scale_noise(x0[row : row + 1], t, noise[row : row + 1])
        )
    torch.testing.assert_close(target, noise - x0)
    torch.testing.assert_close(policy.predict_x0(x_t, target, step_index), x0, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
def test_sd_x0_prediction_inverts_the_forward_noising(prediction_type):
    # no clipping of the predicted x0 (SD's own schedulers do not clip)
    scheduler = DDIMScheduler(num_train_timesteps=1000, prediction_type=prediction_type, clip_sample=False)
    scheduler.set_timesteps(10)
    policy = scheduler_only(SDPolicy, scheduler)
    x0, noise = torch.randn(3, 4, 6, 6, dtype=torch.float64), torch.randn(3, 4, 6, 6, dtype=torch.float64)
    step_index = torch.tensor([0, 5, 9])
    x_t, target = policy.forward_noise(x0, noise, step_index)
    torch.testing.assert_close(policy.predict_x0(x_t, target, step_index), x0.float(), rtol=1e-4, atol=1e-4)
    # the epsilon form is DDIM's "predicted x0" (diffusers' step output pred_original_sample)
    if prediction_type == "epsilon":
        t = int(scheduler.timesteps[5])
        expected = scheduler.step(target[1:2].float(), t, x_t[1:2].float()).pred_original_sample
        torch.testing.assert_close(policy.predict_x0(x_t, target, step_index)[1:2], expected)
