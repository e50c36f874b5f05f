"""The Qwen2.5-VL recipes (``configs/qwen25vl/``) run a step on the tiny Qwen2.5-VL: RLRF's GRPO
(``token_ppo``, first ratio exactly 1), Q-Hawkeye's (the degraded copy's packed pixels reach the
loss per sample) and an SFT step whose loss equals a per-pair computation without padding."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from genalign.algorithms import next_token_loss
from genalign.policies import LanguagePolicy, TokenSettings, teacher_forced_trajectory
from genalign.tiny.language import qwen25_vl
from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.losses.q_hawkeye import degraded_trajectory

ROOT = Path(__file__).resolve().parents[2]
RLRF = ROOT / "configs" / "qwen25vl" / "rlrf_im2svg.yaml"
KONIQ = ROOT / "configs" / "qwen25vl" / "q_hawkeye_koniq.yaml"
SFT = ROOT / "configs" / "toy" / "rlrf_sft.yaml"
TINY = [
    "model.path=tiny:qwen25_vl",
    "model.dtype=float32",
    "train.mixed_precision=no",
    "train.num_steps=1",
    "train.prompts_per_step=2",
    "train.group_size=4",
    "train.minibatch_size=4",
    "train.gradient_accumulation_steps=2",
    "sampling.language.max_new_tokens=16",
    "logging.progress=false",
]
TOY_SVG = (
    "prompts.source_kwargs={task: image_to_svg, count: 4, seed: 1, split: rl_train, canvas: 32, "
    "svg_style: canonical}"
)


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def make_trainer(recipe: Path, tmp_path: Path, *overrides: str):
    config = load_recipe(recipe, [f"logging.run_dir={tmp_path}/run", *TINY, *overrides])
    return build_trainer(config, base_dir=recipe.parent)


class Spread(torch.nn.Module):
    """The recipe's reward plus 0.1 per sample index: a random tiny model writes no SVG (every
    sample at the floor, zero advantages), so the step needs rewards that differ in a group."""

    def __init__(self, reward):
        super().__init__()
        self.reward = reward

    def forward(self, outputs, prompts, **metadata):
        out = self.reward(outputs, prompts, **metadata)
        spread = 0.1 * torch.arange(len(outputs), dtype=out.scores.dtype, device=out.scores.device)
        return dataclasses.replace(out, scores=out.scores + spread)


def trained(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.policy.named_trainable_parameters().items()}


@pytest.mark.parametrize("recipe", [RLRF, KONIQ], ids=["rlrf", "koniq"])
def test_the_recipes_load_and_name_qwen25_vl(recipe):
    config = load_recipe(recipe)
    assert config.model.family == "language" and config.model.path.startswith("Qwen/Qwen2.5-VL")
    header = recipe.read_text().split("name:")[0]
    assert "NOT RUNNABLE" not in header and "tiny:qwen25_vl" in header


def test_rlrf_recipe_counts_length_in_the_models_tokens():
    config = load_recipe(RLRF)
    assert config.reward.kwargs["length_tokenizer"] == config.model.path


def test_rlrf_recipe_runs_a_grpo_step_on_the_tiny_qwen25_vl(tmp_path):
    trainer = make_trainer(
        RLRF,
        tmp_path,
        "prompts.records=null",
        "prompts.source=genalign.toy.svg_tasks:toy_svg_pool",
        TOY_SVG,
        "reward.kwargs.embedder=null",
        "reward.kwargs.embedder_kwargs=null",
        "reward.kwargs.length_tokenizer=null",  # the 7B's tokenizer is on the hub; characters here
    )
    assert trainer.policy.multimodal_positions
    trainer.reward = Spread(trainer.reward)
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    trajectory = batch.trajectory
    assert isinstance(trajectory.model_inputs["pixel_values"], list)
    _, info = trainer.loss(trainer.policy, trajectory, torch.zeros(8), batch.advantages)
    assert info["ratio"].item() == 1.0 and info["clipfrac"].item() == 0.0
    sub = trajectory.select([6, 1, 3])
    assert (torch.exp(trainer.policy.log_prob(sub) - sub.log_probs) - 1).abs().max().item() < 1e-6
    before = trained(trainer)
    history = trainer.train()
    assert len(history) == 1 and math.isfinite(history[0]["reward_mean"])
    after = trained(trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before)  # the step moved the weights


def test_koniq_recipe_runs_a_q_hawkeye_step_on_the_tiny_qwen25_vl(tmp_path):
    trainer = make_trainer(
        KONIQ,
        tmp_path,
        "prompts.source=genalign.toy.quality:toy_quality_pool",
        "prompts.source_kwargs={split: train, scenes: 1, seed: 0}",
        "train.num_steps=1",
    )
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    trajectory = batch.trajectory
    degraded = trajectory.extras["degraded:pixel_values"]
    assert isinstance(degraded, list) and len(degraded) == trajectory.batch_size
    sub = trajectory.select([5, 2])
    assert torch.equal(sub.extras["degraded:pixel_values"][0], degraded[5])
    with torch.no_grad():  # the degraded image changes the judge's log-probs, row by row
        original = trainer.policy.log_prob(sub)
        changed = trainer.policy.log_prob(degraded_trajectory(sub))
        full = trainer.policy.log_prob(degraded_trajectory(trajectory))
    assert torch.equal(original, sub.log_probs) and not torch.equal(original, changed)
    torch.testing.assert_close(changed, full[[5, 2]], atol=1e-6, rtol=0)
    history = trainer.train()
    assert math.isfinite(history[0]["perception_k3"]) and history[0]["perception_k3"] >= 0


def test_sft_step_on_the_tiny_qwen25_vl(tmp_path):
    trainer = make_trainer(
        SFT,
        tmp_path,
        "train.group_size=1",
        "train.prompts_per_step=4",
        "train.minibatch_size=2",
        "train.gradient_accumulation_steps=1",
        "prompts.source_kwargs.count=8",
    )
    before = trained(trainer)
    history = trainer.train()
    assert math.isfinite(history[0]["sft_loss"]) and history[0]["sft_loss"] > 0
    after = trained(trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    reloaded = LanguagePolicy.from_pretrained(trainer.run_dir / "final", lora=None, train=False)
    assert reloaded.multimodal_positions  # the saved folder is a Qwen2.5-VL with its processor
    saved = dict(reloaded.model.named_parameters())
    assert all(torch.equal(saved[name], value) for name, value in after.items())


def test_sft_loss_equals_a_per_pair_computation_without_padding():
    """Two images of different sizes, a left-padded prompt and a right-padded target: the batched
    loss equals each pair alone, where the model computes its own 3-D positions unpadded."""
    policy = LanguagePolicy(*qwen25_vl(seed=0), lora=None, train=True)
    prompts, targets = ["a square", "draw a red circle please"], ['<svg><circle r="3"/></svg>', "<svg/>"]
    generator = torch.Generator().manual_seed(0)
    images = [torch.rand(3, 32, 32, generator=generator), torch.rand(3, 24, 40, generator=generator)]
    settings = TokenSettings(1.0, 1, True, None)
    trajectory = teacher_forced_trajectory(policy, prompts, targets, images, settings)
    assert (trajectory.attention_mask == 0).any(dim=1).all()
    loss, info = next_token_loss(policy.log_prob(trajectory), trajectory.completion_mask)
    total, count, end = 0.0, 0, policy.eos_token_ids[0]
    for i in range(2):
        encoded = policy.encode_prompts([prompts[i]], settings, [images[i]])
        prompt_ids = encoded.pop("input_ids")[0]
        encoded.pop("attention_mask")
        target_ids = policy.tokenizer(targets[i], add_special_tokens=False)["input_ids"] + [end]
        ids = torch.cat([prompt_ids, torch.tensor(target_ids)])[None]
        types = torch.nn.functional.pad(encoded.pop("mm_token_type_ids"), (0, len(target_ids)))
        with torch.no_grad():
            logits = (
                policy.model(
                    input_ids=ids,
                    mm_token_type_ids=types,
                    pixel_values=encoded["pixel_values"][0],
                    image_grid_thw=encoded["image_grid_thw"],
                )
                .logits[0]
                .double()
            )
        logits[:, policy.suppressed_token_ids] = float("-inf")
        for k, token in enumerate(target_ids):
            total -= torch.log_softmax(logits[len(prompt_ids) + k - 1], dim=-1)[token].item()
            count += 1
    assert int(info["target_tokens"]) == count
    assert loss.item() == pytest.approx(total / count, abs=1e-5)


def test_a_qwen25_vl_rewriter_runs_promptrl_text_only(tmp_path):
    """PromptRL's rewriter is UniRL's Qwen2.5-VL-3B, shown no image: the joint toy recipe with the
    tiny Qwen2.5-VL as rewriter starts on-policy for both models and trains a step."""
    recipe = ROOT / "configs" / "toy" / "promptrl.yaml"
    overrides = [
        f"logging.run_dir={tmp_path}/run",
        "model.path=tiny:sd",
        "rewriter.path=tiny:qwen25_vl",
        "reward.name=jpeg_compressibility",
        "prompts.file=null",
        "prompts.prompts=[a red circle, a blue square, a green triangle]",
        "sampling.num_inference_steps=4",
        "sampling.num_sde_steps=2",
        "sampling.guidance_scale=3.0",
        "sampling.language.max_new_tokens=6",
        "train.num_steps=1",
        "train.prompts_per_step=1",
        "train.group_size=4",
        "train.minibatch_size=4",
        "logging.progress=false",
        "logging.checkpoint_every=0",
    ]
    trainer = build_trainer(load_recipe(recipe, overrides), base_dir=recipe.parent)
    rewriter = trainer.policy["rewriter"]
    assert rewriter.multimodal_positions and rewriter.is_vlm
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    steps = torch.zeros(batch.trajectory.batch_size, dtype=torch.long)
    _, info = trainer.loss(trainer.policy, batch.trajectory, steps, batch.advantages)
    assert info["rewriter_ratio"].item() == 1.0 and info["generator_ratio"].item() == 1.0
    history = trainer.train()
    assert math.isfinite(history[0]["grad_norm"])


@pytest.mark.parametrize("folder", ["flux", "sd35"])
def test_the_promptrl_recipes_use_unirls_qwen25_vl_rewriter(folder):
    config = load_recipe(ROOT / "configs" / folder / "promptrl_geneval.yaml")
    assert config.rewriter.path == "Qwen/Qwen2.5-VL-3B-Instruct"
