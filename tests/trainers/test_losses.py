"""The ppo_clip loss's KL penalty in Flow-GRPO's official units and in exact units (issue 20).

flow_grpo (``train_sd3.py`` and ``diffusers_patch/sd3_sde_with_logprob.py``) computes, per trained
step, ``((mean - mean_ref) ** 2).mean(dim=(1, 2, 3)) / (2 * std_dev_t ** 2)`` with
``std_dev_t = noise_level * sqrt(sigma / (1 - sigma))`` (``sigma_max = sigmas[1]`` replacing
``sigma`` in the denominator at ``sigma == 1``), no ``sqrt(-dt)``; the exact KL of the two
Gaussian steps divides by the step variance ``std_dev_t**2 * (-dt)`` instead. Both are written out
here from those formulas, on a real diffusers scheduler's sigmas.
"""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from genalign.sampling import flow_sde_step
from genalign.trainers.config import TrainConfig
from genalign.trainers.losses import PPOClipLoss, with_reference_kl

SHAPE = (3, 4, 8, 8)  # (B, C, H, W)
NUM_STEPS = 10


def sd3_scheduler() -> FlowMatchEulerDiscreteScheduler:
    """SD3 / SD3.5's scheduler config (shift 3.0) on Flow-GRPO's 10-step training schedule."""
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    scheduler.set_timesteps(NUM_STEPS)
    return scheduler


class TwoVelocityPolicy:
    """A stand-in policy: the trained and the reference model are two fixed velocity fields."""

    def __init__(self, scheduler, sample, prev_sample, v_theta, v_ref, noise_level, mode):
        self.scheduler, self.sample, self.prev_sample = scheduler, sample, prev_sample
        self.v_theta, self.v_ref, self.noise_level, self.mode = v_theta, v_ref, noise_level, mode
        self.in_reference = False

    @contextlib.contextmanager
    def reference(self):
        self.in_reference = True
        try:
            yield self
        finally:
            self.in_reference = False

    def step(self, trajectory, step_index):
        velocity = self.v_ref if self.in_reference else self.v_theta
        return flow_sde_step(
            self.scheduler, velocity, step_index, self.sample, self.noise_level, self.mode, self.prev_sample
        )


def flow_grpo_mean(sample, velocity, sigma, sigma_next, sigma_max, noise_level):
    """flow_grpo's ``sde_step_with_logprob`` mean (SDE type "sde"), and its ``std_dev_t``."""
    std_dev_t = noise_level * math.sqrt(sigma / (1 - (sigma_max if sigma == 1 else sigma)))
    dt = sigma_next - sigma
    mean = (
        sample * (1 + std_dev_t**2 / (2 * sigma) * dt)
        + velocity * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    )
    return mean, std_dev_t


def kl_metric(convention: str, policy, step: int, reduction: str = "mean") -> torch.Tensor:
    config = TrainConfig(kl_coef=0.04, kl_convention=convention, kl_reduction=reduction)
    batch = SHAPE[0]
    trajectory = SimpleNamespace(
        batch_size=batch,
        log_probs=torch.zeros(batch, NUM_STEPS),
        latents=torch.zeros(batch, NUM_STEPS + 1, *SHAPE[1:]),
    )
    _, metrics = PPOClipLoss(config)(policy, trajectory, torch.full((batch,), step), torch.zeros(batch))
    return metrics["kl"]


@pytest.mark.parametrize("noise_level", [0.7, 1.0])
def test_official_kl_equals_flow_grpo_and_exact_is_one_over_dt_larger(noise_level):
    scheduler = sd3_scheduler()
    sigmas = scheduler.sigmas.tolist()
    generator = torch.Generator().manual_seed(0)
    sample, prev_sample, v_theta, v_ref = (torch.randn(SHAPE, generator=generator) for _ in range(4))
    policy = TwoVelocityPolicy(scheduler, sample, prev_sample, v_theta, v_ref, noise_level, "sde")
    for i in range(NUM_STEPS):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        mean, std_dev_t = flow_grpo_mean(
            sample.double(), v_theta.double(), sigma, sigma_next, sigmas[1], noise_level
        )
        mean_ref, _ = flow_grpo_mean(
            sample.double(), v_ref.double(), sigma, sigma_next, sigmas[1], noise_level
        )
        official = (((mean - mean_ref) ** 2).mean(dim=(1, 2, 3)) / (2 * std_dev_t**2)).mean()
        ours = kl_metric("official", policy, i)
        assert ours.item() / official.item() == pytest.approx(1.0, rel=1e-5)
        exact = kl_metric("exact", policy, i)
        assert exact.item() / ours.item() == pytest.approx(1 / (sigma - sigma_next), rel=1e-5)
        # kl_reduction is independent of the convention: sum = mean * elements per sample
        summed = kl_metric("official", policy, i, reduction="sum")
        assert summed.item() == pytest.approx(ours.item() * math.prod(SHAPE[1:]), rel=1e-5)


