"""toy-ar-video's guidance distillation stage (genalign/toy/generators/video_guidance.py): the target
is the teacher's guided velocity, the loss is the student's error against it on diffusion forcing's
noisy frames, and the stage writes a folder that loads as an ``ar_video`` policy."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from genalign.policies.video_kv_cache import causal_forward
from genalign.toy.generators.video import small_video_pipeline
from genalign.toy.generators.video_guidance import (
    guidance_distillation_loss,
    guided_velocity,
    train_guidance_distillation,
)
from genalign.toy.generators.video_train import (
    NUM_TRAIN_TIMESTEPS,
    diffusion_forcing_timesteps,
    prompt_embeddings,
)

ROOT = Path(__file__).resolve().parents[2]
TOY_CLIP = ROOT / "assets" / "models" / "toy-clip"
CAPTIONS = ["a red circle falling", "a blue square rising", "a green triangle moving left"]


@pytest.fixture(scope="module")
def pipe():
    return small_video_pipeline(TOY_CLIP)


def test_the_target_is_classifier_free_guidance_of_the_teachers_two_branches(pipe):
    teacher = pipe.transformer
    embeds, empty = prompt_embeddings(pipe, CAPTIONS), prompt_embeddings(pipe, [""])
    generator = torch.Generator().manual_seed(0)
    noised = torch.randn(3, 4, 8, 12, 12, generator=generator)
    timesteps, _ = diffusion_forcing_timesteps(3, 8, 2, generator)
    with torch.no_grad():
        conditional = causal_forward(teacher, noised, timesteps, embeds).float()
        unconditional = causal_forward(teacher, noised, timesteps, empty.expand(3, -1, -1)).float()
    for w in (0.0, 1.0, 3.0):
        torch.testing.assert_close(
            guided_velocity(teacher, noised, timesteps, embeds, empty, w),
            unconditional + w * (conditional - unconditional),
            atol=1e-5,
            rtol=1e-5,
        )


def test_the_loss_is_the_students_error_on_the_noisy_frames_by_hand(pipe):
    teacher = pipe.transformer
    student = copy.deepcopy(teacher)
    with torch.no_grad():  # a student that differs from its teacher
        for parameter in student.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    embeds, empty = prompt_embeddings(pipe, CAPTIONS), prompt_embeddings(pipe, [""])
    latents = torch.randn(3, 4, 8, 12, 12, generator=torch.Generator().manual_seed(1))
    loss = guidance_distillation_loss(
        student, teacher, latents, embeds, empty, 4, seed=5, first_block_prob=0.0
    )(0)
    loss = loss.detach()

    generator = torch.Generator().manual_seed(5)  # the same draws, in the same order
    index = torch.randint(3, (4,), generator=generator)
    videos, rows = latents[index], embeds[index]
    timesteps, noisy = diffusion_forcing_timesteps(4, 8, 2, generator)
    sigma = (timesteps / NUM_TRAIN_TIMESTEPS)[:, None, :, None, None]
    noised = (1 - sigma) * videos + sigma * torch.randn(videos.shape, generator=generator)
    with torch.no_grad():
        target = guided_velocity(teacher, noised, timesteps, rows, empty, 3.0)
        predicted = causal_forward(student, noised, timesteps, rows).float()
    errors = [
        (predicted[b, :, f] - target[b, :, f]).pow(2).mean()
        for b in range(4)
        for f in range(8)
        if noisy[b, f]
    ]
    assert float(loss) == pytest.approx(float(torch.stack(errors).mean()), rel=1e-5)
    # a student equal to its teacher has nothing to learn at w = 1, and something at w = 3
    same = copy.deepcopy(teacher)
    # (the teacher's two branches run as one batch: equal up to rounding, 1e-21 here)
    assert (
        float(guidance_distillation_loss(same, teacher, latents, embeds, empty, 4, 5, 1.0)(0).detach())
        < 1e-12
    )
    assert (
        float(guidance_distillation_loss(same, teacher, latents, embeds, empty, 4, 5, 3.0)(0).detach()) > 1e-4
    )
    with pytest.raises(ValueError, match="first_block_prob"):
        guidance_distillation_loss(same, teacher, latents, embeds, empty, 4, 5, 3.0, first_block_prob=2.0)


def test_the_stage_writes_a_folder_that_loads_and_rolls_out(pipe, tmp_path):
    from genalign.policies import load_policy

    pipe.save_pretrained(str(tmp_path / "teacher"))
    videos = (torch.randint(0, 256, (4, 8, 3, 48, 48), dtype=torch.uint8), CAPTIONS[:2] * 2)
    _, info = train_guidance_distillation(
        tmp_path / "teacher", tmp_path / "student", steps=3, batch_size=2, videos=videos
    )
    assert info["steps"] == 3 and all(torch.isfinite(torch.tensor(info["loss_history"])))
    policy = load_policy("ar_video", tmp_path / "student", train=False)
    teacher = load_policy("ar_video", tmp_path / "teacher", train=False)
    moved = [
        (a - b).abs().max().item()
        for a, b in zip(policy.denoiser.parameters(), teacher.denoiser.parameters(), strict=True)
    ]
    assert max(moved) > 0  # the student was trained
    trajectory = policy.rollout(["a red circle falling"], num_inference_steps=2, num_frames=4, generator=0)
    assert trajectory.images.shape[:2] == (1, 4) and torch.isfinite(trajectory.images).all()
