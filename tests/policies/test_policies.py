"""Policies: rollouts reproduce diffusers pipelines; re-scoring reproduces stored log-probs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from genalign import tiny
from genalign.policies import (
    ConsistencyPolicy,
    FlowPolicy,
    FluxPolicy,
    SanaPolicy,
    SD3Policy,
    SDPolicy,
    load_policy,
)
from genalign.tiny import diffusion

PROMPTS = ["a red circle", "two blue squares"]

# (builder, policy class, kwargs of the noise-free rollout, extra kwargs of the diffusers call)
FAMILIES = {
    "sd": (diffusion.sd_pipeline, SDPolicy, {"eta": 0.0}, {"eta": 0.0}),
    "sdxl": (diffusion.sdxl_pipeline, SDPolicy, {"eta": 0.0}, {"eta": 0.0}),
    "sd3": (diffusion.sd3_pipeline, FlowPolicy, {"mode": "ode"}, {}),
    "flux": (diffusion.flux_pipeline, FlowPolicy, {"mode": "ode", "height": 32, "width": 32}, {}),
    "sana": (diffusion.sana_pipeline, FlowPolicy, {"mode": "ode"}, {"use_resolution_binning": False}),
    "lcm": (diffusion.lcm_pipeline, ConsistencyPolicy, {}, {}),
}
STOCHASTIC = {
    "sd": {"eta": 1.0},
    "sdxl": {"eta": 0.7},
    "sd3": {"mode": "sde", "noise_level": 0.7},
    "flux": {"mode": "cps", "noise_level": 0.7, "height": 32, "width": 32},
    "sana": {"mode": "sde", "noise_level": 0.5},
    "lcm": {},
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    builder, policy_class, _, _ = FAMILIES[request.param]
    return request.param, builder(seed=0)


def _generators(seeds):
    return [torch.Generator().manual_seed(int(s)) for s in seeds]


def test_noise_free_rollout_reproduces_the_diffusers_pipeline(family):
    name, pipe = family
    _, policy_class, rollout_kwargs, call_kwargs = FAMILIES[name]
    policy = policy_class.from_pipe(pipe, train=False)
    guidance = 3.0
    steps = 1 if name == "lcm" else 3
    trajectory = policy.rollout(
        PROMPTS, num_inference_steps=steps, guidance_scale=guidance, generator=7, **rollout_kwargs
    )
    call_kwargs = {**call_kwargs, "guidance_scale": guidance}
    if name in ("sd", "sdxl"):  # the sd family's step policy is DDIM's; compare with DDIM
        from diffusers import DDIMScheduler

        pipe = type(pipe)(
            **{**pipe.components, "scheduler": DDIMScheduler.from_config(pipe.scheduler.config)}
        )
    expected = pipe(
        PROMPTS,
        num_inference_steps=steps,
        generator=_generators(trajectory.seeds),
        output_type="pt",
        height=trajectory.settings.height,
        width=trajectory.settings.width,
        **call_kwargs,
    ).images
    assert trajectory.images.shape == expected.shape
    torch.testing.assert_close(trajectory.images, expected.float(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("guidance_scale", [1.0, 4.0])
def test_rescoring_reproduces_every_stored_log_prob(family, guidance_scale):
    name, pipe = family
    _, policy_class, _, _ = FAMILIES[name]
    policy = policy_class.from_pipe(pipe, train=False)
    trajectory = policy.rollout(
        PROMPTS,
        num_inference_steps=3,
        guidance_scale=guidance_scale,
        group_size=2,
        generator=3,
        **STOCHASTIC[name],
    )
    assert trajectory.log_probs.shape == (4, 3)
    assert trajectory.latents.shape[:2] == (4, 4)
    recomputed = policy.log_prob(trajectory)
    ratio = torch.exp(recomputed - trajectory.log_probs)
    assert torch.equal(ratio, torch.ones_like(ratio)), (recomputed - trajectory.log_probs).abs().max()
    # the last step may be a point mass (LCM's final step, DDIM to alpha = 1, CPS to sigma = 0)
    stochastic = trajectory.log_probs[:, :-1]
    assert torch.isfinite(stochastic).all() and (stochastic != 0).all()


def test_per_sample_step_indices_match_shared_indices():
    policy = SDPolicy.from_pipe(diffusion.sd_pipeline(seed=0), train=False)
    trajectory = policy.rollout(PROMPTS, num_inference_steps=4, guidance_scale=3.0, generator=1)
    per_sample = policy.log_prob(trajectory, torch.tensor([[0, 3], [2, 1]]))
    shared = policy.log_prob(trajectory)
    torch.testing.assert_close(
        per_sample, torch.stack([shared[0, [0, 3]], shared[1, [2, 1]]]), atol=1e-3, rtol=1e-5
    )


def test_group_rollout_shares_prompts_and_differs_in_noise():
    policy = SDPolicy.from_pipe(diffusion.sd_pipeline(seed=0), train=False)
    trajectory = policy.rollout(PROMPTS, num_inference_steps=2, group_size=3, generator=0)
    assert trajectory.prompts == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3
    assert trajectory.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    assert len(set(trajectory.seeds.tolist())) == 6
    assert not torch.equal(trajectory.latents[0, 0], trajectory.latents[1, 0])
    again = policy.rollout(PROMPTS, num_inference_steps=2, group_size=3, generator=0)
    assert torch.equal(again.images, trajectory.images)


def test_lora_policy_trains_only_adapters_and_reference_disables_them():
    policy = SDPolicy.from_pipe(diffusion.sd_pipeline(seed=0), lora={"rank": 2})
    names = list(policy.named_trainable_parameters())
    assert names and all("lora_" in n for n in names)
    trajectory = policy.rollout(PROMPTS, num_inference_steps=2, generator=0)
    before = policy.log_prob(trajectory)
    torch.testing.assert_close(before, trajectory.log_probs)  # fresh LoRA (B = 0) changes nothing
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    after = policy.log_prob(trajectory)
    assert not torch.allclose(after, before)
    with policy.reference():
        torch.testing.assert_close(policy.log_prob(trajectory), before)
    torch.testing.assert_close(policy.log_prob(trajectory), after)


def test_full_finetuning_reference_is_a_frozen_copy():
    policy = ConsistencyPolicy.from_pipe(diffusion.lcm_pipeline(seed=0))
    trainable = policy.trainable_parameters()
    assert len(trainable) == len(list(policy.denoiser.parameters()))
    trajectory = policy.rollout(PROMPTS, num_inference_steps=3, generator=0)
    before = policy.log_prob(trajectory)
    with torch.no_grad():
        trainable[0].add_(1.0)
    with policy.reference():
        torch.testing.assert_close(policy.log_prob(trajectory), before)


def test_log_prob_is_differentiable_in_the_trainable_parameters():
    policy = FlowPolicy.from_pipe(diffusion.sd3_pipeline(seed=0), lora={"rank": 2})
    trajectory = policy.rollout(PROMPTS, num_inference_steps=2, guidance_scale=1.0, generator=0)
    policy.log_prob(trajectory, [0]).sum().backward()
    grads = [p.grad for p in policy.trainable_parameters()]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


def test_flow_policy_dispatches_on_the_pipeline_class():
    assert type(FlowPolicy.from_pipe(diffusion.sd3_pipeline(seed=0), train=False)) is SD3Policy
    assert type(FlowPolicy.from_pipe(diffusion.flux_pipeline(seed=0), train=False)) is FluxPolicy
    assert type(FlowPolicy.from_pipe(diffusion.sana_pipeline(seed=0), train=False)) is SanaPolicy
    with pytest.raises(ValueError, match="supported pipelines"):
        FlowPolicy.from_pipe(diffusion.sd_pipeline(seed=0), train=False)


def test_a_flow_mode_multistep_scheduler_keeps_its_shift():
    """SANA's diffusers checkpoints ship DPM-Solver in flow mode with ``flow_shift`` 3; rebuilt with
    ``FlowMatchEulerDiscreteScheduler.from_config`` the key was dropped and every noise level was
    the unshifted grid's (step 8 of 10 trained at sigma 0.112 instead of 0.278)."""
    from diffusers import DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler

    pipe = diffusion.sana_pipeline(seed=0)
    pipe.scheduler = DPMSolverMultistepScheduler(
        flow_shift=3.0, use_flow_sigmas=True, prediction_type="flow_prediction"
    )
    policy = FlowPolicy.from_pipe(pipe, train=False)
    policy.set_timesteps(10, None)
    expected = FlowMatchEulerDiscreteScheduler(shift=3.0)
    expected.set_timesteps(10)
    torch.testing.assert_close(policy.scheduler.sigmas.cpu(), expected.sigmas, atol=1e-6, rtol=0)


