"""The Wan2.1 Astrolabe recipes (``configs/wan/``): the released settings, and a step of each on the
tiny block-causal video model (LoRA on every Linear of the attention blocks; the streaming recipe
with one window a step under LongLive's local window)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.strategies.astrolabe import WINDOW_KEY

ROOT = Path(__file__).resolve().parents[2]
SELF_FORCING = ROOT / "configs" / "wan" / "astrolabe_self_forcing.yaml"
STREAMING = ROOT / "configs" / "wan" / "astrolabe_longlive_streaming.yaml"
GARDO = ROOT / "configs" / "wan" / "astrolabe_longlive_gardo.yaml"
TINY = [
    "model.path=tiny:ar_video",
    "model.dtype=float32",
    "model.lora.rank=4",
    "model.lora.alpha=4",
    "train.mixed_precision=no",
    "train.num_steps=1",
    "train.prompts_per_step=2",
    "train.group_size=2",
    "train.minibatch_size=2",
    "train.gradient_accumulation_steps=2",
    "sampling.height=32",
    "sampling.width=32",
    "prompts.file=null",
    "prompts.prompts=[a red circle moving right, a blue square falling]",
    "reward.kwargs.reward=jpeg_compressibility",
    "reward.kwargs.kwargs={}",
    "logging.trackers=[]",
    "logging.progress=false",
]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


@pytest.mark.parametrize(
    "recipe", [SELF_FORCING, STREAMING, GARDO], ids=["self_forcing", "longlive_streaming", "longlive_gardo"]
)
def test_the_recipes_hold_the_released_settings(recipe):
    config = load_recipe(recipe)
    train, options = config.train, config.train.astrolabe
    assert config.model.family == "ar_video" and "convert-ar-video" in recipe.read_text().split("name:")[0]
    assert (config.model.lora.rank, config.model.lora.alpha) == (256, 256)
    assert (train.learning_rate, train.adam_weight_decay, train.max_grad_norm) == (1e-5, 1e-4, 1.0)
    assert (train.prompts_per_step, train.group_size) == (16, 24)
    assert (
        train.prompts_per_step * train.group_size == train.minibatch_size * train.gradient_accumulation_steps
    )
    assert (options.beta, options.kl_weight, list(options.timesteps)) == (0.1, 1e-4, [1000, 750, 500, 250])
    assert train.minibatch_size == 8 * options.device_batch_size == 24  # 3 videos on each of 8 GPUs
    assert (config.sampling.num_inference_steps, config.sampling.guidance_scale) == (4, 1.0)
    if recipe == GARDO:  # HPSv3 per frame + VideoAlign-MQ on grayscale, weight 1 each, summed
        hps, mq = config.reward.kwargs["members"]
        assert config.reward.name == "ensemble" and (hps["weight"], mq["weight"]) == (1.0, 1.0)
        assert "normalize" not in hps and "normalize" not in mq
        assert (hps["kwargs"]["reward"], hps["kwargs"]["aggregation"], hps["kwargs"]["fraction"]) == (
            "hpsv3",
            "top_fraction",
            0.3,
        )
        assert (mq["name"], mq["kwargs"]["dimension"], mq["kwargs"]["grayscale"]) == (
            "videoalign",
            "MQ",
            True,
        )
        assert options.selective_kl and options.main_reward == hps["key"]
        assert list(config.model.local_window) == [12, 3] and options.num_latent_frames == 21
        return
    assert config.reward.kwargs["reward"] == "hpsv3"  # as released (it had been HPSv2.1 standing in)
    assert config.reward.kwargs["aggregation"] == "top_fraction" and config.reward.kwargs["fraction"] == 0.3
    if recipe == STREAMING:
        assert list(config.model.local_window) == [12, 3]
        assert (options.num_latent_frames, options.window_frames, options.window_per_step) == (240, 21, True)
    else:
        assert options.num_latent_frames == 21 and options.window_frames is None


def _step(recipe: Path, tmp_path: Path, *overrides: str):
    config = load_recipe(recipe, [f"logging.run_dir={tmp_path}/run", *TINY, *overrides])
    trainer = build_trainer(config, base_dir=recipe.parent)
    lora = [n for n, p in trainer.policy.named_trainable_parameters().items() if "lora_A" in n]
    # every Linear of the two attention blocks: q, k, v, o of both attentions and the feed-forward pair
    assert len(lora) == 2 * 10 and all(n.startswith("blocks.") for n in lora)
    before = {n: p.detach().clone() for n, p in trainer.policy.named_trainable_parameters().items()}
    history = trainer.train()
    after = trainer.policy.named_trainable_parameters()
    assert len(history) == 1 and math.isfinite(history[0]["policy_loss"])
    assert any(not torch.equal(before[n], after[n]) for n in before)
    return trainer, history[0]


def test_the_self_forcing_recipe_runs_a_step_on_the_tiny_video_model(tmp_path):
    _, metrics = _step(SELF_FORCING, tmp_path, "train.astrolabe.num_latent_frames=4")
    assert metrics["astrolabe_window_start"] == 0


def test_the_streaming_recipe_trains_one_window_a_step_under_the_local_window(tmp_path):
    trainer, metrics = _step(
        STREAMING,
        tmp_path,
        "model.local_window=[4, 2]",
        "train.astrolabe.num_latent_frames=12",
        "train.astrolabe.window_frames=4",
    )
    start, stop = trainer.strategy.step_window(trainer.policy, 0)
    assert stop == start + 4 and start % 2 == 0 and metrics["astrolabe_window_start"] == start
    assert trainer.policy.local_window.local_frames == 4
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    assert batch.trajectory.extras[WINDOW_KEY] == (start, stop) and batch.trajectory.latents.shape[-3] == stop


def test_the_gardo_recipe_runs_a_step_with_tiny_hpsv3_and_videoreward_checkpoints(tmp_path):
    """The recipe's own reward (its two members as written, pointed at tiny checkpoints in the
    official layouts) drives a step with the selective KL on the tiny video model."""
    from genalign.tiny.qwen_rm import hpsv3_checkpoint, qwen2_vl_base, videoreward_checkpoint

    base, processor = qwen2_vl_base(save_to=tmp_path / "qwen")
    hpsv3_checkpoint(base, processor, tmp_path / "HPSv3.safetensors")
    videoreward_checkpoint(base, processor, tmp_path / "videoreward", tmp_path / "qwen")
    hps, mq = load_recipe(GARDO).reward.kwargs["members"]
    small = {"dtype": "float32", "device": "cpu"}
    hps["kwargs"]["kwargs"].update(
        small, checkpoint=str(tmp_path / "HPSv3.safetensors"), base_model=str(tmp_path / "qwen"), pixels=256
    )
    mq["kwargs"].update(small, checkpoint=str(tmp_path / "videoreward"), min_pixels=64, max_pixels=256)
    overrides = [o for o in TINY if not o.startswith("reward.")]
    config = load_recipe(
        GARDO,
        [
            f"logging.run_dir={tmp_path}/run",
            *overrides,
            f"reward.kwargs.members={json.dumps([hps, mq])}",
            "model.local_window=[4, 2]",
            "train.astrolabe.num_latent_frames=4",
            "train.prompts_per_step=2",
            "train.group_size=4",
            "train.minibatch_size=4",
        ],
    )
    trainer = build_trainer(config, base_dir=GARDO.parent)
    history = trainer.train()
    metrics = history[0]
    assert math.isfinite(metrics["policy_loss"]) and metrics["selective_kl_fraction"] == pytest.approx(0.1)
    assert 0 <= metrics["selective_kl_selected"] <= 8
    batch = trainer.strategy.collect(trainer.rollout_context(), 1)
    details = batch.sample_details
    assert set(details) >= {"hpsv3", "mq"} and len(details["mq"]) == 8
    assert torch.allclose(
        torch.as_tensor(batch.rewards).float(),
        torch.as_tensor(details["hpsv3"]).float() + torch.as_tensor(details["mq"]).float(),
        atol=1e-5,
    )
