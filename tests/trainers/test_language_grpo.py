"""Language-only GRPO through the one trainer: G completions per prompt of the tiny Qwen2 LM, a
verifiable text reward, group advantages, the token_ppo update, checkpoints and exact resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from genalign.policies import LanguagePolicy, TokenTrajectory
from genalign.trainers import build_trainer, load_recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "toy" / "grpo_language.yaml"
LORA = "model.lora={rank: 4, alpha: 8, target_modules: [q_proj, k_proj, v_proj, o_proj]}"


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def make_trainer(tmp_path: Path, *overrides: str):
    config = load_recipe(RECIPE, [f"logging.run_dir={tmp_path}/run", "logging.progress=false", *overrides])
    return build_trainer(config, base_dir=RECIPE.parent)


def params(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.policy.named_trainable_parameters().items()}


def metrics_without_times(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in rows]


def test_the_recipe_builds_a_language_run(tmp_path):
    trainer = make_trainer(tmp_path)
    assert isinstance(trainer.policy, LanguagePolicy) and trainer.policy.lora is None
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    trajectory = batch.trajectory
    assert isinstance(trajectory, TokenTrajectory) and trajectory.batch_size == 32
    assert trajectory.settings.max_new_tokens == 16 and trajectory.completion_length <= 16
    # the reward scored the completions: its hits are the keyword counts of the decoded texts
    hits = torch.tensor([text.lower().count("red") for text in trajectory.completions], dtype=torch.float)
    torch.testing.assert_close(batch.rewards.cpu(), (hits.clamp(max=2) / 2))
    # group-normalised advantages: (r - group mean) / (group population std + 1e-4)
    rewards = batch.global_rewards.view(4, 8).double()
    expected = (rewards - rewards.mean(1, keepdim=True)) / (
        rewards.std(1, unbiased=False, keepdim=True) + 1e-4
    )
    torch.testing.assert_close(batch.advantages.double(), expected.flatten(), atol=1e-5, rtol=1e-5)


def test_first_inner_step_is_on_policy(tmp_path):
    trainer = make_trainer(tmp_path, LORA)
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    _, info = trainer.loss(trainer.policy, batch.trajectory, torch.zeros(32), batch.advantages)
    assert info["ratio"].item() == 1.0 and info["clipfrac"].item() == 0.0 and info["kl"].item() == 0.0
    minibatch = batch.trajectory.select([5, 17, 2, 30])  # the rows of a minibatch, re-scored alone
    ratio = torch.exp(trainer.policy.log_prob(minibatch).detach() - minibatch.log_probs)
    assert (ratio - 1).abs().max().item() < 1e-6


def test_reward_rises_over_a_short_run(tmp_path):
    trainer = make_trainer(tmp_path, "train.num_steps=20", "logging.checkpoint_every=0")
    history = trainer.train()
    rewards = [m["reward_mean"] for m in history]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.5, rewards
    assert all(math.isfinite(m["kl"]) for m in history) and history[-1]["kl"] > 0  # it left the reference
    final = trainer.run_dir / "final"
    assert (final / "config.json").is_file() and (final / "tokenizer_config.json").is_file()
    reloaded = LanguagePolicy.from_pretrained(final, train=False)
    for name, parameter in trainer.policy.model.named_parameters():
        torch.testing.assert_close(dict(reloaded.model.named_parameters())[name], parameter.detach())


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_resume_reproduces_an_uninterrupted_run(tmp_path, lora):
    extra = [LORA] if lora else []
    straight = make_trainer(tmp_path / "a", "train.num_steps=4", *extra)
    straight.train()
    first = make_trainer(tmp_path / "b", "train.num_steps=2", *extra)
    first.train()
    resumed = make_trainer(tmp_path / "b", "train.num_steps=4", "logging.resume=latest", *extra)
    resumed.train()
    assert resumed.step == 4
    a, b = params(straight), params(resumed)
    assert a.keys() == b.keys() and (all("lora_" in n for n in a) if lora else len(a) > 10)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)
    assert metrics_without_times(straight.metrics_path) == metrics_without_times(resumed.metrics_path)
    if lora:
        assert (resumed.run_dir / "final" / "adapter_model.safetensors").is_file()


def test_samples_are_written_as_text(tmp_path):
    trainer = make_trainer(tmp_path, "train.num_steps=1", "logging.sample_every=1")
    trainer.train()
    lines = (trainer.run_dir / "samples" / "step-000000.jsonl").read_text().splitlines()
    assert len(lines) == 32 and "completion" in json.loads(lines[0])
