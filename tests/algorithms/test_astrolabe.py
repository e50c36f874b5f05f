"""Astrolabe's loss math (#26 item 2) against hand computations: advantages with the batch std,
r, the minibatch noise level, the x0-space loss and its per-sample reduction, the (selective) KL
term, the reduction to DiffusionNFT's x0 form, and the old policy's eta and soft update."""

from __future__ import annotations

import math

import pytest
import torch

from genalign.algorithms import (
    ASTROLABE_TIMESTEPS,
    astrolabe_advantages,
    astrolabe_loss,
    astrolabe_old_policy_decay,
    chunked_masked_mean,
    flow_forward_noise,
    frame_timesteps,
    masked_sample_mean,
    nft_loss_in_x0,
    sample_noise_level,
    soft_update_,
)

# -- advantages ----------------------------------------------------------------------------------------


def test_advantages_centre_per_prompt_and_divide_by_the_batch_std():
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dtype=torch.float64)
    prompts = ["a", "a", "a", "b", "b", "b"]
    # prompt means 2 and 5; population std of 1..6 is sqrt(35 / 12)
    std = math.sqrt(35 / 12) + 1e-4
    expected = [-1 / std, 0.0, 1 / std, -1 / std, 0.0, 1 / std]
    assert astrolabe_advantages(rewards, prompts).tolist() == pytest.approx(expected, abs=1e-12)


def test_advantages_are_clipped():
    rewards = torch.tensor([0.0, 100.0, 50.0, 50.0], dtype=torch.float64)
    # std of the batch: sqrt((50^2 + 50^2) / 4) = 35.355...; A = +-50 / 35.355 = +-1.414 -> +-1
    advantages = astrolabe_advantages(rewards, ["a", "a", "b", "b"], advantage_clip=1.0)
    assert advantages.tolist() == [-1.0, 1.0, 0.0, 0.0]


# -- the noise level -----------------------------------------------------------------------------------


def test_noise_level_is_one_grid_value_replayed_by_the_generator():
    draws = [sample_noise_level(torch.Generator().manual_seed(s)) for s in range(200)]
    assert {timestep for timestep, _ in draws} == set(ASTROLABE_TIMESTEPS)  # every level is reached
    assert all(t == timestep / 1000 for timestep, t in draws)
    again = [sample_noise_level(torch.Generator().manual_seed(s)) for s in range(200)]
    assert again == draws
    assert sample_noise_level(torch.Generator().manual_seed(0), timesteps=(600,)) == (600, 0.6)


def test_frame_timesteps_share_one_level_over_every_frame():
    timesteps = frame_timesteps(750, batch_size=2, num_frames=21)
    assert timesteps.shape == (2, 21) and timesteps.dtype == torch.long
    assert (timesteps == 750).all()


def test_flow_forward_noise_is_the_rectified_flow_interpolation():
    x0, noise = torch.tensor([2.0, -4.0]), torch.tensor([1.0, 1.0])
    assert flow_forward_noise(x0, noise, 0.25).tolist() == [0.75 * 2 + 0.25, 0.75 * -4 + 0.25]
    assert torch.equal(flow_forward_noise(x0, noise, 1.0), noise)


# -- the loss ------------------------------------------------------------------------------------------


def _hand_loss(x0_theta, x0_old, x0_ref, x0, advantages, beta, kl_weight, mask=None):
    """The official formula written out over Python floats, element by element."""
    per_policy, per_kl = [], []
    for i in range(len(advantages)):
        a = min(max(advantages[i], -5.0), 5.0)
        r = min(max(a / 10 + 0.5, 0.0), 1.0)
        th, old, ref, clean = (v[i].flatten().tolist() for v in (x0_theta, x0_old, x0_ref, x0))
        n = len(clean)
        pos = sum((beta * p + (1 - beta) * o - c) ** 2 for p, o, c in zip(th, old, clean)) / n
        neg = sum(((1 + beta) * o - beta * p - c) ** 2 for p, o, c in zip(th, old, clean)) / n
        per_policy.append(r * pos + (1 - r) * neg)
        per_kl.append(sum((p - q) ** 2 for p, q in zip(th, ref)) / n)
    chosen = [k for k, m in zip(per_kl, mask if mask is not None else [True] * len(per_kl)) if m]
    kl = sum(chosen) / len(chosen) if chosen else 0.0
    return sum(per_policy) / len(per_policy) + kl_weight * kl, kl


def _video(seed: int, batch: int = 3, frames: int = 3):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, frames, 2, 2, 3)  # [B, F, C, H, W]
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(4)]


