"""DiffusionNFT: the loss against a hand computation, its gradient direction, the old policy's
soft update and rollouts, and the loss on a tiny flow model against a manual recomputation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from genalign.algorithms.nft import nft_loss, nft_old_policy_decay, optimality_probability
from genalign.config import ConfigError
from genalign.policies import LoRASpec, load_policy
from genalign.trainers import LOSSES, load_recipe
from genalign.trainers.config import TrainConfig
from genalign.trainers.losses.nft import NFTLoss
from genalign.trainers.method_config import NFTConfig


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def test_optimality_probability_maps_clipped_advantages_to_unit_interval():
    advantages = torch.tensor([-10.0, -5.0, 0.0, 2.5, 10.0])
    assert optimality_probability(advantages, 5.0).tolist() == [0.0, 0.0, 0.5, 0.75, 1.0]


def test_old_policy_decay_is_the_papers_schedule():
    assert [nft_old_policy_decay(i) for i in (0, 1, 100, 499, 500, 5000)] == [
        0.0,
        0.001,
        0.1,
        0.499,
        0.5,
        0.5,
    ]
    assert nft_old_policy_decay(50, rate=0.0075, maximum=0.999, flat=75) == 0.0
    assert nft_old_policy_decay(175, rate=0.0075, maximum=0.999, flat=75) == pytest.approx(0.75)


def hand_nft(v_theta, v_old, x0, eps, t, advantages, beta, c, adaptive):
    """Eq. 7-8 element by element in velocity space: x0-space error = -t (v - v*)."""
    losses = []
    for i in range(len(t)):
        r = max(-c, min(c, advantages[i])) / (2 * c) + 0.5
        target = [e - x for e, x in zip(eps[i], x0[i])]
        positive = [beta * a + (1 - beta) * b for a, b in zip(v_theta[i], v_old[i])]
        negative = [(1 + beta) * b - beta * a for a, b in zip(v_theta[i], v_old[i])]
        terms = []
        for v in (positive, negative):
            errors = [a - b for a, b in zip(v, target)]
            squared = sum(e * e for e in errors) / len(errors)
            if adaptive:  # t^2 mse / (t mean|error|)
                squared = t[i] ** 2 * squared / max(t[i] * sum(abs(e) for e in errors) / len(errors), 1e-5)
            terms.append(squared)
        losses.append((r * terms[0] + (1 - r) * terms[1]) * c / beta)
    return losses


@pytest.mark.parametrize("adaptive", [True, False])
@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_nft_loss_equals_a_hand_computation(adaptive, beta):
    v_theta = [[0.5, -1.0, 2.0], [1.5, 0.0, -0.5]]
    v_old = [[0.2, -0.8, 1.0], [1.0, 0.5, -1.0]]
    x0 = [[0.1, 0.2, -0.3], [-1.0, 0.4, 0.0]]
    eps = [[1.0, -0.5, 0.3], [0.2, 0.1, -2.0]]
    t = [0.3, 0.8]
    advantages = [7.0, -1.5]
    x_t = [[(1 - ti) * a + ti * e for a, e in zip(x, n)] for ti, x, n in zip(t, x0, eps)]
    loss, info = nft_loss(
        torch.tensor(v_theta, dtype=torch.float64),
        torch.tensor(v_old, dtype=torch.float64),
        torch.tensor(x0, dtype=torch.float64),
        torch.tensor(x_t, dtype=torch.float64),
        torch.tensor(t, dtype=torch.float64),
        torch.tensor(advantages, dtype=torch.float64),
        beta=beta,
        advantage_clip=5.0,
        adaptive_weighting=adaptive,
    )
    expected = hand_nft(v_theta, v_old, x0, eps, t, advantages, beta, 5.0, adaptive)
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))
    assert info["nft_r"] == pytest.approx((1.0 + 0.35) / 2)


@pytest.mark.parametrize("adaptive", [True, False])
def test_gradient_pulls_positive_samples_toward_the_target_and_pushes_negative_ones_away(adaptive):
    generator = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(2, 4, 8, generator=generator), torch.randn(2, 4, 8, generator=generator)
    t = torch.tensor([0.4, 0.7])
    x_t = (1 - t[:, None, None]) * x0 + t[:, None, None] * eps
    target = eps - x0
    v_theta = (target + torch.randn(2, 4, 8, generator=generator)).requires_grad_(True)
    v_old = v_theta.detach().clone()  # on-policy: the old policy is the current one
    advantages = torch.tensor([5.0, -5.0])  # r = 1 (positive) and r = 0 (negative)
    loss, _ = nft_loss(v_theta, v_old, x0, x_t, t, advantages, adaptive_weighting=adaptive)
    loss.sum().backward()
    toward = target - v_theta.detach()
    descent = -v_theta.grad
    assert (descent[0] * toward[0]).sum() > 0  # a gradient step moves v_theta toward v*
    assert (descent[1] * toward[1]).sum() < 0  # ... and away from it for the negative sample
    with torch.no_grad():  # and a small step really changes the distances that way
        stepped = v_theta - 1e-3 * v_theta.grad
    assert (stepped[0] - target[0]).norm() < (v_theta[0] - target[0]).norm()
    assert (stepped[1] - target[1]).norm() > (v_theta[1] - target[1]).norm()


def test_nft_config_is_validated_naming_the_key():
    with pytest.raises(ConfigError, match="train.nft.beta"):
        NFTConfig(beta=0.0)
    with pytest.raises(ConfigError, match="train.nft.ema_max"):
        NFTConfig(ema_max=1.0)
    assert "nft" in LOSSES.names()


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    import os

    os.environ["GENALIGN_TINY_CACHE"] = str(tmp_path_factory.getbasetemp() / "tiny-cache")
    return load_policy("flow", "tiny:sd3", lora=LoRASpec(rank=4))


def test_loss_on_a_flow_policy_equals_a_manual_recomputation(policy):
    config = TrainConfig(kl_coef=0.0, group_size=2, minibatch_size=2)
    loss_fn = NFTLoss(config)
    trajectory = policy.rollout(
        ["a red circle", "a cat"],
        seeds=torch.tensor([3, 4]),
        num_inference_steps=4,
        guidance_scale=1.0,
        mode="ode",
    )
    assert trajectory.stochastic_steps().numel() == 0  # an ODE rollout: no log-prob to train on
    loss_fn.rollout_policy(SimpleNamespace(policy=policy), step=7)  # the old policy = current weights
    for name, parameter in policy.denoiser.named_parameters():  # the trained policy moves away from it
        if "lora_B" in name:
            parameter.data.normal_(0, 0.05)
    step_index = torch.tensor([1, 3])
    advantages = torch.tensor([1.0, -2.0])
    loss, metrics = loss_fn(policy, trajectory, step_index, advantages)

    policy.set_timesteps(4, trajectory.latents[:, 0])
    t = policy.scheduler.sigmas[step_index].float()
    x0 = trajectory.latents[:, -1]
    eps = loss_fn.noise(trajectory, step_index, x0)
    x_t = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * eps
    with torch.no_grad():
        v_theta = policy.predict(x_t, step_index, trajectory.conditioning, trajectory.settings)
        with policy.reference():  # LoRA B was zero when the old policy was taken: old = base model
            v_old = policy.predict(x_t, step_index, trajectory.conditioning, trajectory.settings)
    expected, _ = nft_loss(v_theta, v_old, x0, x_t, t, advantages)
    torch.testing.assert_close(loss.detach(), expected.mean(), rtol=1e-5, atol=1e-6)
    assert metrics["nft_old_deviation"] > 0
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())
    policy.zero_grad(set_to_none=True)
    # the noise depends on (training step, sample seed, step index) only
    assert torch.equal(eps, loss_fn.noise(trajectory, step_index, x0))
    assert not torch.equal(eps, loss_fn.noise(trajectory, torch.tensor([2, 3]), x0))


def test_old_policy_soft_update_and_rollouts_from_it(policy):
    config = TrainConfig(group_size=2, minibatch_size=2)
    loss_fn = NFTLoss(config)
    trainer = SimpleNamespace(policy=policy, optimizer_steps=100)
    with loss_fn.rollout_policy(trainer, step=0):
        pass
    old = [p.detach().clone() for p in loss_fn.old_parameters]
    for parameter in policy.trainable_parameters():
        parameter.data.add_(0.1)
    current = [p.detach().clone() for p in policy.trainable_parameters()]
    metrics = loss_fn.end_step(trainer, step=0)
    assert metrics["nft_old_decay"] == pytest.approx(0.1)
    for value, before, now in zip(loss_fn.old_parameters, old, current):
        torch.testing.assert_close(value, 0.1 * before + 0.9 * now)
    with loss_fn.rollout_policy(trainer, step=1):  # rollouts see the old weights ...
        for parameter, value in zip(policy.trainable_parameters(), loss_fn.old_parameters):
            assert torch.equal(parameter, value)
    for parameter, value in zip(policy.trainable_parameters(), current):  # ... and training the current ones
        assert torch.equal(parameter, value)
    state = loss_fn.state_dict()
    restored = NFTLoss(config)
    restored.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(restored.old_parameters, loss_fn.old_parameters))


def test_nft_refuses_other_families():
    loss_fn = NFTLoss(TrainConfig(group_size=2, minibatch_size=2))
    with pytest.raises(ValueError, match="got family 'consistency'"):
        loss_fn(SimpleNamespace(family="consistency"), None, torch.tensor([0]), torch.tensor([0.0]))


def hand_nft_eps(eps_theta, eps_old, eps, x0, x_t, abar, advantages, beta, c, adaptive):
    """Eq. 7-8 for an epsilon model, element by element: the implicit policies mix the eps
    outputs; the adaptive form measures the x0 they imply, (x_t - sqrt(1 - abar) e) / sqrt(abar)."""
    losses = []
    for i in range(len(abar)):
        r = max(-c, min(c, advantages[i])) / (2 * c) + 0.5
        positive = [beta * a + (1 - beta) * b for a, b in zip(eps_theta[i], eps_old[i])]
        negative = [(1 + beta) * b - beta * a for a, b in zip(eps_theta[i], eps_old[i])]
        terms = []
        for e_mix in (positive, negative):
            if adaptive:
                x0_mix = [(x - (1 - abar[i]) ** 0.5 * e) / abar[i] ** 0.5 for x, e in zip(x_t[i], e_mix)]
                errors = [a - b for a, b in zip(x0_mix, x0[i])]
                squared = sum(e * e for e in errors) / len(errors)
                squared /= max(sum(abs(e) for e in errors) / len(errors), 1e-5)
            else:
                errors = [a - b for a, b in zip(e_mix, eps[i])]
                squared = sum(e * e for e in errors) / len(errors)
            terms.append(squared)
        losses.append((r * terms[0] + (1 - r) * terms[1]) * c / beta)
    return losses


@pytest.mark.parametrize("adaptive", [True, False])
def test_loss_on_an_sd_policy_equals_a_hand_computation_in_eps_space(sd_policy, adaptive):
    """Our extension to DDPM-family models: the same loss with the eps parameterisation (here on
    the guided output the rollout sampled with, ``nft.guided = True``)."""
    policy = sd_policy
    nft = NFTConfig(beta=0.6, adaptive_weighting=adaptive, guided=True)
    config = TrainConfig(kl_coef=0.0, group_size=2, minibatch_size=2, nft=nft)
    loss_fn = NFTLoss(config)
    trajectory = policy.rollout(
        ["a red circle", "a blue square", "a cat"],
        seeds=torch.tensor([3, 4, 5]),
        num_inference_steps=4,
        guidance_scale=3.0,
        eta=1.0,
    )
    lora_b = [p for name, p in policy.denoiser.named_parameters() if "lora_B" in name]
    for parameter in lora_b:  # the old policy = the base model (LoRA B zero) ...
        parameter.data.zero_()
    loss_fn.rollout_policy(SimpleNamespace(policy=policy), step=2)
    for parameter in lora_b:  # ... and the trained one moves away from it
        parameter.data.normal_(0, 0.05)
    step_index = torch.tensor([0, 2, 3])
    advantages = torch.tensor([1.5, -7.0, 0.2])
    loss, metrics = loss_fn(policy, trajectory, step_index, advantages)

    # by hand: diffusers' add_noise, the guided UNet outputs the rollout sampled with (old policy =
    # the LoRA-disabled base, as LoRA B was zero when it was taken), the epsilon target
    scheduler = policy.scheduler
    t = scheduler.timesteps[step_index]
    x0 = trajectory.latents[:, -1].float()
    eps = loss_fn.noise(trajectory, step_index, x0)
    x_t = scheduler.add_noise(x0, eps, t)
    abar = scheduler.alphas_cumprod[t].double()
    unet, cond = policy.pipeline.unet, trajectory.conditioning

    def guided():
        text = unet(x_t, t, encoder_hidden_states=cond["prompt_embeds"]).sample
        uncond = unet(x_t, t, encoder_hidden_states=cond["negative_prompt_embeds"]).sample
        return (uncond + 3.0 * (text - uncond)).double()

    with torch.no_grad():
        eps_theta = guided()
        with policy.reference():
            eps_old = guided()
    flat = lambda x: x.double().flatten(1).tolist()  # noqa: E731
    expected = hand_nft_eps(
        flat(eps_theta), flat(eps_old), flat(eps), flat(x0), flat(x_t), abar.tolist(),
        advantages.tolist(), 0.6, 5.0, adaptive,
    )  # fmt: skip
    torch.testing.assert_close(
        loss.detach().double(), torch.tensor(expected, dtype=torch.float64).mean(), rtol=1e-4, atol=1e-6
    )
    assert metrics["nft_r"] == pytest.approx((0.65 + 0.0 + 0.52) / 3)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())
    policy.zero_grad(set_to_none=True)


def test_guidance_4_5_rollouts_train_the_conditional_branch_by_default(sd_policy):
    """DiffusionNFT is CFG-free (the official trainer regresses the conditional velocity): under
    rollouts with guidance 4.5 the default loss and its gradient are those of the conditional UNet
    output alone, computed here by calling the UNet with the prompt embeddings only."""
    policy = sd_policy
    assert NFTConfig().guided is False
    config = TrainConfig(kl_coef=0.0, group_size=2, minibatch_size=2, nft=NFTConfig(beta=0.8))
    loss_fn = NFTLoss(config)
    trajectory = policy.rollout(
        ["a red circle", "a cat"], seeds=torch.tensor([8, 9]), num_inference_steps=4, guidance_scale=4.5
    )
    assert "negative_prompt_embeds" in trajectory.conditioning  # the rollout did run CFG
    lora_b = [p for name, p in policy.denoiser.named_parameters() if "lora_B" in name]
    for parameter in lora_b:  # old policy = the base model; the trained one moves away from it
        parameter.data.zero_()
    loss_fn.rollout_policy(SimpleNamespace(policy=policy), step=5)
    torch.manual_seed(0)
    for parameter in lora_b:
        parameter.data.normal_(0, 0.05)
    step_index = torch.tensor([1, 2])
    advantages = torch.tensor([2.0, -1.0])
    parameters = policy.trainable_parameters()
    for parameter in parameters:  # the policy's own zero_grad does not reach the pipeline's UNet
        parameter.grad = None
    loss, _ = loss_fn(policy, trajectory, step_index, advantages)
    loss.backward()
    grads = [p.grad.detach().clone() for p in parameters]
    for parameter in parameters:
        parameter.grad = None

    # by hand: the conditional eps of the trained and the base UNet, eq. 7-8 with adaptive weights
    scheduler, unet = policy.scheduler, policy.pipeline.unet
    t = scheduler.timesteps[step_index]
    x0 = trajectory.latents[:, -1].float()
    eps = loss_fn.noise(trajectory, step_index, x0)
    abar = scheduler.alphas_cumprod[t].float().reshape(-1, 1, 1, 1)
    x_t = abar.sqrt() * x0 + (1 - abar).sqrt() * eps
    cond = trajectory.conditioning["prompt_embeds"]
    eps_theta = unet(x_t, t, encoder_hidden_states=cond).sample.float()
    with torch.no_grad(), policy.reference():
        eps_old = unet(x_t, t, encoder_hidden_states=cond).sample.float()
    c, beta = 5.0, 0.8
    r = advantages.clamp(-c, c) / (2 * c) + 0.5
    to_x0 = lambda e: (x_t - (1 - abar).sqrt() * e) / abar.sqrt()  # noqa: E731
    terms = []
    for mixed in (beta * eps_theta + (1 - beta) * eps_old, (1 + beta) * eps_old - beta * eps_theta):
        error = to_x0(mixed) - x0
        weight = error.detach().abs().mean(dim=(1, 2, 3)).clamp(min=1e-5)
        terms.append((error**2).mean(dim=(1, 2, 3)) / weight)
    expected = ((r * terms[0] + (1 - r) * terms[1]) * c / beta).mean()
    torch.testing.assert_close(loss.detach(), expected.detach(), rtol=1e-4, atol=1e-6)
    expected.backward()
    for parameter, grad in zip(parameters, grads):
        torch.testing.assert_close(grad, parameter.grad, rtol=1e-3, atol=1e-8)
        parameter.grad = None

    # guided=True differs: it regresses the CFG output the rollout was sampled with
    guided_fn = NFTLoss(
        TrainConfig(kl_coef=0.0, group_size=2, minibatch_size=2, nft=NFTConfig(beta=0.8, guided=True))
    )
    guided_fn.old_parameters, guided_fn.current_step = loss_fn.old_parameters, loss_fn.current_step
    with torch.no_grad():
        guided_loss, _ = guided_fn(policy, trajectory, step_index, advantages)
    assert not torch.allclose(guided_loss, loss.detach())


def test_diffusion_nft_recipes_accept_flow_and_sd_only(tmp_path):
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "nft_sd_jpeg.yaml"
    config = load_recipe(recipe, [f"logging.run_dir={tmp_path}/run"])
    assert (config.model.family, config.train.method, config.train.loss) == ("sd", "diffusion_nft", "nft")
    with pytest.raises(
        ConfigError, match="is for the 'flow' or 'sd' family, but model.family is 'consistency'"
    ):
        load_recipe(recipe, ["model.family=consistency", "model.path=tiny:lcm"])


def test_trainer_trains_nft_on_an_sd_policy_and_resumes(tmp_path):
    from pathlib import Path

    from genalign.trainers import build_trainer

    recipe = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "nft_sd_jpeg.yaml"
    straight = build_trainer(load_recipe(recipe, [f"logging.run_dir={tmp_path}/a", "train.num_steps=2"]))
    initial = [p.detach().clone() for p in straight.parameters]
    straight.train()
    assert all(not torch.equal(a, b) for a, b in zip(initial, straight.parameters))
    first = build_trainer(load_recipe(recipe, [f"logging.run_dir={tmp_path}/b", "train.num_steps=1"]))
    first.train()
    resumed = build_trainer(
        load_recipe(recipe, [f"logging.run_dir={tmp_path}/b", "train.num_steps=2", "logging.resume=latest"])
    )
    resumed.train()
    for a, b in zip(straight.parameters, resumed.parameters):
        torch.testing.assert_close(a, b)
    for a, b in zip(straight.loss.old_parameters, resumed.loss.old_parameters):
        torch.testing.assert_close(a, b)


def test_trainer_trains_nft_on_ode_rollouts_and_resumes_the_old_policy(tmp_path):
    from pathlib import Path

    from genalign.trainers import build_trainer
    from genalign.trainers.checkpoint import latest_checkpoint, load_checkpoint

    recipe = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "nft_jpeg.yaml"
    config = load_recipe(recipe, [f"logging.run_dir={tmp_path}/run", "train.num_steps=2"])
    trainer = build_trainer(config)
    initial = [p.detach().clone() for p in trainer.parameters]
    history = trainer.train()
    # 8 samples in minibatches of 4: two optimiser steps per training step, eta = 0.001 * steps so far
    assert [m["nft_old_decay"] for m in history] == [0.002, 0.004]
    assert all(not torch.equal(a, b) for a, b in zip(initial, trainer.parameters))
    checkpoint = load_checkpoint(latest_checkpoint(trainer.run_dir))
    saved = [checkpoint.tensors["loss"][k] for k in sorted(checkpoint.tensors["loss"])]
    assert all(torch.equal(a, b) for a, b in zip(saved, trainer.loss.old_parameters))
    # the old policy trails the trained weights: 0.002 * old + 0.998 * theta after the last step
    assert any(not torch.equal(a, b) for a, b in zip(trainer.loss.old_parameters, trainer.parameters))


def test_the_old_adv_clip_key_fails_naming_advantage_clip(tmp_path):
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "nft_jpeg.yaml"
    with pytest.raises(ConfigError) as error:
        load_recipe(recipe, [f"logging.run_dir={tmp_path}/run", "train.nft.adv_clip=3.0"])
    assert str(error.value) == "config key train.nft.adv_clip was renamed: use train.nft.advantage_clip"
    config = load_recipe(recipe, [f"logging.run_dir={tmp_path}/run", "train.nft.advantage_clip=3.0"])
    assert config.train.nft.advantage_clip == 3.0


def test_the_noise_is_keyed_by_the_step_begin_step_names(policy):
    """The training step in the noise key comes from ``begin_step`` alone, not from the rollout hook."""
    loss_fn = NFTLoss(TrainConfig(group_size=2, minibatch_size=2))
    trajectory = SimpleNamespace(seeds=torch.tensor([3, 4]))
    step_index, like = torch.tensor([0, 1]), torch.zeros(2, 4, 2, 2)
    loss_fn.begin_step(1)
    at_one = loss_fn.noise(trajectory, step_index, like)
    with loss_fn.rollout_policy(SimpleNamespace(policy=policy), step=7):
        pass
    assert torch.equal(loss_fn.noise(trajectory, step_index, like), at_one)
    loss_fn.begin_step(2)
    assert not torch.equal(loss_fn.noise(trajectory, step_index, like), at_one)


def test_sampling_training_reaches_the_training_rollouts_only(tmp_path):
    """``sampling.training`` (here DiffusionNFT's ODE data collection, eta 0) changes what the
    strategy rolls out and is trained on, while ``Trainer.rollout_kwargs`` (what evaluations and
    the demo sample with) keeps the recipe's eta 1."""
    from pathlib import Path

    from genalign.trainers import build_trainer

    recipe = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "nft_sd_jpeg.yaml"
    base = [f"logging.run_dir={tmp_path}/run", "train.num_steps=1", "sampling.eta=1.0"]
    trainer = build_trainer(load_recipe(recipe, [*base, "sampling.training.eta=0.0"]))
    assert trainer.rollout_kwargs()["eta"] == 1.0
    assert trainer.rollout_context().rollout_kwargs()["eta"] == 0.0
    collected = []
    original = trainer.policy.rollout

    def recording(*args, **kwargs):
        collected.append(kwargs["eta"])
        return original(*args, **kwargs)

    trainer.policy.rollout = recording
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    assert collected and set(collected) == {0.0}
    # eta 0 is deterministic: the same seeds give the same images whatever the step noise
    trajectory = batch.trajectory
    again = original(
        [trajectory.prompts[0]], seeds=trajectory.seeds[:1], **trainer.rollout_context().rollout_kwargs()
    )
    torch.testing.assert_close(again.images[0], trajectory.images[0])
    stochastic = original([trajectory.prompts[0]], seeds=trajectory.seeds[:1], **trainer.rollout_kwargs())
    assert not torch.allclose(stochastic.images[0], trajectory.images[0])


def test_sampling_training_rejects_other_keys_naming_them(tmp_path):
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "nft_sd_jpeg.yaml"
    with pytest.raises(ConfigError, match="sampling.training.guidance_scale is not a sampler setting"):
        load_recipe(recipe, ["sampling.training.guidance_scale=3.0"])
    with pytest.raises(ConfigError, match="sampling.training.mode must be sde, cps or ode, got 'fast'"):
        load_recipe(recipe, ["sampling.training.mode=fast"])
