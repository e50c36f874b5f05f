"""ReNO (Eyring et al., NeurIPS 2024) on tiny LCM, SD, SDXL, FLUX and PixArt-alpha models with tiny
differentiable CLIP rewards."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from diffusers import DPMSolverMultistepScheduler

from genalign.pipelines import (
    ReNOFluxPipeline,
    ReNOPipeline,
    ReNOPixArtAlphaPipeline,
    ReNOStableDiffusionXLPipeline,
    build_reward_ensemble,
    norm_regularizer,
)
from genalign.rewards import load_reward
from genalign.tiny.clip import clip_model
from genalign.tiny.diffusion import flux_pipeline, lcm_pipeline, pixart_pipeline, sd_pipeline, sdxl_pipeline

PROMPT = "a red circle"


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_clip")
    clip_model(seed=0, save_to=folder)
    return str(folder)


@pytest.fixture(scope="module")
def clip_reward(clip_folder):
    """CLIP cosine from a tiny transformers CLIP at 32 px (the tiny models' resolution)."""
    return load_reward("clip", backend="transformers", model=clip_folder, convention="cosine")


@pytest.fixture(scope="module")
def pickscore_reward(clip_folder):
    """PickScore's head (logit scale x cosine) on the tiny CLIP: a second differentiable reward."""
    return load_reward("pickscore", model=clip_folder, processor=clip_folder)


@pytest.fixture(scope="module")
def pipe():
    return ReNOPipeline.from_pipe(lcm_pipeline(seed=0))


def _run(pipe, rewards, **kwargs):
    kwargs.setdefault("guidance_scale", 1.5)
    return pipe(
        PROMPT, rewards=rewards, generator=torch.Generator().manual_seed(0), output_type="pt", **kwargs
    )


def test_reward_rises_over_iterations(pipe, clip_reward):
    out = _run(pipe, [(clip_reward, 2.0)], num_iterations=6)
    history = out.rewards_history[:, 0]  # (iterations,)
    assert history.shape == (6,)
    assert (history[1:] > history[:-1]).sum() >= 4, history  # mostly increasing
    assert history[-1] > history[0]
    best = int(out.best_iteration[0])
    assert history[best] == history.max() >= history[0]
    # the returned image scores what the history says (2 x the CLIP cosine)
    rescored = 2.0 * clip_reward(out.images, [PROMPT]).scores
    torch.testing.assert_close(rescored, history[best : best + 1], atol=1e-5, rtol=0)
    assert out.latents.shape == (1, 4, 8, 8)


def test_best_iteration_is_returned_not_the_last(pipe, clip_reward):
    seen: list[torch.Tensor] = []
    initial: list[torch.Tensor] = []

    def record_and_reset(pipeline, iteration, num_iterations, tensors):
        seen.append(tensors["images"].clone())
        if iteration == 0:
            initial.append(tensors["latents"].detach().clone())  # already stepped once: z_1
        # after iteration 2, send the noise back to z_1: the last iterates fall below the best
        return {"latents": initial[0]} if iteration == 2 else {}

    out = _run(pipe, [clip_reward], num_iterations=4, callback_on_step_end=record_and_reset)
    history = out.rewards_history[:, 0]
    best = int(out.best_iteration[0])
    assert len(seen) == 4
    assert history[-1] < history[2] and best == 2, history
    torch.testing.assert_close(out.images, seen[best], atol=0, rtol=0)
    # the returned noise regenerates the returned image
    again = _run(pipe, [clip_reward], num_iterations=1, latents=out.latents)
    torch.testing.assert_close(again.images, out.images, atol=1e-6, rtol=0)


def test_regularizer_matches_closed_form():
    z = torch.tensor([[3.0, 4.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], requires_grad=True)  # norms 5, 2
    d, lam = 4, 0.01
    value = norm_regularizer(z, weight=lam)
    expected = torch.tensor([lam * (25 / 2 - 3 * math.log(5.0)), lam * (4 / 2 - 3 * math.log(2.0))])
    torch.testing.assert_close(value, expected)
    (grad,) = torch.autograd.grad(value.sum(), z)
    norms_sq = torch.tensor([[25.0], [4.0]])
    torch.testing.assert_close(grad, lam * z.detach() * (1 - (d - 1) / norms_sq))
    # stationary on the chi mode ||z|| = sqrt(d - 1)
    mode = (torch.ones(1, d) * math.sqrt((d - 1) / d)).requires_grad_(True)
    (grad,) = torch.autograd.grad(norm_regularizer(mode).sum(), mode)
    torch.testing.assert_close(grad, torch.zeros_like(grad), atol=1e-7, rtol=0)


def test_non_differentiable_reward_is_refused(pipe):
    with pytest.raises(ValueError, match="not differentiable"):
        _run(pipe, {"jpeg_compressibility": 1.0}, num_iterations=2)
    with pytest.raises(ValueError, match="not differentiable"):
        build_reward_ensemble([load_reward("jpeg_compressibility")])


def test_ensemble_weights(clip_reward):
    ensemble = build_reward_ensemble([(clip_reward, 5.0), (clip_reward, 0.01)])
    images = torch.rand(2, 3, 32, 32)
    expected = 5.01 * clip_reward(images, ["a", "b"]).scores
    torch.testing.assert_close(ensemble(images, ["a", "b"]).scores, expected)


def test_default_ensemble_loads_clip_as_renos_logit(clip_folder, monkeypatch):
    """The paper's CLIP weight 0.01 multiplies ReNO's CLIP logit (``exp(logit_scale) * cos``, LAION
    ViT-H/14 through transformers), not CLIPScore: the default member is loaded that way, and a
    user's kwargs for it update the defaults (here, the tiny model in place of the hub id)."""
    from genalign.pipelines.reno import objective

    monkeypatch.setattr(objective, "RENO_REWARD_WEIGHTS", {"clip": 0.01})
    assert objective.RENO_REWARD_KWARGS["clip"] == {
        "backend": "transformers",
        "model": "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
        "convention": "logit",
    }
    ensemble = build_reward_ensemble(None, reward_kwargs={"clip": {"model": clip_folder}})
    logit = load_reward("clip", backend="transformers", model=clip_folder, convention="logit")
    images = torch.rand(2, 3, 32, 32)
    expected = 0.01 * logit(images, ["a", "b"]).scores
    torch.testing.assert_close(ensemble(images, ["a", "b"]).scores, expected, atol=1e-6, rtol=0)


def test_from_pretrained_adam_checkpointing_and_tuple(tmp_path, clip_reward):
    lcm_pipeline(seed=0, save_to=tmp_path / "lcm")
    pipe = ReNOPipeline.from_pretrained(str(tmp_path / "lcm"))
    plain = _run(pipe, [clip_reward], num_iterations=2, optimizer="adam", learning_rate=0.05)
    pipe.enable_gradient_checkpointing()
    images, history, best_iteration, latents = _run(
        pipe, [clip_reward], num_iterations=2, optimizer="adam", learning_rate=0.05, return_dict=False
    )
    pipe.disable_gradient_checkpointing()
    torch.testing.assert_close(history, plain.rewards_history, atol=1e-5, rtol=0)
    assert images.shape == (1, 3, 32, 32) and 0 <= images.min() and images.max() <= 1


PIXART_CALL = {"use_resolution_binning": False, "clean_caption": False}  # the base pipeline's extras
FLUX_SIZE = {"height": 32, "width": 32}


@pytest.mark.parametrize(
    "name, build, kwargs, noise_shape, base_extra",
    [
        ("lcm-1", lambda: lcm_pipeline(seed=0), {"num_inference_steps": 1, "guidance_scale": 1.5}, None, {}),
        ("lcm-2", lambda: lcm_pipeline(seed=0), {"num_inference_steps": 2, "guidance_scale": 8.5}, None, {}),
        (
            "turbo",
            lambda: sd_pipeline(seed=0, scheduler="euler"),
            {"num_inference_steps": 1, "guidance_scale": 0.0},
            None,
            {},
        ),
        (
            "sd-cfg",
            lambda: sd_pipeline(seed=0, scheduler="ddim"),
            {"num_inference_steps": 2, "guidance_scale": 3.0},
            None,
            {},
        ),
        (
            "sdxl-turbo",
            lambda: sdxl_pipeline(seed=0),
            {"num_inference_steps": 1, "guidance_scale": 0.0},
            None,
            {},
        ),
        (
            "sdxl-cfg",
            lambda: sdxl_pipeline(seed=0),
            {"num_inference_steps": 2, "guidance_scale": 3.0},
            None,
            {},
        ),
        (
            "flux-schnell",
            lambda: flux_pipeline(seed=0, schnell=True),
            {"num_inference_steps": 1, "guidance_scale": 0.0, "max_sequence_length": 256, **FLUX_SIZE},
            (1, 16, 16),  # packed: (32 / 4 / 2)^2 tokens of 4 x 4 channels
            {},
        ),
        (
            "flux-dev",
            lambda: flux_pipeline(seed=0),
            {"num_inference_steps": 2, "guidance_scale": 3.5, "max_sequence_length": 512, **FLUX_SIZE},
            (1, 16, 16),
            {},
        ),
        (
            "pixart-dmd",
            lambda: pixart_pipeline(seed=0),
            {"num_inference_steps": 1, "guidance_scale": 1.0, "timesteps": [400]},
            None,
            PIXART_CALL,
        ),
        (
            "pixart-cfg",
            lambda: pixart_pipeline(seed=0),
            {"num_inference_steps": 2, "guidance_scale": 3.0},
            None,
            PIXART_CALL,
        ),
    ],
)
def test_first_iteration_is_the_wrapped_pipeline(name, build, kwargs, noise_shape, base_extra, clip_reward):
    """Iteration 0 generates exactly what the wrapped diffusers pipeline does from the same noise."""
    base = build()
    noise = torch.randn(*(noise_shape or (1, 4, 8, 8)), generator=torch.Generator().manual_seed(1))
    expected = base(
        PROMPT,
        latents=noise,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        **kwargs,
        **base_extra,
    ).images
    out = ReNOPipeline.from_pipe(base)(
        PROMPT,
        rewards=[clip_reward],
        latents=noise,
        num_iterations=1,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        **kwargs,
    )
    torch.testing.assert_close(out.images, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "name, build, reno_class, kwargs",
    [
        (
            "sdxl-turbo",
            sdxl_pipeline,
            ReNOStableDiffusionXLPipeline,
            {"num_inference_steps": 1, "guidance_scale": 0.0},
        ),
        (
            "flux-schnell",
            lambda seed, save_to: flux_pipeline(seed=seed, save_to=save_to, schnell=True),
            ReNOFluxPipeline,
            {"num_inference_steps": 1, **FLUX_SIZE},
        ),
        ("pixart-dmd", pixart_pipeline, ReNOPixArtAlphaPipeline, {"num_inference_steps": 1}),
    ],
)
def test_new_architectures_reward_rises(
    name, build, reno_class, kwargs, tmp_path, clip_reward, pickscore_reward
):
    """from_pretrained picks the architecture; the ensemble reward rises and the best image is returned."""
    build(seed=0, save_to=tmp_path / name)
    pipe = ReNOPipeline.from_pretrained(str(tmp_path / name))
    assert type(pipe) is reno_class
    rewards = [(clip_reward, 2.0), (pickscore_reward, 0.05)]
    out = _run(pipe, rewards, num_iterations=6, **{"guidance_scale": 0.0, **kwargs})
    history = out.rewards_history[:, 0]
    assert (history[1:] > history[:-1]).sum() >= 4, history  # mostly increasing
    assert history[-1] > history[0]
    best = int(out.best_iteration[0])
    assert history[best] == history.max() >= history[0]
    # the returned image scores what the history says: the weighted sum of both rewards
    rescored = (
        2.0 * clip_reward(out.images, [PROMPT]).scores + 0.05 * pickscore_reward(out.images, [PROMPT]).scores
    )
    torch.testing.assert_close(rescored, history[best : best + 1], atol=1e-5, rtol=0)
    # and the returned noise regenerates it
    again = _run(pipe, rewards, num_iterations=1, latents=out.latents, **{"guidance_scale": 0.0, **kwargs})
    torch.testing.assert_close(again.images, out.images, atol=1e-5, rtol=0)
    # gradient checkpointing (denoiser and VAE) changes memory, not the optimisation
    pipe.enable_gradient_checkpointing()
    assert pipe.denoiser.is_gradient_checkpointing
    checkpointed = _run(pipe, rewards, num_iterations=2, **{"guidance_scale": 0.0, **kwargs})
    pipe.disable_gradient_checkpointing()
    torch.testing.assert_close(checkpointed.rewards_history, out.rewards_history[:2], atol=1e-5, rtol=0)


def test_architecture_specific_errors(clip_reward):
    flux = ReNOPipeline.from_pipe(flux_pipeline(seed=0, schnell=True))
    with pytest.raises(ValueError, match="custom timesteps are not supported"):
        _run(flux, [clip_reward], num_iterations=1, timesteps=[999], **FLUX_SIZE)
    with pytest.raises(ValueError, match=r"latents: expected shape \(1, 16, 16\)"):
        _run(flux, [clip_reward], num_iterations=1, latents=torch.randn(1, 4, 8, 8), **FLUX_SIZE)
    pixart = pixart_pipeline(seed=0)
    pixart.scheduler = DPMSolverMultistepScheduler.from_config(pixart.scheduler.config)
    with pytest.raises(ValueError, match="pred_original_sample"):
        _run(ReNOPipeline.from_pipe(pixart), [clip_reward], num_iterations=1, num_inference_steps=1)
    with pytest.raises(ValueError, match="ReNO supports"):
        ReNOPipeline.family("KandinskyPipeline")


def test_without_a_generator_every_iteration_sees_the_same_scheduler_noise(pipe, clip_reward):
    # ReNO's trainer re-seeds its generator every iteration; with none given, a 4-step LCM (which
    # re-noises between steps) must not optimise a different objective each iteration: at
    # learning rate 0 the reward stays put
    torch.manual_seed(3)
    out = pipe(
        PROMPT,
        rewards=[(clip_reward, 1.0)],
        num_inference_steps=4,
        guidance_scale=1.5,
        num_iterations=3,
        learning_rate=0.0,
        regularization_weight=0.0,
        output_type="pt",
    )
    history = out.rewards_history.flatten().tolist()
    assert history == [history[0]] * 3


def test_default_guidance_and_size_follow_the_model(pipe, clip_reward):
    # an LCM takes LatentConsistencyModelPipeline's w = 8.5 when the call gives no guidance
    seen = []
    encode = type(pipe)._encode
    type(pipe)._encode = lambda self, request: seen.append(request.guidance_scale) or encode(self, request)
    try:
        pipe(PROMPT, rewards=[clip_reward], num_iterations=1, output_type="pt")
    finally:
        type(pipe)._encode = encode
    assert seen == [8.5]
    # FLUX: 3.5 for dev (its guidance input), 0 for schnell; 512 px as ReNO's FLUX code
    dev = ReNOPipeline.from_pipe(flux_pipeline(seed=0))
    schnell = ReNOPipeline.from_pipe(flux_pipeline(seed=0, schnell=True))
    assert (dev._default_guidance(), schnell._default_guidance()) == (3.5, 0.0)
    assert dev._default_size() == (512, 512)
    assert ReNOPipeline.from_pipe(sd_pipeline(seed=0))._default_guidance() == 0.0


# -- the shipped toy models (issue #6): a real learned reward on a real one-step generator ----------

TOY_MODELS = Path(__file__).resolve().parents[2] / "assets" / "models"


def test_reward_rises_on_the_toy_lcm():
    """ReNO on the shipped toy-lcm with the shipped toy-clip score (the README's offline example):
    the toy-clip score of the returned image is at least the initial one and rises over iterations."""
    for name in ("toy-lcm", "toy-clip"):
        if not (TOY_MODELS / name / "card.json").is_file():
            pytest.fail(f"assets/models/{name} is not shipped")
    pipe = ReNOPipeline.from_pretrained(str(TOY_MODELS / "toy-lcm"))
    reward = load_reward(
        "clip", model=f"local-dir:{TOY_MODELS / 'toy-clip'}", pretrained=None, convention="cosine"
    )
    prompt = "a photo of a red circle"
    out = pipe(
        prompt,
        rewards=[(reward, 1.0)],
        num_inference_steps=1,
        guidance_scale=4.5,
        num_iterations=8,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
    )
    history = out.rewards_history[:, 0]
    best = int(out.best_iteration[0])
    assert history[best] == history.max() > history[0], history
    assert (history[1:] > history[:-1]).sum() >= 4, history  # mostly increasing
    rescored = reward(out.images, [prompt]).scores
    torch.testing.assert_close(rescored, history[best : best + 1], atol=1e-4, rtol=0)
