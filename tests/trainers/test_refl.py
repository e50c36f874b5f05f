"""ReFL: the one-step x0 prediction of each family against its forward noising, the loss on a
tiny SD model against a manual recomputation, the reward and window checks, and a trainer run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genalign.algorithms.refl import refl_objective
from genalign.config import ConfigError
from genalign.rewards.base import Reward, RewardOutput
from genalign.trainers import LOSSES, build_trainer, load_recipe
from genalign.trainers.config import TrainConfig
from genalign.trainers.losses.refl import ReFLLoss
from genalign.trainers.method_config import ReFLConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


class Redness(Reward):
    """A differentiable toy reward: mean red minus mean green and blue."""

    name = "redness"
    differentiable = True

    def score(self, images, prompts, **metadata):
        return RewardOutput(scores=images[:, 0].mean((1, 2)) - images[:, 1:].mean((1, 2, 3)))


class Frozen(Redness):
    differentiable = False


def test_config_and_window_are_validated():
    with pytest.raises(ConfigError, match="train.refl.max_step"):
        ReFLConfig(min_step=5, max_step=2)
    with pytest.raises(ConfigError, match="train.refl.scale"):
        ReFLConfig(scale=0.0)
    assert "refl" in LOSSES.names()
    loss_fn = ReFLLoss(TrainConfig(refl=ReFLConfig(min_step=2, max_step=20)))
    assert loss_fn.train_steps(6).tolist() == [2, 3, 4, 5]
    assert ReFLLoss(TrainConfig()).train_steps(4).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="min_step 7"):
        ReFLLoss(TrainConfig(refl=ReFLConfig(min_step=7))).train_steps(4)


def test_refuses_a_reward_without_gradients():
    from types import SimpleNamespace

    loss_fn = ReFLLoss(TrainConfig())
    with pytest.raises(ValueError, match="differentiable reward, but Frozen"):
        loss_fn.bind(SimpleNamespace(reward=Frozen()))
    with pytest.raises(RuntimeError, match="no reward"):
        loss_fn(None, None, torch.tensor([0]), torch.tensor([0.0]))


@pytest.mark.parametrize("guided", [True, False])
def test_loss_on_an_sd_policy_equals_a_manual_recomputation(sd_policy, guided):
    from types import SimpleNamespace

    policy = sd_policy
    loss_fn = ReFLLoss(TrainConfig(refl=ReFLConfig(guided=guided, scale=2.0)))
    loss_fn.bind(SimpleNamespace(reward=Redness()))
    trajectory = policy.rollout(
        ["a red circle", "a blue square"],
        seeds=torch.tensor([3, 4]),
        num_inference_steps=4,
        guidance_scale=3.0,
    )
    for name, parameter in policy.denoiser.named_parameters():
        if "lora_B" in name:
            parameter.data.normal_(0, 0.05)
    step_index = torch.tensor([1, 3])
    loss, metrics = loss_fn(policy, trajectory, step_index, torch.zeros(2))

    # by hand: the UNet at the stored x_t, DDIM's predicted x0, the VAE, the reward
    scheduler, unet, vae = policy.scheduler, policy.pipeline.unet, policy.pipeline.vae
    t = scheduler.timesteps[step_index]
    x_t = trajectory.latents[torch.arange(2), step_index]
    cond = trajectory.conditioning
    with torch.no_grad():
        eps = unet(x_t, t, encoder_hidden_states=cond["prompt_embeds"]).sample
        if guided:
            uncond = unet(x_t, t, encoder_hidden_states=cond["negative_prompt_embeds"]).sample
            eps = uncond + 3.0 * (eps - uncond)
        abar = scheduler.alphas_cumprod[t].reshape(-1, 1, 1, 1)
        x0 = (x_t - (1 - abar).sqrt() * eps) / abar.sqrt()
        images = (vae.decode(x0 / vae.config.scaling_factor).sample / 2 + 0.5).clamp(0, 1)
        expected = Redness()(images, ["", ""]).scores
    torch.testing.assert_close(loss.detach(), -2.0 * expected.mean(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(metrics["refl_reward"], expected.mean(), rtol=1e-4, atol=1e-6)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())
    policy.zero_grad(set_to_none=True)


def test_a_gradient_step_raises_the_reward_of_the_same_prediction(sd_policy):
    """The loss is minus the reward: a small step along -grad raises it (the sign is right)."""
    from types import SimpleNamespace

    policy = sd_policy
    loss_fn = ReFLLoss(TrainConfig(refl=ReFLConfig()))
    loss_fn.bind(SimpleNamespace(reward=Redness()))
    trajectory = policy.rollout(["a cat", "a dog"], seeds=torch.tensor([5, 6]), num_inference_steps=4)
    step_index = torch.tensor([2, 2])
    loss, metrics = loss_fn(policy, trajectory, step_index, torch.zeros(2))
    loss.backward()
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter -= 1e-2 * parameter.grad / (parameter.grad.norm() + 1e-12)
    policy.zero_grad(set_to_none=True)
    with torch.no_grad():
        _, after = loss_fn(policy, trajectory, step_index, torch.zeros(2))
    assert after["refl_reward"] > metrics["refl_reward"]


def test_trainer_trains_refl_within_its_window(tmp_path, monkeypatch):
    recipe = ROOT / "configs" / "tiny" / "refl_clip.yaml"
    config = load_recipe(recipe, [f"logging.run_dir={tmp_path}/run", "train.num_steps=2"])
    seen: list[int] = []
    original = ReFLLoss.__call__

    def spy(self, policy, trajectory, step_index, advantages):
        seen.extend(step_index.tolist())
        return original(self, policy, trajectory, step_index, advantages)

    monkeypatch.setattr(ReFLLoss, "__call__", spy)
    trainer = build_trainer(config, base_dir=recipe.parent)
    initial = [p.detach().clone() for p in trainer.parameters]
    history = trainer.train()
    assert len(history) == 2 and all("refl_reward" in m for m in history)
    refl = config.train.refl
    assert seen and set(seen) <= set(range(refl.min_step, refl.max_step + 1))
    assert all(not torch.equal(a, b) for a, b in zip(initial, trainer.parameters))


class HalfNaN(Redness):
    def score(self, images, prompts, **metadata):
        scores = super().score(images, prompts).scores
        return RewardOutput(scores=torch.where(torch.arange(len(scores)) == 0, float("nan"), scores))


def test_nan_scores_are_left_out_of_the_loss(sd_policy):
    from types import SimpleNamespace

    policy = sd_policy
    loss_fn = ReFLLoss(TrainConfig(refl=ReFLConfig()))
    loss_fn.bind(SimpleNamespace(reward=HalfNaN()))
    trajectory = policy.rollout(["a cat", "a dog"], seeds=torch.tensor([5, 6]), num_inference_steps=4)
    loss, metrics = loss_fn(policy, trajectory, torch.tensor([2, 2]), torch.zeros(2))
    assert metrics["refl_nan_count"].item() == 1.0 and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in policy.trainable_parameters() if p.grad is not None)
    policy.zero_grad(set_to_none=True)
    both = ReFLLoss(TrainConfig(refl=ReFLConfig()))
    both.bind(
        SimpleNamespace(
            reward=type(
                "AllNaN",
                (Redness,),
                {"score": lambda self, i, p, **m: RewardOutput(scores=torch.full((len(i),), float("nan")))},
            )()
        )
    )
    loss, metrics = both(policy, trajectory, torch.tensor([2, 2]), torch.zeros(2))
    assert loss.item() == 0.0 and metrics["refl_nan_count"].item() == 2.0
    loss.backward()  # a zero loss still connected to the graph: the trainer's backward works


def test_method_and_loss_must_agree():
    recipe = ROOT / "configs" / "tiny" / "refl_clip.yaml"
    with pytest.raises(ConfigError, match="train.method 'refl' trains with train.loss 'refl'"):
        load_recipe(recipe, ["train.loss=ppo_clip"])


def test_relu_objective_is_imagereward_hinge_on_hand_numbers():
    """ImageReward's ReFL: loss = grad_scale * mean(ReLU(2 - r)), grad_scale 1e-3."""
    scores = torch.tensor([1.5, 2.5, -0.5, 2.0])
    # ReLU(2 - r) = 0.5, 0, 2.5, 0 -> mean 0.75 -> times 1e-3
    torch.testing.assert_close(refl_objective(scores, "relu", scale=1e-3), torch.tensor(0.75e-3))
    torch.testing.assert_close(refl_objective(scores, "relu", scale=1.0, margin=1.0), torch.tensor(0.375))
    torch.testing.assert_close(refl_objective(scores, "linear", scale=2.0), torch.tensor(-2.75))
    scores.requires_grad_(True)
    refl_objective(scores, "relu", scale=1e-3).backward()  # only samples below the margin push
    torch.testing.assert_close(scores.grad, torch.tensor([-0.25e-3, 0.0, -0.25e-3, 0.0]))
    with pytest.raises(ValueError, match="objective"):
        refl_objective(scores, "other")