def test_load_policy_from_a_saved_folder(tmp_path):
    diffusion.sd_pipeline(seed=0, save_to=tmp_path / "sd")
    policy = load_policy("sd", tmp_path / "sd", train=False)
    assert policy.rollout(["x"], num_inference_steps=1).images.shape[0] == 1


def test_bad_input_errors(tmp_path):
    with pytest.raises(KeyError, match="sd, .*consistency|consistency.*flow.*sd"):
        load_policy("unet-of-doom", tmp_path)
    folder = tmp_path / "sd"
    diffusion.sd_pipeline(seed=0, save_to=folder)
    shutil.rmtree(folder / "vae")
    with pytest.raises(FileNotFoundError, match="vae"):
        load_policy("sd", folder)
    diffusion.sd_pipeline(seed=0, save_to=tmp_path / "sd2")
    (tmp_path / "sd2" / "unet" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy("sd", tmp_path / "sd2")
    with pytest.raises(FileNotFoundError, match="model_index.json"):
        load_policy("sd", tmp_path)
    for missing in (tmp_path / "no-such-model", "runs/toy/no-such-run/snapshot", "./toy-sd"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            load_policy("sd", missing)
    from genalign.policies.model_folder import looks_like_local_path

    assert not looks_like_local_path("stabilityai/sd-turbo")  # a hub id goes to the hub
    policy = SDPolicy.from_pipe(diffusion.sd_pipeline(seed=0), train=False)
    with pytest.raises(ValueError, match="empty"):
        policy.rollout([])
    with pytest.raises(ValueError, match="num_inference_steps"):
        policy.rollout(["x"], num_inference_steps=-2)
    with pytest.raises(ValueError, match="single string"):
        policy.rollout("x")
    from genalign.policies import check_group_size

    with pytest.raises(ValueError, match="group size 3 does not divide the batch size 8"):
        check_group_size(8, 3)


def test_model_index_names_every_component(tmp_path):
    diffusion.lcm_pipeline(seed=0, save_to=tmp_path / "lcm")
    index = json.loads((tmp_path / "lcm" / "model_index.json").read_text())
    assert index["_class_name"] == "LatentConsistencyModelPipeline"
    assert isinstance(tiny.byte_level_clip_tokenizer()("a").input_ids, list)


def test_consistency_policy_runs_a_turbo_style_unet_without_guidance_embedding():
    # sd-turbo is an SD UNet (no time_cond_proj_dim) sampled in one step: the family swaps in
    # LCMScheduler and uses plain CFG only when guidance_scale > 1.
    pipe = diffusion.sd_pipeline(seed=0)
    policy = ConsistencyPolicy.from_pipe(pipe, train=False)
    assert not policy.uses_cfg(0.0) and policy.uses_cfg(2.0)
    one_step = policy.rollout(PROMPTS, num_inference_steps=1, guidance_scale=0.0, generator=5)
    assert one_step.stds.eq(0).all() and one_step.log_probs.eq(0).all()  # the single step is f_theta
    again = policy.rollout(PROMPTS, num_inference_steps=1, guidance_scale=0.0, generator=5)
    assert torch.equal(one_step.images, again.images)
    multi = policy.rollout(PROMPTS, num_inference_steps=3, guidance_scale=2.0, generator=5)
    torch.testing.assert_close(policy.log_prob(multi), multi.log_probs, atol=0, rtol=0)
    assert (multi.log_probs[:, :-1] != 0).all()


def test_a_model_of_another_family_is_named_not_an_attribute_error():
    # found by a new user: model.path=tiny:flux under model.family sd failed with
    # "'SDPolicy' object has no attribute 'denoiser'"
    with pytest.raises(
        ValueError, match="is a FluxPipeline without a 'unet': not a pipeline of the 'sd' family"
    ):
        load_policy("sd", "tiny:flux", lora=None)
