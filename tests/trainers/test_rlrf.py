"""RLRF's GRPO stage on the language family (#25 items 1 and 3): metadata per sample reaches the
reward, bad SVG is floored and counted without crashing a step, the first ratio is 1 at T = 1.1,
and the toy recipes (SFT, then RLRF) run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from genalign.algorithms.schedules import learning_rate_factor
from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.strategies import step_generator
from genalign.trainers.strategies.svg import draw_indexed_groups

ROOT = Path(__file__).resolve().parents[2]
SFT = ROOT / "configs" / "toy" / "rlrf_sft.yaml"
RLRF = ROOT / "configs" / "toy" / "rlrf_im2svg.yaml"
QWEN = ROOT / "configs" / "qwen25vl" / "rlrf_im2svg.yaml"
# a small RL run straight from the tiny LLaVA (no SFT), without the CLIP term unless asked
SMALL = [
    "model.path=tiny:llava",
    "prompts.source_kwargs.count=8",
    "train.prompts_per_step=2",
    "train.group_size=4",
    "train.minibatch_size=4",
    "sampling.language.max_new_tokens=24",
    "reward.kwargs.embedder=null",
    "reward.kwargs.embedder_kwargs=null",
]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def make_trainer(recipe: Path, tmp_path: Path, *overrides: str):
    config = load_recipe(recipe, [f"logging.run_dir={tmp_path}/run", "logging.progress=false", *overrides])
    return build_trainer(config, base_dir=recipe.parent)


class Spy(torch.nn.Module):
    """Wraps the reward and records what each call got."""

    def __init__(self, reward):
        super().__init__()
        self.reward, self.calls = reward, []

    def forward(self, outputs, prompts, **metadata):
        self.calls.append({"outputs": list(outputs), "prompts": list(prompts), **metadata})
        return self.reward(outputs, prompts, **metadata)


def test_metadata_reaches_the_reward_per_sample(tmp_path):
    trainer = make_trainer(RLRF, tmp_path, *SMALL)
    spy = trainer.reward = Spy(trainer.reward)
    batch = trainer.strategy.collect(trainer.rollout_context(), 3)
    call = spy.calls[-1]
    pool = trainer.prompts
    # the rows the step drew, as the groups strategy draws them for (seed, step)
    rows, _, _ = draw_indexed_groups(len(pool), 2, 4, step_generator(trainer.config.train.seed, 3))
    assert rows.view(2, 4).unique(dim=1).shape[1] == 1 and rows[0] != rows[4]  # two groups of one input
    torch.testing.assert_close(call["targets"].cpu(), pool.metadata["images"][rows], atol=0, rtol=0)
    assert call["reference_svgs"] == [pool.metadata["reference_svgs"][i] for i in rows.tolist()]
    # the VLM was shown the same image as the reward's target
    torch.testing.assert_close(batch.trajectory.images, pool.metadata["images"][rows], atol=0, rtol=0)
    assert call["outputs"] == batch.trajectory.extras["svgs"]


def test_the_reference_svg_scores_its_maximum_and_bad_svg_gets_the_floor_and_is_counted(
    tmp_path, monkeypatch
):
    trainer = make_trainer(RLRF, tmp_path, *SMALL, "train.num_steps=1")
    pool, original = trainer.prompts, trainer.policy.rollout
    hostile = [
        "I cannot draw this.",  # no SVG at all
        '<svg viewBox="0 0 32 32"><rect x="1" y="2" width="3"',  # cut off mid-tag, repaired but empty
        '<!DOCTYPE svg [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]><svg>&b;</svg>',  # entities
        '<svg viewBox="0 0 32 32"><image href="file:///etc/passwd" width="32" height="32"/></svg>',
        '<svg viewBox="0 0 32 32"><rect width="9" height="9" fill="#ff0000"><g></svg>',  # malformed
        '<svg width="100000" height="100000"><rect width="100000" height="100000"/></svg>',  # huge canvas
    ]
    written = {}

    def rollout(prompts, **kwargs):
        trajectory = original(prompts, **kwargs)
        images = kwargs["images"]
        # sample 0 and 1 answer with their own input's ground truth (fenced, with prose)
        for row in (0, 1):
            match = (pool.metadata["images"] == images[row]).flatten(1).all(dim=1).nonzero()[0, 0]
            trajectory.completions[row] = f"```svg\n{pool.metadata['reference_svgs'][match]}\n```\nDone!"
        trajectory.completions[2:] = hostile
        written["completions"] = list(trajectory.completions)
        return trajectory

    monkeypatch.setattr(trainer.policy, "rollout", rollout)
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    rewards = batch.rewards.cpu()
    # image and edge terms 1; the recipe's one-sided length term (length_margin 0.1) is 1 at
    # L = L_ref (RLRF's own form, free only up to L_ref / 2, would give 0.75 and a score of 2.75 / 3)
    assert rewards[:2].tolist() == pytest.approx([1.0] * 2, abs=1e-5)
    assert rewards[2:].tolist() == [-1.0] * 6  # the floor
    assert batch.details["svg_missing"] == 1 and batch.details["svg_invalid"] == 6
    assert batch.details["svg_repaired"] == 1 and batch.details["svg_valid_fraction"] == pytest.approx(0.25)
    # a whole training step with the same mixed batch completes and logs the counts
    history = trainer.train()
    assert history[0]["reward_svg_invalid"] == 6 and math.isfinite(history[0]["policy_loss"])
    assert history[0]["nonfinite_grad_steps"] == 0


def test_first_inner_step_is_on_policy_at_temperature_1_1(tmp_path):
    trainer = make_trainer(RLRF, tmp_path, *SMALL)
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    assert batch.trajectory.settings.temperature == pytest.approx(1.1)
    _, info = trainer.loss(trainer.policy, batch.trajectory, torch.zeros(8), batch.advantages)
    assert info["ratio"].item() == 1.0 and info["clipfrac"].item() == 0.0
    sub = batch.trajectory.select([6, 1, 3])
    assert (torch.exp(trainer.policy.log_prob(sub) - sub.log_probs) - 1).abs().max().item() < 1e-6
    # no image placeholder is ever sampled (it would break the re-scoring forward)
    image_id = trainer.policy.tokenizer.convert_tokens_to_ids("<image>")
    assert not (batch.trajectory.completion_ids == image_id).any()


def test_text_to_svg_on_the_tiny_lm(tmp_path):
    trainer = make_trainer(
        RLRF,
        tmp_path,
        *SMALL,
        "model.path=tiny:qwen2",
        "model.frozen=[]",  # the recipe freezes a VLM's vision tower; an LM has none
        "train.svg.task=text_to_svg",
        "prompts.source_kwargs.task=text_to_svg",
        "train.num_steps=1",
    )
    spy = trainer.reward = Spy(trainer.reward)
    history = trainer.train()
    assert history[0]["reward_svg_invalid"] == 8  # a random LM writes no SVG: all at the floor
    assert spy.calls[0]["prompts"][0].startswith("a photo of")  # the caption is the prompt
    assert spy.calls[0]["targets"].shape == (8, 3, 32, 32)


def test_the_toy_recipes_run_sft_then_rlrf(tmp_path):
    sft = make_trainer(SFT, tmp_path / "sft", "train.num_steps=2", "prompts.source_kwargs.count=16")
    sft.train()
    final = sft.run_dir / "final"
    rl = make_trainer(
        RLRF,
        tmp_path / "rl",
        f"model.path={final}",
        "train.num_steps=2",
        "prompts.source_kwargs.count=8",
        "sampling.language.max_new_tokens=32",
    )
    assert rl.reward.embedder is not None  # the semantic term: toy-clip's image tower
    history = rl.train()
    assert len(history) == 2 and all(math.isfinite(row["reward_mean"]) for row in history)
    assert {"reward_svg_valid_fraction", "reward_svg_invalid", "ratio"} <= set(history[0])
    assert (rl.run_dir / "final" / "config.json").is_file()


def test_the_qwen25vl_recipe_loads_with_the_papers_settings():
    config = load_recipe(QWEN)
    train, language = config.train, config.sampling.language
    assert (train.prompts_per_step, train.group_size, train.num_steps) == (32, 64, 500)
    assert language.temperature == 1.1 and train.kl_coef == 0.0
    assert (train.token_ppo.eps_low, train.token_ppo.eps_high) == (0.4, 0.4)
    assert train.learning_rate == 1e-5 and train.lr_schedule == "step"
    steps_per_update = train.samples_per_step // (train.minibatch_size * train.gradient_accumulation_steps)
    assert steps_per_update == 1  # one optimiser step per training step: the decay counts steps
    assert learning_rate_factor(99, schedule="step", step_every=100, step_factor=0.3) == 1.0
    assert learning_rate_factor(250, schedule="step", step_every=100, step_factor=0.3) == pytest.approx(0.09)


@pytest.mark.slow
def test_toy_rlrf_runs_its_full_length(tmp_path):
    sft = make_trainer(SFT, tmp_path / "sft", "train.num_steps=100")
    sft.train()
    rl = make_trainer(RLRF, tmp_path / "rl", f"model.path={sft.run_dir / 'final'}", "train.num_steps=10")
    history = rl.train()
    assert all(math.isfinite(row["reward_mean"]) for row in history)