def test_official_refl_settings_use_the_hinge_on_the_conditional_prediction(sd_policy):
    """guided=false, objective=relu, scale=1e-3: the loss equals 1e-3 * mean(ReLU(2 - r)) of the
    reward of the conditional UNet's x0 prediction, computed here by hand."""
    from types import SimpleNamespace

    policy = sd_policy
    refl = ReFLConfig(guided=False, objective="relu", scale=1e-3, margin=2.0)
    loss_fn = ReFLLoss(TrainConfig(refl=refl))
    loss_fn.bind(SimpleNamespace(reward=Redness()))
    trajectory = policy.rollout(
        ["a red circle", "a blue square"],
        seeds=torch.tensor([7, 8]),
        num_inference_steps=4,
        guidance_scale=4.5,
    )
    step_index = torch.tensor([2, 3])
    with torch.no_grad():
        loss, _ = loss_fn(policy, trajectory, step_index, torch.zeros(2))
        scheduler, unet = policy.scheduler, policy.pipeline.unet
        t = scheduler.timesteps[step_index]
        x_t = trajectory.latents[torch.arange(2), step_index]
        eps = unet(x_t, t, encoder_hidden_states=trajectory.conditioning["prompt_embeds"]).sample
        abar = scheduler.alphas_cumprod[t].reshape(-1, 1, 1, 1)
        x0 = (x_t - (1 - abar).sqrt() * eps) / abar.sqrt()
        vae = policy.pipeline.vae
        images = (vae.decode(x0 / vae.config.scaling_factor).sample / 2 + 0.5).clamp(0, 1)
        rewards = images[:, 0].mean((1, 2)) - images[:, 1:].mean((1, 2, 3))
    expected = 1e-3 * torch.clamp(2.0 - rewards, min=0).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-9)