@pytest.mark.parametrize("kl_weight", [1e-4, 1e-3, 0.5])
def test_loss_matches_the_official_formula_by_hand(kl_weight):
    x0_theta, x0_old, x0_ref, x0 = _video(0)
    advantages = torch.tensor([-7.0, 1.5, 3.0], dtype=torch.float64)  # r = 0, 0.65, 0.8
    loss, info = astrolabe_loss(x0_theta, x0_old, x0_ref, x0, advantages, kl_weight=kl_weight)
    expected, kl = _hand_loss(x0_theta, x0_old, x0_ref, x0, advantages.tolist(), 0.1, kl_weight)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert info["astrolabe_kl_loss"].item() == pytest.approx(kl, rel=1e-12)
    assert info["nft_r"].item() == pytest.approx((0 + 0.65 + 0.8) / 3)


def test_selective_mask_averages_the_kl_over_the_selected_samples_only():
    x0_theta, x0_old, x0_ref, x0 = _video(1, batch=4)
    advantages = torch.tensor([0.5, -0.5, 2.0, 0.0], dtype=torch.float64)
    mask = torch.tensor([False, True, False, True])
    loss, info = astrolabe_loss(x0_theta, x0_old, x0_ref, x0, advantages, kl_weight=0.3, kl_mask=mask)
    expected, kl = _hand_loss(x0_theta, x0_old, x0_ref, x0, advantages.tolist(), 0.1, 0.3, mask.tolist())
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert info["astrolabe_kl_loss"].item() == pytest.approx(kl, rel=1e-12)
    assert info["astrolabe_kl_fraction"].item() == 0.5


def test_an_empty_selection_gives_zero_kl_inside_the_graph():
    x0_theta, x0_old, x0_ref, x0 = _video(2, batch=2)
    x0_theta.requires_grad_(True)
    advantages = torch.zeros(2, dtype=torch.float64)
    loss, info = astrolabe_loss(
        x0_theta, x0_old, x0_ref, x0, advantages, kl_weight=1.0, kl_mask=torch.zeros(2, dtype=torch.bool)
    )
    no_kl, _ = astrolabe_loss(x0_theta, x0_old, x0_ref, x0, advantages, kl_weight=0.0)
    assert info["astrolabe_kl_loss"].item() == 0.0
    assert loss.item() == no_kl.item()
    assert masked_sample_mean(
        torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([False, False])
    ).grad_fn


def test_the_kl_mean_per_device_batch_as_the_official_gpus_average_it():
    # the official: masked mean within each GPU's 3 samples (0 where none is selected), DDP
    # averages the GPUs. 24 rows, one selected: its KL / 8, not the KL itself
    kl = torch.arange(1.0, 25.0, dtype=torch.float64)
    one = torch.zeros(24, dtype=torch.bool)
    one[13] = True
    assert chunked_masked_mean(kl, one, 3).item() == pytest.approx(14.0 / 8)
    assert chunked_masked_mean(kl, one).item() == 14.0
    # by hand: chunks {1,2,3} {4,5,6} {7} with the mask T F T | F F F | T
    mask = torch.tensor([True, False, True, False, False, False, True])
    assert chunked_masked_mean(kl[:7], mask, 3).item() == pytest.approx((2.0 + 0.0 + 7.0) / 3)
    # no mask, equal chunks: the plain mean
    assert chunked_masked_mean(kl, None, 4).item() == pytest.approx(kl.mean().item())
    # through the loss: the KL term reported and added is the chunked one
    x0_theta, x0_old, x0_ref, x0 = _video(2, batch=6)
    advantages = torch.zeros(6, dtype=torch.float64)
    mask = torch.tensor([True, True, False, False, False, True])
    loss, info = astrolabe_loss(
        x0_theta, x0_old, x0_ref, x0, advantages, kl_weight=0.5, kl_mask=mask, kl_chunk_size=2
    )
    no_kl, _ = astrolabe_loss(x0_theta, x0_old, x0_ref, x0, advantages, kl_weight=0.0)
    per = ((x0_theta - x0_ref) ** 2).mean(dim=(1, 2, 3, 4))
    expected = ((per[0] + per[1]) / 2 + 0.0 + per[5]) / 3
    assert info["astrolabe_kl_loss"].item() == pytest.approx(expected.item(), rel=1e-12)
    assert loss.item() == pytest.approx(no_kl.item() + 0.5 * expected.item(), rel=1e-12)


def test_levels_one_a_sample_broadcast_over_frames_and_dims():
    levels = frame_timesteps(torch.tensor([1000, 250]), batch_size=2, num_frames=3)
    assert levels.tolist() == [[1000] * 3, [250] * 3] and levels.dtype == torch.long
    with pytest.raises(ValueError, match="3 levels for 2 samples"):
        frame_timesteps([1000, 750, 500], batch_size=2, num_frames=3)
    x0, eps = torch.ones(2, 1, 3, 2, 2), torch.zeros(2, 1, 3, 2, 2)
    x_t = flow_forward_noise(x0, eps, torch.tensor([1.0, 0.25]))
    assert x_t[0].unique().tolist() == [0.0] and x_t[1].unique().tolist() == [0.75]