def test_conventions_agree_for_cps():
    scheduler = sd3_scheduler()
    generator = torch.Generator().manual_seed(1)
    sample, prev_sample, v_theta, v_ref = (torch.randn(SHAPE, generator=generator) for _ in range(4))
    policy = TwoVelocityPolicy(scheduler, sample, prev_sample, v_theta, v_ref, 0.7, "cps")
    for i in range(NUM_STEPS - 1):  # the CPS step to sigma = 0 is deterministic: no KL there
        assert kl_metric("official", policy, i).item() == kl_metric("exact", policy, i).item()


@pytest.mark.parametrize("convention", ["official", "exact"])
def test_cps_ratio_as_flow_grpo_scores_a_cps_step(convention):
    # flow_grpo's CPS branch: log_prob = -((prev_sample - prev_sample_mean) ** 2).mean(dims), no
    # 1 / (2 std^2) and no constants; "exact" is the Gaussian density's ratio per element
    scheduler = sd3_scheduler()
    generator = torch.Generator().manual_seed(2)
    sample, prev_sample, v_theta, v_old = (torch.randn(SHAPE, generator=generator) for _ in range(4))
    v_theta = v_old + 0.05 * v_theta
    policy = TwoVelocityPolicy(scheduler, sample, prev_sample, v_theta, v_old, 0.7, "cps")
    batch, dims = SHAPE[0], math.prod(SHAPE[1:])
    for i in (0, 4, 8):
        old = flow_sde_step(scheduler, v_old, i, sample, 0.7, "cps", prev_sample)
        new = flow_sde_step(scheduler, v_theta, i, sample, 0.7, "cps", prev_sample)
        log_probs = torch.zeros(batch, NUM_STEPS)
        log_probs[:, i] = old.log_prob
        trajectory = SimpleNamespace(
            batch_size=batch,
            log_probs=log_probs,
            latents=torch.zeros(batch, NUM_STEPS + 1, *SHAPE[1:]),
            settings=SimpleNamespace(mode="cps"),
        )
        config = TrainConfig(cps_log_prob=convention, clip_range=0.9)
        _, metrics = PPOClipLoss(config)(policy, trajectory, torch.full((batch,), i), torch.ones(batch))
        if convention == "official":
            dims_ = (1, 2, 3)
            log_ratio = -((prev_sample - new.mean) ** 2).mean(dims_) + ((prev_sample - old.mean) ** 2).mean(
                dims_
            )
        else:
            log_ratio = (new.log_prob - old.log_prob) / dims
        assert metrics["ratio"].item() == pytest.approx(log_ratio.exp().mean().item(), rel=1e-5)
        assert (log_ratio.abs() > 1e-6).all()


def test_policy_loss_declares_every_hook_with_a_no_op_default():
    from genalign.trainers.losses import FunctionLoss, PolicyLoss, as_policy_loss

    with pytest.raises(TypeError, match="abstract"):
        PolicyLoss()

    def plain(policy, trajectory, step_index, advantages):
        return torch.tensor(2.0), {"policy_loss": torch.tensor(2.0)}

    loss = as_policy_loss(plain)
    assert isinstance(loss, FunctionLoss) and as_policy_loss(loss) is loss
    assert loss(None, None, None, None)[0].item() == 2.0
    loss.bind(SimpleNamespace())
    loss.begin_step(3)
    with loss.rollout_policy(SimpleNamespace(), 3):
        pass
    assert loss.forward_process is False and loss.train_steps(10) is None
    assert loss.end_step(SimpleNamespace(), 3) == {} and loss.state_dict() == {}
    loss.load_state_dict({})
    ppo = PPOClipLoss(TrainConfig())
    assert as_policy_loss(ppo) is ppo


class _HalvingPolicy:
    """A stand-in policy whose reference model predicts x_t / 2."""

    @contextlib.contextmanager
    def reference(self):
        yield self

    def predict(self, x_t, step_index, conditioning, settings):
        return x_t / 2


def test_with_reference_kl_adds_the_weighted_output_distance():
    output = torch.tensor([[1.0, 3.0], [0.0, 2.0]])
    x_t = torch.tensor([[2.0, 2.0], [2.0, 2.0]])  # reference output: all ones
    loss, metrics = with_reference_kl(
        torch.tensor(1.0), {"policy_loss": 1.0}, 0.5, _HalvingPolicy(), output, x_t, None, {}, None
    )
    kl = torch.tensor([(0.0 + 4.0) / 2, (1.0 + 1.0) / 2])  # per-sample mean squared distance
    assert torch.allclose(loss, 1.0 + 0.5 * kl.mean())
    assert torch.allclose(metrics["kl"], kl.mean()) and metrics["policy_loss"] == 1.0
    unchanged = with_reference_kl(torch.tensor(1.0), {}, 0.0, None)  # no reference pass at 0
    assert unchanged[1] == {} and unchanged[0].item() == 1.0
