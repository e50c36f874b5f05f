"""Two policies in one trainer (PromptRL's rewriter and generator, issue #24 item 3): one optimiser
with a parameter group and learning rate per policy, one advantage per sample shared by both
losses, on-policy ratios of 1 for both halves, and exact resume of both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from genalign.policies import JointPolicy, JointTrajectory, LanguagePolicy, LoRASpec, load_policy
from genalign.rewards import load_reward
from genalign.tiny.language import qwen2_lm
from genalign.trainers import Trainer, load_recipe
from genalign.trainers.losses import JointLoss, PPOClipLoss, TokenPPOLoss
from genalign.trainers.strategies import GroupRolloutStrategy, RolloutBatch

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "tiny" / "ddpo_jpeg.yaml"
SMALL = [
    "sampling.num_inference_steps=4",
    "sampling.language.max_new_tokens=6",
    "train.method=grpo",
    "train.advantage=group",
    "train.prompts_per_step=2",
    "train.group_size=2",
    "train.minibatch_size=2",
    "train.timestep_fraction=0.5",
    "train.adam_weight_decay=0.0",
    "train.kl_coef=0.01",
    "train.policy_learning_rates={rewriter: 1.0e-2, generator: 2.0e-3}",
    "logging.progress=false",
]


class RewriteThenDraw(GroupRolloutStrategy):
    """A minimal rewriter -> generator chain: the LM completes each prompt, the generator draws
    prompt + completion, the reward scores the image against the original prompt."""

    def sample(self, context, step):
        prompts, group_ids, seeds = self.global_batch(context, step)
        rows = context.local_rows(len(prompts))
        local = [prompts[i] for i in rows.tolist()]
        policy = context.policy
        with context.precision():
            rewrites = policy["rewriter"].rollout(
                local, seeds=seeds[rows], **context.sampling.language.rollout_kwargs()
            )
            drawn = [f"{p} {c}" for p, c in zip(local, rewrites.completions, strict=True)]
            images = policy["generator"].rollout(drawn, seeds=seeds[rows] + 1, **context.rollout_kwargs())
        trajectory = JointTrajectory(
            {"generator": images, "rewriter": rewrites}, "generator", local, group_ids[rows], seeds[rows]
        )
        rewards, details = context.score(trajectory)
        return RolloutBatch.of_groups(context, trajectory, rewards, details, rows, prompts, group_ids)


class Recording:
    """Wraps a loss and keeps the advantages it is called with."""

    def __init__(self, loss):
        self.loss, self.seen = loss, []
        self.forward_process = loss.forward_process

    def __getattr__(self, name):
        return getattr(self.loss, name)

    def __call__(self, policy, trajectory, step_index, advantages):
        self.seen.append(advantages.detach().clone())
        return self.loss(policy, trajectory, step_index, advantages)


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def make_trainer(tmp_path: Path, *overrides: str, record: bool = False) -> Trainer:
    config = load_recipe(RECIPE, [*SMALL, f"logging.run_dir={tmp_path}/run", *overrides])
    generator = load_policy("sd", "tiny:sd", lora=LoRASpec(rank=4))
    rewriter = LanguagePolicy(*qwen2_lm(seed=0), lora=LoRASpec(rank=4, target_modules=["q_proj", "v_proj"]))
    policy = JointPolicy({"generator": generator, "rewriter": rewriter})
    losses = {"generator": PPOClipLoss(config.train), "rewriter": TokenPPOLoss(config.train)}
    if record:
        losses = {name: Recording(loss) for name, loss in losses.items()}
    return Trainer(
        policy,
        load_reward("jpeg_compressibility"),
        RewriteThenDraw(config.train),
        JointLoss(losses, primary="generator"),
        config,
        config.prompts.load(RECIPE.parent),
    )


def params(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.policy.named_trainable_parameters().items()}


def test_one_parameter_group_per_policy_with_its_learning_rate(tmp_path):
    trainer = make_trainer(tmp_path)
    groups = {g["name"]: g for g in trainer.optimizer.param_groups}
    assert set(groups) == {"generator", "rewriter"}
    assert groups["rewriter"]["lr"] == 1e-2 and groups["generator"]["lr"] == 2e-3
    named = trainer.policy.named_trainable_parameters()
    assert {id(p) for p in groups["rewriter"]["params"]} == {
        id(p) for n, p in named.items() if n.startswith("rewriter.")
    }
    before = params(trainer)
    metrics = trainer.train_step(0)
    after = params(trainer)
    for prefix in ("generator.", "rewriter."):
        moved = [n for n in before if n.startswith(prefix) and not torch.equal(before[n], after[n])]
        assert moved, prefix
    assert metrics["lr_rewriter"] == 1e-2 and metrics["lr_generator"] == 2e-3
    assert "rewriter_clipfrac" in metrics and "generator_clipfrac" in metrics


def test_both_losses_see_the_same_advantages_and_start_on_policy(tmp_path):
    trainer = make_trainer(tmp_path, record=True)
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    steps = torch.zeros(batch.trajectory.batch_size, dtype=torch.long)
    _, info = trainer.loss(trainer.policy, batch.trajectory, steps, batch.advantages)
    assert info["generator_ratio"].item() == 1.0 and info["rewriter_ratio"].item() == 1.0
    assert info["rewriter_kl"].item() == 0.0
    trainer.update(0, batch, trainer._trainable_steps(batch))
    seen = trainer.loss.losses
    assert len(seen["generator"].seen) == len(seen["rewriter"].seen) > 1
    for a, b in zip(seen["generator"].seen, seen["rewriter"].seen, strict=True):
        assert torch.equal(a, b)


def test_resume_reproduces_an_uninterrupted_joint_run(tmp_path):
    straight = make_trainer(tmp_path / "a", "train.num_steps=3")
    straight.train()
    first = make_trainer(tmp_path / "b", "train.num_steps=2")
    first.train()
    resumed = make_trainer(tmp_path / "b", "train.num_steps=3", "logging.resume=latest")
    resumed.train()
    a, b = params(straight), params(resumed)
    assert any(n.startswith("rewriter.") for n in a) and any(n.startswith("generator.") for n in a)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)

    def rows(path):
        return [
            {k: v for k, v in json.loads(line).items() if not k.startswith("time_")}
            for line in path.read_text().splitlines()
        ]

    assert rows(straight.metrics_path) == rows(resumed.metrics_path)
    final = resumed.run_dir / "final"
    assert (final / "rewriter" / "adapter_model.safetensors").is_file()
    assert (final / "generator" / "pytorch_lora_weights.safetensors").is_file()


def test_an_unknown_policy_learning_rate_names_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"train.policy_learning_rates.writer: no policy of that name"):
        make_trainer(tmp_path, "train.policy_learning_rates={writer: 1.0e-3}")
