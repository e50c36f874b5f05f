"""The consistency policy's RLCM options: RLCM's timestep schedule and its scored final step,
end to end on the tiny LCM (rollout, re-scoring, decoding, the recipe keys and the trainer)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genalign.config import ConfigError
from genalign.policies import ConsistencyPolicy
from genalign.tiny import diffusion
from genalign.trainers import build_trainer, load_recipe

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["a red circle", "two blue squares"]
RLCM_8 = [999, 879, 759, 639, 519, 399, 279, 159]  # RLCM's patched scheduler, 8 steps
DIFFUSERS_8 = [999, 879, 759, 639, 499, 379, 259, 139]  # diffusers' LCMScheduler, 8 steps


@pytest.fixture(scope="module")
def policy():
    return ConsistencyPolicy.from_pipe(diffusion.lcm_pipeline(seed=0), lora={"rank": 2})


def test_rlcm_schedule_is_sampled_recorded_and_rescored(policy):
    rlcm = policy.rollout(PROMPTS, num_inference_steps=8, generator=0, lcm_schedule="rlcm")
    assert rlcm.timesteps[0].tolist() == RLCM_8 and rlcm.settings.lcm_schedule == "rlcm"
    plain = policy.rollout(PROMPTS, num_inference_steps=8, generator=0)  # switches back
    assert plain.timesteps[0].tolist() == DIFFUSERS_8
    # re-scoring sets each trajectory's own schedule: the on-policy ratio is exactly 1
    assert torch.equal(policy.log_prob(rlcm), rlcm.log_probs)
    assert torch.equal(policy.log_prob(plain), plain.log_probs)
    assert not torch.equal(rlcm.latents[:, -1], plain.latents[:, -1])
    with pytest.raises(ValueError, match="lcm_schedule"):
        policy.rollout(PROMPTS, num_inference_steps=2, generator=0, lcm_schedule="other")


def test_final_noise_makes_the_last_step_trainable_and_decodes_the_clean_estimate(policy):
    seeds = torch.tensor([5, 6])
    noisy = policy.rollout(PROMPTS, num_inference_steps=4, seeds=seeds, lcm_final_noise=True)
    plain = policy.rollout(PROMPTS, num_inference_steps=4, seeds=seeds)
    assert (plain.stds[:, -1] == 0).all() and (plain.log_probs[:, -1] == 0).all()
    assert (noisy.stds[:, -1] > 0).all() and (noisy.log_probs[:, -1] != 0).all()
    assert noisy.stochastic_steps().tolist() == [0, 1, 2, 3]
    # the steps before the last draw the same noise; the last clean estimate is the same, and it
    # is what both decode (RLCM decodes `denoised`), while the recorded last latent is re-noised
    assert torch.equal(noisy.latents[:, :-1], plain.latents[:, :-1])
    assert not torch.equal(noisy.latents[:, -1], plain.latents[:, -1])
    torch.testing.assert_close(noisy.images, plain.images)
    # the last step's std is sqrt(1 - alpha_bar) at the last timestep itself (t' = t)
    t_last = int(noisy.timesteps[0, -1])
    expected_std = (1 - policy.scheduler.alphas_cumprod[t_last]).sqrt()
    torch.testing.assert_close(noisy.stds[:, -1], expected_std.expand(2))
    assert torch.equal(policy.log_prob(noisy), noisy.log_probs)  # exact re-scoring, last step too


def test_recipe_keys_reach_the_rollouts_and_are_validated(tmp_path, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path / "tiny-cache"))
    recipe = ROOT / "configs" / "tiny" / "rlcm_jpeg.yaml"
    overrides = [
        "sampling.lcm_schedule=rlcm",
        "sampling.lcm_final_noise=true",
        "sampling.num_inference_steps=8",
        f"logging.run_dir={tmp_path}/run",
    ]
    trainer = build_trainer(load_recipe(recipe, overrides), base_dir=recipe.parent)
    kwargs = trainer.rollout_kwargs()
    assert kwargs["lcm_schedule"] == "rlcm" and kwargs["lcm_final_noise"] is True
    trajectory = trainer.policy.rollout(PROMPTS, generator=0, **kwargs)
    assert trajectory.timesteps[0].tolist() == RLCM_8 and (trajectory.stds[:, -1] > 0).all()
    with pytest.raises(ConfigError, match="consistency family"):
        load_recipe(ROOT / "configs" / "tiny" / "ddpo_jpeg.yaml", ["sampling.lcm_schedule=rlcm"])
    with pytest.raises(ConfigError, match="only the ppo_clip loss"):
        load_recipe(recipe, ["sampling.lcm_final_noise=true", "train.loss=rwr"])
