"""Reward-weighted regression: the weights, each family's forward noising against diffusers'
schedulers, the loss on tiny models against a manual recomputation, and a trainer run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from genalign.algorithms.rwr import rwr_weights
from genalign.config import ConfigError
from genalign.trainers import LOSSES, build_trainer, load_recipe
from genalign.trainers.config import TrainConfig
from genalign.trainers.losses import conditional_settings, seeded_noise
from genalign.trainers.losses.rwr import RWRLoss
from genalign.trainers.method_config import RWRConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def test_weights_are_ddpos_exponential_and_sparse_forms():
    advantages = torch.tensor([-2.0, -0.5, 0.0, 0.7, 3.0])
    expected = [math.exp(0.5 * a) for a in advantages.tolist()]
    torch.testing.assert_close(rwr_weights(advantages, "exp", beta=0.5), torch.tensor(expected))
    assert rwr_weights(advantages, "sparse", threshold=0.0).tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert rwr_weights(advantages, "sparse", threshold=1.0).tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="weighting 'softmax'"):
        rwr_weights(advantages, "softmax")


def test_config_is_validated_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="train.rwr.beta"):
        RWRConfig(beta=0.0)
    assert "rwr" in LOSSES.names()
    recipe = ROOT / "configs" / "tiny" / "rwr_jpeg.yaml"
    with pytest.raises(ConfigError, match="weighting"):
        load_recipe(recipe, ["train.rwr.weighting=softmax"])
    with pytest.raises(ConfigError, match="temperature"):
        load_recipe(recipe, ["train.rwr.temperature=2"])


@pytest.mark.parametrize(("weighting", "guided"), [("exp", False), ("sparse", False), ("exp", True)])
def test_loss_on_an_sd_policy_equals_a_manual_recomputation(sd_policy, weighting, guided):
    policy = sd_policy
    rwr = RWRConfig(weighting=weighting, beta=0.7, guided=guided)
    config = TrainConfig(group_size=2, minibatch_size=2, rwr=rwr)
    loss_fn = RWRLoss(config)
    trajectory = policy.rollout(
        ["a red circle", "a blue square", "a cat"],
        seeds=torch.tensor([3, 4, 5]),
        num_inference_steps=4,
        guidance_scale=3.0,
        eta=1.0,
    )
    for name, parameter in policy.denoiser.named_parameters():
        if "lora_B" in name:
            parameter.data.normal_(0, 0.05)
    step_index = torch.tensor([0, 2, 3])
    advantages = torch.tensor([1.5, -0.4, 0.2])
    loss, metrics = loss_fn(policy, trajectory, step_index, advantages)

    # by hand: diffusers' add_noise, the UNet's conditional branch (or the guided output the
    # rollout sampled with), the epsilon target
    scheduler = policy.scheduler
    t = scheduler.timesteps[step_index]
    x0 = trajectory.latents[:, -1].float()
    eps = seeded_noise(trajectory.seeds, step_index, x0.shape[1:])
    x_t = scheduler.add_noise(x0, eps, t)
    unet, cond = policy.pipeline.unet, trajectory.conditioning
    with torch.no_grad():
        out = unet(x_t, t, encoder_hidden_states=cond["prompt_embeds"]).sample
        if guided:
            uncond = unet(x_t, t, encoder_hidden_states=cond["negative_prompt_embeds"]).sample
            out = uncond + 3.0 * (out - uncond)
    errors = ((out - eps) ** 2).mean(dim=(1, 2, 3))
    if weighting == "exp":
        weights = torch.exp(0.7 * advantages)
    else:
        weights = (advantages >= 0).float()
    torch.testing.assert_close(loss.detach(), (weights * errors).mean(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(metrics["rwr_denoise_loss"], errors.mean(), rtol=1e-5, atol=1e-7)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())
    policy.zero_grad(set_to_none=True)
    # the noise is a function of (sample seed, step index) only
    assert torch.equal(eps, seeded_noise(trajectory.seeds, step_index, x0.shape[1:]))
    assert not torch.equal(eps, seeded_noise(trajectory.seeds, torch.tensor([1, 2, 3]), x0.shape[1:]))


def test_sparse_weights_give_plain_fine_tuning_on_the_kept_samples(sd_policy):
    """w = 1[A >= 0] over three samples is the denoising loss of the kept two, times 2/3."""
    policy = sd_policy
    loss_fn = RWRLoss(TrainConfig(group_size=2, minibatch_size=2, rwr=RWRConfig(weighting="sparse")))
    trajectory = policy.rollout(
        ["a red circle", "a blue square", "a cat"], seeds=torch.tensor([7, 8, 9]), num_inference_steps=4
    )
    step_index = torch.tensor([1, 1, 2])
    loss, _ = loss_fn(policy, trajectory, step_index, torch.tensor([0.5, -1.0, 0.0]))
    grads = torch.autograd.grad(loss, policy.trainable_parameters(), allow_unused=True)
    kept = trajectory.select([0, 2])
    plain, _ = loss_fn(policy, kept, step_index[[0, 2]], torch.tensor([0.0, 0.0]))
    plain_grads = torch.autograd.grad(plain * 2 / 3, policy.trainable_parameters(), allow_unused=True)
    for a, b in zip(grads, plain_grads):
        if a is None or b is None:
            assert a is None and b is None
        else:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-8)
    # no sample kept: no gradient at all
    empty, metrics = loss_fn(policy, trajectory, step_index, torch.tensor([-1.0, -2.0, -0.5]))
    assert empty.item() == 0.0 and metrics["rwr_kept"].item() == 0.0


def test_conditional_settings_drop_cfg_but_keep_an_embedded_guidance(sd_policy):
    trajectory = sd_policy.rollout(
        ["a cat"], seeds=torch.tensor([1]), num_inference_steps=2, guidance_scale=4.0
    )
    assert conditional_settings(sd_policy, trajectory.settings).guidance_scale == 1.0

    class Embedded:
        guidance_embedded = True

    assert conditional_settings(Embedded(), trajectory.settings).guidance_scale == 4.0


def test_trainer_runs_rwr_and_resumes(tmp_path):
    recipe = ROOT / "configs" / "tiny" / "rwr_jpeg.yaml"
    config = load_recipe(recipe, [f"logging.run_dir={tmp_path}/run", "train.num_steps=2"])
    trainer = build_trainer(config)
    initial = [p.detach().clone() for p in trainer.parameters]
    history = trainer.train()
    assert len(history) == 2 and all("rwr_denoise_loss" in m for m in history)
    assert all(not torch.equal(a, b) for a, b in zip(initial, trainer.parameters))
    # resuming continues from the checkpoint: one more step, from the trained weights
    trained = [p.detach().clone() for p in trainer.parameters]
    longer = load_recipe(
        recipe, [f"logging.run_dir={tmp_path}/run", "train.num_steps=3", "logging.resume=latest"]
    )
    resumed = build_trainer(longer)
    history = resumed.train()  # the restored steps and the new one
    assert [m["step"] for m in history] == [0, 1, 2] and resumed.step == 3
    assert all(not torch.equal(a, b) for a, b in zip(trained, resumed.parameters))
