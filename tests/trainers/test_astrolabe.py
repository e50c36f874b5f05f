"""Astrolabe on the ar_video family: the loss against the NFT x0 form, its draws, recipe checks,
and ``genalign train`` on the tiny video model with exact resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from genalign.algorithms.astrolabe import draw_window_start, window_pixel_frames
from genalign.algorithms.nft import nft_loss_in_x0
from genalign.config import ConfigError
from genalign.policies import load_policy, video_kv_cache
from genalign.trainers.config import load_recipe
from genalign.trainers.losses import AstrolabeLoss
from genalign.trainers.losses.forward_process import seeded_noise

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "astrolabe_jpeg.yaml"
SIZE = {"height": 32, "width": 32}


@pytest.fixture(scope="module")
def video_policy(tmp_path_factory):
    os.environ["GENALIGN_TINY_CACHE"] = str(tmp_path_factory.getbasetemp() / "tiny-cache")
    return load_policy("ar_video", "tiny:ar_video", lora={"rank": 4})


def _loss(tmp_path, overrides=()) -> AstrolabeLoss:
    config = load_recipe(RECIPE, [f"logging.run_dir={tmp_path}/run", *overrides])
    return AstrolabeLoss(config.train)


def _record_levels(policy, monkeypatch) -> list[torch.Tensor]:
    """The per-frame levels of every ``predict_video_x0`` call, in call order."""
    seen: list[torch.Tensor] = []
    predict = type(policy).predict_video_x0
    monkeypatch.setattr(
        type(policy),
        "predict_video_x0",
        lambda self, x, levels, c: seen.append(levels) or predict(self, x, levels, c),
    )
    return seen


def _nft_x0_loss(policy, loss, trajectory, t, levels, call, step, advantages) -> torch.Tensor:
    """The loss computed independently: x_t = (1 - t) x0 + t eps with the loss call's keyed noise,
    x0_hat = x_t - t v of the old and the trained model, then DiffusionNFT's x0 form (no adaptive
    weighting, no c/beta), averaged over the batch. ``t``: a float or ``[B, 1, 1, 1, 1]``."""
    x0 = trajectory.latents[:, -1]
    eps = seeded_noise(trajectory.seeds, torch.full((len(x0),), call), x0.shape[1:], step=step)
    x_t = (1 - t) * x0 + t * eps
    with torch.no_grad(), loss.old_policy(policy):
        x0_old = x_t - t * policy.transformer_output(x_t, levels, trajectory.conditioning)
    x0_theta = x_t - t * policy.transformer_output(x_t, levels, trajectory.conditioning)
    per_sample, _ = nft_loss_in_x0(
        x0_theta,
        x0_old,
        x0,
        x0_theta,
        x0_old,
        x0,
        advantages,
        beta=0.1,
        adaptive_weighting=False,
        clip_over_beta=False,
    )
    return per_sample.mean()


def test_a_one_block_video_gives_the_nft_x0_loss(video_policy, tmp_path):
    policy = video_policy
    trajectory = policy.rollout(["a red circle"], group_size=3, generator=0, num_frames=2, **SIZE)
    loss = _loss(tmp_path, ["train.astrolabe.kl_weight=0"])
    loss.begin_step(7)
    loss._ensure_old(policy)
    with torch.no_grad():  # the old policy differs from the current one
        for old in loss.old_parameters:
            old.add_(0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(old.numel())))
    advantages = torch.tensor([2.0, -1.0, 0.5])
    timestep, t = loss.draw_level()
    value, metrics = loss(policy, trajectory, torch.zeros(3, dtype=torch.long), advantages)
    levels = torch.full((3, 2), float(timestep))
    torch.testing.assert_close(value, _nft_x0_loss(policy, loss, trajectory, t, levels, 0, 7, advantages))
    assert float(metrics["astrolabe_timestep"]) == timestep and timestep in (1000, 750, 500, 250)


def test_one_level_per_call_for_every_frame_keyed_by_step_and_call(video_policy, tmp_path, monkeypatch):
    policy = video_policy
    trajectory = policy.rollout(["a blue square"], group_size=2, generator=1, num_frames=4, **SIZE)
    seen = _record_levels(policy, monkeypatch)
    loss = _loss(tmp_path)
    draws = []
    for step in (3, 3, 4):
        loss.begin_step(step)
        for _ in range(4):
            draws.append(loss.draw_level()[0])
            loss(policy, trajectory, torch.zeros(2, dtype=torch.long), torch.tensor([1.0, -1.0]))
    # old, current and reference predictions at one level for every frame of every sample
    assert len(seen) == 3 * 12 and all(levels.unique().numel() == 1 for levels in seen)
    assert [int(levels[0, 0]) for levels in seen[::3]] == draws
    assert draws[:4] == draws[4:8]  # the same step replays the same levels
    assert set(draws) <= {1000, 750, 500, 250} and len(set(draws)) > 1


def test_one_level_per_device_batch_of_rows(video_policy, tmp_path, monkeypatch):
    # train.astrolabe.device_batch_size: each chunk of rows its own level (the official draws one
    # per GPU minibatch), every frame of a row at its chunk's level, the loss as computed by hand
    policy = video_policy
    trajectory = policy.rollout(["a red circle"], group_size=4, generator=3, num_frames=2, **SIZE)
    loss = _loss(tmp_path, ["train.astrolabe.device_batch_size=1", "train.astrolabe.kl_weight=0"])
    seen = _record_levels(policy, monkeypatch)
    advantages = torch.tensor([2.0, -1.0, 0.5, 0.0])
    rows = set()
    for call in range(4):
        loss.begin_step(5)
        loss.calls = call
        drawn, _ = loss._draws(2, 2, 4)
        assert len(drawn) == 4 and drawn[0] == loss.draw_level()
        value, _ = loss(policy, trajectory, torch.zeros(4, dtype=torch.long), advantages)
        levels = seen[-1]
        assert levels.tolist() == [[level] * 2 for level, _ in drawn]
        rows.add(tuple(level for level, _ in drawn))
        t = torch.tensor([t for _, t in drawn]).reshape(4, 1, 1, 1, 1)
        expected = _nft_x0_loss(policy, loss, trajectory, t, levels.float(), call, 5, advantages)
        torch.testing.assert_close(value, expected)
    assert any(len(set(levels)) > 1 for levels in rows)  # rows of one call at different levels
    with pytest.raises(ConfigError, match="train.astrolabe.device_batch_size must be positive"):
        _loss(tmp_path, ["train.astrolabe.device_batch_size=0"])


def test_recipe_checks_name_the_key(tmp_path):
    run = f"logging.run_dir={tmp_path}/run"
    with pytest.raises(ConfigError, match="train.method 'astrolabe' is for the 'ar_video' family"):
        load_recipe(RECIPE, [run, "model.family=flow"])
    with pytest.raises(ConfigError, match="train.loss 'astrolabe'"):
        load_recipe(RECIPE, [run, "train.method=grpo", "train.loss=nft"])
    # B2-DiffuRL branches trajectories (continue_rollout), which the ar_video family does not
    with pytest.raises(ConfigError, match="model.family 'ar_video' trains with train.strategy 'astrolabe'"):
        load_recipe(RECIPE, [run, "train.method=grpo", "train.strategy=b2diffurl"])
    with pytest.raises(ConfigError, match="sampling.guidance_scale must be 1.0"):
        load_recipe(RECIPE, [run, "sampling.guidance_scale=4.0"])
    with pytest.raises(ConfigError, match="train.astrolabe.timesteps"):
        load_recipe(RECIPE, [run, "train.astrolabe.timesteps=[1500]"])


def _train(tmp_path, name, *overrides) -> list[dict]:
    from genalign.cli import main

    assert main(["train", str(RECIPE), f"logging.run_dir={tmp_path}/{name}", *overrides]) == 0
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_genalign_train_runs_astrolabe_on_the_tiny_video_model_and_resumes_exactly(tmp_path):
    from genalign.trainers.checkpoint import latest_checkpoint, load_checkpoint

    straight = _train(tmp_path, "a", "train.num_steps=2")
    assert [row["step"] for row in straight] == [0, 1]
    assert all(row["param_change"] > 0 and row["samples"] == 4 for row in straight)
    assert straight[1]["astrolabe_old_decay"] == pytest.approx(0.004)  # eta = 0.001 x 4 optimiser steps
    assert (tmp_path / "a" / "final" / "pytorch_lora_weights.safetensors").is_file()
    _train(tmp_path, "b", "train.num_steps=1")
    resumed = _train(tmp_path, "b", "train.num_steps=2", "logging.resume=latest")
    assert resumed[1]["reward_mean"] == straight[1]["reward_mean"]
    assert resumed[1]["policy_loss"] == pytest.approx(straight[1]["policy_loss"], rel=1e-6)
    a = load_checkpoint(latest_checkpoint(tmp_path / "a"))
    b = load_checkpoint(latest_checkpoint(tmp_path / "b"))
    for group in ("trainable", "loss"):
        assert sorted(a.tensors[group]) == sorted(b.tensors[group]) and a.tensors[group]
        for key in a.tensors[group]:
            torch.testing.assert_close(a.tensors[group][key], b.tensors[group][key])


def test_a_streaming_window_trains_the_window_against_a_detached_history(video_policy, tmp_path):
    policy = video_policy
    trajectory = policy.rollout(["a red circle"], group_size=2, generator=2, num_frames=6, **SIZE)
    windowed = _loss(tmp_path, ["train.astrolabe.window_frames=2", "train.astrolabe.kl_weight=0"])
    advantages = torch.tensor([1.5, -1.5])
    starts = set()
    for call in range(6):
        windowed.begin_step(0)
        windowed.calls = call
        levels, start = windowed._draws(6, 2, 2)
        (timestep, t) = levels[0]
        value, metrics = windowed(policy, trajectory, torch.zeros(2, dtype=torch.long), advantages)
        assert float(metrics["astrolabe_window_start"]) == start
        starts.add(start)
        # the same value from the full forward's x0 on the window (history values are the same)
        x0 = trajectory.latents[:, -1]
        eps = seeded_noise(trajectory.seeds, torch.full((2,), call), x0.shape[1:], step=0)
        x_t = (1 - t) * x0 + t * eps
        with torch.no_grad():
            x0_theta = policy.predict_video_x0(
                x_t, torch.full((2, 6), float(timestep)), trajectory.conditioning
            )
        window = slice(start, start + 2)
        per_sample, _ = nft_loss_in_x0(
            x0_theta[:, :, window],
            x0_theta[:, :, window],
            x0[:, :, window],
            x0_theta[:, :, window],
            x0_theta[:, :, window],
            x0[:, :, window],
            advantages,
            beta=0.1,
            adaptive_weighting=False,
            clip_over_beta=False,
        )
        torch.testing.assert_close(value.detach(), per_sample.mean(), atol=1e-5, rtol=1e-4)
    assert len(starts) > 1 and starts <= {0, 2, 4}


def test_window_starts_are_uniform_over_the_block_starts_and_pixel_frames_follow_the_vae():
    generator = torch.Generator().manual_seed(0)
    counts = torch.bincount(
        torch.tensor([draw_window_start(generator, 8, 4, 2) for _ in range(3000)]), minlength=5
    )
    # starts 0, 2, 4 (a window of 4 in 8 frames, blocks of 2), a third each; never off a block
    assert counts[[1, 3]].sum() == 0 and (counts[[0, 2, 4]] - 1000).abs().max() < 100
    assert draw_window_start(generator, 4, 6, 2) == 0  # a window longer than the video
    # Wan: the first latent frame is one pixel frame, each later one four
    assert window_pixel_frames(0, 21, 4) == (0, 81)
    assert window_pixel_frames(3, 6, 4) == (9, 21)
    assert window_pixel_frames(2, 4, 1) == (2, 4)
    with pytest.raises(ValueError, match=r"latent frames \[3, 3\)"):
        window_pixel_frames(3, 3, 4)


def test_a_window_per_step_is_rolled_out_scored_and_trained_as_one(tmp_path, monkeypatch):
    """``window_per_step``: one window a step, keyed by (seed, step); the rollout stops at its end,
    the reward sees only its pixel frames, and every loss call of the step trains it."""
    from genalign.trainers import build_trainer
    from genalign.trainers.strategies.astrolabe import WINDOW_KEY

    overrides = [
        f"logging.run_dir={tmp_path}/run",
        "train.astrolabe.num_latent_frames=8",
        "train.astrolabe.window_frames=4",
        "train.astrolabe.window_per_step=true",
        "train.timestep_fraction=1.0",
    ]
    trainer = build_trainer(load_recipe(RECIPE, overrides), base_dir=RECIPE.parent)
    scored = []
    reward = trainer.reward
    monkeypatch.setattr(
        trainer,
        "reward",
        lambda outputs, prompts, **m: scored.append(outputs) or reward(outputs, prompts, **m),
    )
    windows, starts = [], set()
    for step in range(6):
        window = trainer.strategy.step_window(trainer.policy, step)
        assert window == trainer.strategy.step_window(trainer.policy, step)  # a function of (seed, step)
        windows.append(window)
    assert {start for start, _ in windows} <= {0, 2, 4} and len({start for start, _ in windows}) > 1
    assert all(stop == start + 4 for start, stop in windows)
    batch = trainer.strategy.collect(trainer.rollout_context(), 3)
    start, stop = windows[3]
    trajectory = batch.trajectory
    assert trajectory.extras[WINDOW_KEY] == (start, stop) and trajectory.latents.shape[-3] == stop
    first, end = window_pixel_frames(start, stop, trainer.policy.temporal_factor)
    assert torch.equal(scored[-1], trajectory.images[:, first:end])  # the window's frames only
    trainer.loss.begin_step(3)
    for _ in range(3):
        _, metrics = trainer.loss(
            trainer.policy, trajectory.select([0, 1]), torch.zeros(2, dtype=torch.long), batch.advantages[:2]
        )
        starts.add(float(metrics["astrolabe_window_start"]))
    assert starts == {float(start)}
    with pytest.raises(ConfigError, match="window_per_step .* needs train.astrolabe.window_frames"):
        load_recipe(RECIPE, [f"logging.run_dir={tmp_path}/bad", "train.astrolabe.window_per_step=true"])


def test_model_local_window_reaches_the_policy_and_bad_values_name_the_key(tmp_path, monkeypatch):
    run = f"logging.run_dir={tmp_path}/run"
    with pytest.raises(ConfigError, match="model.local_window is for the 'ar_video' family"):
        load_recipe(RECIPE, [run, "model.family=flow", "model.local_window=[6, 2]"])
    with pytest.raises(ConfigError, match=r"model.local_window must be \[local_frames, sink_frames\]"):
        load_recipe(RECIPE, [run, "model.local_window=[6]"])
    with pytest.raises(ConfigError, match=r"model.local_window \[2, 2\]: need local_frames > sink_frames"):
        load_recipe(RECIPE, [run, "model.local_window=[2, 2]"])
    from genalign.cli import main
    from genalign.policies import ARVideoPolicy

    windows = []
    sample_blocks = ARVideoPolicy._sample_blocks
    monkeypatch.setattr(
        ARVideoPolicy,
        "_sample_blocks",
        lambda self, *a: windows.append(self.local_window) or sample_blocks(self, *a),
    )
    assert main(["train", str(RECIPE), run, "train.num_steps=1", "model.local_window=[4, 2]"]) == 0
    assert windows and all(w == video_kv_cache.LocalWindow(local_frames=4, sink_frames=2) for w in windows)
    # a window a block cannot see itself in: one line naming the values
    assert main(["train", str(RECIPE), f"logging.run_dir={tmp_path}/bad", "model.local_window=[3, 2]"]) == 2
