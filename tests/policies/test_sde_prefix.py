"""An SDE prefix and an ODE tail (PromptRL's generator, UniRL's --num_sde): only the first
``num_sde_steps`` steps are stochastic and trainable, the prefix is the same as a fully
stochastic rollout's, and re-scoring reproduces the recorded log-probs."""

from __future__ import annotations

import pytest
import torch

from genalign.policies import FlowPolicy, RolloutSettings, SDPolicy
from genalign.tiny import diffusion

CASES = {
    "sd": (diffusion.sd_pipeline, SDPolicy, {"eta": 1.0}),
    "sd3": (diffusion.sd3_pipeline, FlowPolicy, {"mode": "sde", "noise_level": 0.7}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_only_the_first_steps_are_stochastic(name):
    builder, policy_class, kwargs = CASES[name]
    policy = policy_class.from_pipe(builder(seed=0), train=False)
    seeds = torch.tensor([3, 4])
    common = dict(num_inference_steps=4, guidance_scale=3.0, seeds=seeds, **kwargs)
    mixed = policy.rollout(["a red circle", "a blue square"], num_sde_steps=2, **common)
    full = policy.rollout(["a red circle", "a blue square"], **common)
    assert (mixed.stds[:, :2] > 0).all() and (mixed.stds[:, 2:] == 0).all()
    assert mixed.stochastic_steps().tolist() == [0, 1]
    assert torch.equal(mixed.latents[:, :3], full.latents[:, :3])  # the same SDE prefix
    assert not torch.equal(mixed.latents[:, 4], full.latents[:, 4])
    rescored = policy.log_prob(mixed, [0, 1])
    torch.testing.assert_close(rescored, mixed.log_probs[:, :2], atol=0, rtol=0)
    ode = policy.rollout(["a red circle", "a blue square"], num_sde_steps=0, **common)
    assert (ode.stds == 0).all()


def test_settings_refuse_a_call_across_the_boundary_and_a_bad_count():
    settings = RolloutSettings(num_inference_steps=4, guidance_scale=1.0, height=8, width=8, num_sde_steps=2)
    assert settings.at_steps(1) is settings
    assert settings.at_steps(torch.tensor([2, 3])).mode == "ode"
    assert settings.at_steps(3).eta == 0.0
    with pytest.raises(ValueError, match="straddle"):
        settings.at_steps(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="num_sde_steps"):
        RolloutSettings(num_inference_steps=4, guidance_scale=1.0, height=8, width=8, num_sde_steps=5)