def test_gradient_reaches_only_the_trained_prediction():
    x0_theta, x0_old, x0_ref, x0 = (v.requires_grad_(True) for v in _video(3, batch=2))
    loss, _ = astrolabe_loss(x0_theta, x0_old, x0_ref, x0, torch.tensor([1.0, -1.0], dtype=torch.float64))
    loss.backward()
    assert x0_theta.grad is not None and x0_theta.grad.abs().sum() > 0
    assert x0_old.grad is None and x0_ref.grad is None


def test_gradient_matches_the_derivative_by_hand():
    # one sample, one element: L = r (b p + (1-b) o - c)^2 + (1-r) ((1+b) o - b p - c)^2 + lam (p - q)^2
    p = torch.tensor([[0.7]], dtype=torch.float64, requires_grad=True)
    o, q, c = (torch.tensor([[v]], dtype=torch.float64) for v in (0.2, -0.4, 1.0))
    beta, lam, advantage = 0.1, 0.01, 2.0
    r = advantage / 10 + 0.5
    loss, _ = astrolabe_loss(p, o, q, c, torch.tensor([advantage]), beta=beta, kl_weight=lam)
    loss.backward()
    pos = beta * 0.7 + (1 - beta) * 0.2 - 1.0
    neg = (1 + beta) * 0.2 - beta * 0.7 - 1.0
    grad = 2 * r * pos * beta - 2 * (1 - r) * neg * beta + 2 * lam * (0.7 + 0.4)
    assert p.grad.item() == pytest.approx(grad, rel=1e-12)


def test_a_one_block_video_reduces_to_the_nft_x0_form():
    x0_theta, x0_old, x0_ref, x0 = _video(4, frames=3)  # one block of 3 latent frames
    advantages = torch.tensor([4.0, -2.0, 0.3], dtype=torch.float64)
    for adaptive, scaled in [(False, False), (True, True), (True, False), (False, True)]:
        loss, _ = astrolabe_loss(
            x0_theta, x0_old, x0_ref, x0, advantages, kl_weight=0.0,
            adaptive_weighting=adaptive, clip_over_beta=scaled,
        )  # fmt: skip
        per_sample, _ = nft_loss_in_x0(
            x0_theta, x0_old, x0, x0_theta, x0_old, x0, advantages,
            beta=0.1, adaptive_weighting=adaptive, clip_over_beta=scaled,
        )  # fmt: skip
        assert torch.equal(loss, per_sample.mean())
    # the NFT default still carries its c / beta factor
    plain, _ = nft_loss_in_x0(x0_theta, x0_old, x0, x0_theta, x0_old, x0, advantages, beta=0.1,
                              adaptive_weighting=False, clip_over_beta=False)  # fmt: skip
    scaled, _ = nft_loss_in_x0(x0_theta, x0_old, x0, x0_theta, x0_old, x0, advantages, beta=0.1,
                               adaptive_weighting=False)  # fmt: skip
    assert torch.allclose(scaled, plain * 50.0, rtol=1e-12)


# -- the old policy ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "eta"), [(0, 0.0), (1, 0.001), (100, 0.1), (499, 0.499), (500, 0.5), (10**4, 0.5)]
)
def test_old_policy_decay(steps, eta):
    assert astrolabe_old_policy_decay(steps) == pytest.approx(eta, abs=1e-15)


def test_soft_update_moves_the_old_parameters_in_place():
    old = [torch.nn.Parameter(torch.tensor([1.0, 2.0])), torch.tensor([[4.0]])]
    current = [torch.nn.Parameter(torch.tensor([3.0, 5.0])), torch.tensor([[0.0]])]
    soft_update_(old, current, 0.25)
    assert old[0].tolist() == [0.25 * 1 + 0.75 * 3, 0.25 * 2 + 0.75 * 5]
    assert old[1].tolist() == [[1.0]]
    assert current[0].tolist() == [3.0, 5.0]  # the source is untouched
    soft_update_(old, current, 0.0)  # eta 0 copies the current weights
    assert old[0].tolist() == [3.0, 5.0]
    with pytest.raises(ValueError, match="targets"):
        soft_update_(old, current[:1], 0.5)
    with pytest.raises(ValueError, match="shape"):
        soft_update_([torch.zeros(2)], [torch.zeros(3)], 0.5)
    with pytest.raises(ValueError, match="decay"):
        soft_update_(old, current, 1.5)
