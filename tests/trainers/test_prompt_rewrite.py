"""The prompt_rewrite strategy (PromptRL, arXiv 2602.01382; issue #24 item 4 and its tests),
built from YAML (configs/toy/promptrl.yaml with tiny models): a copying rewriter reproduces the
plain groups batch bit for bit, both policies start on-policy, retained rows get no rewriter
gradient, the reward sees the original prompts, bad rewrites fall back, resume is exact."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
import torch

from genalign.config import ConfigError
from genalign.trainers import load_recipe
from genalign.trainers.strategies import GroupRolloutStrategy
from genalign.trainers.trainer import build_trainer

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "toy" / "promptrl.yaml"
FLOW_RECIPE = ROOT / "configs" / "toy" / "promptrl_flow.yaml"
TINY = [
    "model.path=tiny:sd",
    "rewriter.path=tiny:qwen2",  # the strategy tests want the random rewriter (the recipe ships toy-rewriter)
    "reward.name=jpeg_compressibility",
    "prompts.file=null",
    "prompts.prompts=[a red circle, a blue square, a green triangle]",
    "sampling.num_inference_steps=4",
    "sampling.num_sde_steps=2",
    "sampling.guidance_scale=3.0",
    "sampling.language.max_new_tokens=6",
    "train.prompts_per_step=1",
    "train.group_size=4",
    "train.minibatch_size=4",
    "train.learning_rate=1.0e-3",
    "rewriter.learning_rate=1.0e-2",
    "logging.progress=false",
    "logging.checkpoint_every=0",
]
ORIGINAL = re.compile(r"Original prompt: (.*)\. Directly provide", re.DOTALL)


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def make(tmp_path: Path, *overrides: str):
    config = load_recipe(RECIPE, [*TINY, f"logging.run_dir={tmp_path}/run", *overrides])
    return build_trainer(config, base_dir=RECIPE.parent)


def rewrite_with(trainer, write):
    """Make the rewriter's completions ``write(original_prompt, row)`` (its tokens stay sampled)."""
    rewriter = trainer.policy["rewriter"]
    sample = rewriter.rollout

    def rollout(prompts, **kwargs):
        out = sample(prompts, **kwargs)
        originals = [ORIGINAL.search(p).group(1) for p in prompts]
        out.completions = [write(p, i) for i, p in enumerate(originals)]
        return out

    rewriter.rollout = rollout


def test_a_copying_rewriter_reproduces_the_groups_batch_bit_for_bit(tmp_path):
    trainer = make(tmp_path)
    rewrite_with(trainer, lambda p, i: f"<answer>{p}</answer>")
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    context = dataclasses.replace(trainer.rollout_context(), policy=trainer.policy["generator"])
    plain = GroupRolloutStrategy(trainer.config.train).collect(context, 0)
    images = batch.trajectory.parts["generator"]
    assert images.prompts == plain.trajectory.prompts == batch.trajectory.prompts
    for key in ("images", "latents", "log_probs", "seeds"):
        assert torch.equal(getattr(images, key), getattr(plain.trajectory, key)), key
    assert torch.equal(batch.rewards - 1.0, plain.rewards)  # format reward 1 on every row
    torch.testing.assert_close(batch.advantages, plain.advantages, atol=1e-5, rtol=0)
    assert batch.metrics["format_reward"] == 1.0


def test_both_policies_start_on_policy_and_only_the_sde_prefix_trains(tmp_path):
    trainer = make(tmp_path)
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    assert trainer._trainable_steps(batch).tolist() == [0, 1]  # sampling.num_sde_steps: 2 of 4
    groups = {g["name"]: g["lr"] for g in trainer.optimizer.param_groups}
    assert groups == {"generator": 1e-3, "rewriter": 1e-2}
    for k in (0, 1):
        steps = torch.full((batch.trajectory.batch_size,), k, dtype=torch.long)
        _, info = trainer.loss(trainer.policy, batch.trajectory, steps, batch.advantages)
        assert info["generator_ratio"].item() == 1.0 and info["rewriter_ratio"].item() == 1.0
        assert info["generator_kl"].item() == 0.0 and info["rewriter_kl"].item() == 0.0


def test_retained_rows_draw_the_original_prompt_and_get_no_rewriter_gradient(tmp_path):
    trainer = make(tmp_path, "train.prompt_rewrite.num_retained=2")
    rewrite_with(trainer, lambda p, i: f"<answer>{p} and a cat</answer>" if i % 2 else "no tag")
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    trajectory = batch.trajectory
    original = trajectory.prompts[0]
    assert trajectory.parts["generator"].prompts == [original, original, original, f"{original} and a cat"]
    assert trajectory.extras["retained"].tolist() == [True, True, False, False]
    # retained rows: the mean format score of the group's rewritten rows (0 and 1)
    assert trajectory.extras["format_rewards"].tolist() == [0.5, 0.5, 0.0, 1.0]
    rewriter, loss = trainer.policy["rewriter"], trainer.loss.losses["rewriter"]
    steps = torch.zeros(4, dtype=torch.long)

    def gradient(rows):
        rewriter.zero_grad(set_to_none=True)
        sub = trajectory.parts["rewriter"].select(rows)
        value, _ = loss(rewriter, sub, steps[: len(rows)], torch.tensor([1.0, -2.0])[: len(rows)])
        value.backward()
        return sum(float(p.grad.abs().sum()) for p in rewriter.trainable_parameters() if p.grad is not None)

    assert gradient([0, 1]) == 0.0
    assert gradient([2, 3]) > 0.0


def test_the_reward_receives_the_original_prompts(tmp_path):
    trainer = make(tmp_path)
    rewrite_with(trainer, lambda p, i: "<answer>a purple hexagon</answer>")
    seen = []
    score = trainer.reward.score

    def recording(images, prompts, **metadata):
        seen.append(list(prompts))
        return score(images, prompts, **metadata)

    trainer.reward.score = recording
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    assert batch.trajectory.parts["generator"].prompts == ["a purple hexagon"] * 4
    assert seen == [batch.global_prompts] and batch.global_prompts[0] in trainer.prompts


def test_bad_rewrites_fall_back_and_an_empty_one_is_drawn(tmp_path):
    trainer = make(tmp_path)
    texts = ["no tag here", "", "<answer></answer>", "<answer>unclosed"]
    rewrite_with(trainer, lambda p, i: texts[i])
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    original = batch.trajectory.prompts[0]
    images = batch.trajectory.parts["generator"]
    assert images.prompts == [original, original, "", original]
    assert batch.trajectory.extras["format_rewards"].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert torch.isfinite(images.images).all() and torch.isfinite(batch.rewards).all()


def test_lm_only_freezes_the_generator_and_samples_by_ode(tmp_path):
    trainer = make(tmp_path, "train.prompt_rewrite.trains=rewriter")
    assert [g["name"] for g in trainer.optimizer.param_groups] == ["rewriter"]
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    assert (batch.trajectory.parts["generator"].stds == 0).all()
    assert batch.trajectory.primary == "rewriter" and torch.is_tensor(batch.trajectory.outputs)
    metrics = trainer.train_step(1)
    assert "rewriter_ratio" in metrics and "generator_ratio" not in metrics


def test_generator_only_freezes_the_rewriter(tmp_path):
    trainer = make(tmp_path, "train.prompt_rewrite.trains=generator")
    assert [g["name"] for g in trainer.optimizer.param_groups] == ["generator"]
    metrics = trainer.train_step(0)
    assert "generator_ratio" in metrics and "rewriter_ratio" not in metrics


def test_a_diffusion_nft_generator_keeps_its_own_old_policy(tmp_path):
    """DiffusionNFT's loss holds an old copy of the weights it trains; in a joint run that is the
    generator's (the rewriter trains with token_ppo), soft-updated after each step from the
    generator's new weights: old <- eta old + (1 - eta) theta."""
    trainer = make(tmp_path, "train.loss=nft")
    generator = trainer.policy["generator"]
    start = [p.detach().clone() for p in generator.trainable_parameters()]
    metrics = trainer.train_step(0)
    old = trainer.loss.losses["generator"].old_parameters
    now = [p.detach() for p in generator.trainable_parameters()]
    assert len(old) == len(now) < len(trainer.policy.trainable_parameters())  # the generator's alone
    eta = metrics["nft_old_decay"]
    assert 0 < eta < 1 and "generator_nft_r" in metrics and "rewriter_ratio" in metrics
    assert any(not torch.equal(a, b) for a, b in zip(start, now, strict=True))  # the generator moved
    for saved, first, current in zip(old, start, now, strict=True):
        torch.testing.assert_close(saved, eta * first + (1 - eta) * current)


@pytest.mark.parametrize("loss", ["ppo_clip", "nft"])
def test_resume_of_a_joint_run_from_yaml_is_exact(tmp_path, loss):
    straight = make(tmp_path / "a", "train.num_steps=3", f"train.loss={loss}")
    straight.train()
    first = make(tmp_path / "b", "train.num_steps=2", f"train.loss={loss}")
    first.train()
    resumed = make(tmp_path / "b", "train.num_steps=3", "logging.resume=latest", f"train.loss={loss}")
    resumed.train()
    a = {n: p.detach() for n, p in straight.policy.named_trainable_parameters().items()}
    b = {n: p.detach() for n, p in resumed.policy.named_trainable_parameters().items()}
    assert any(n.startswith("rewriter.") for n in a) and any(n.startswith("generator.") for n in a)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)

    def rows(path):
        return [
            {k: v for k, v in json.loads(line).items() if not k.startswith("time_")}
            for line in path.read_text().splitlines()
        ]

    assert rows(straight.metrics_path) == rows(resumed.metrics_path)
    assert (resumed.run_dir / "final" / "rewriter" / "config.json").is_file()
    assert (resumed.run_dir / "final" / "generator" / "unet" / "config.json").is_file()


@pytest.mark.parametrize("trains", ["both", "rewriter"])
def test_a_flow_generator_samples_sde_then_ode_and_starts_on_policy(tmp_path, trains):
    """The flow family (toy-flow's, configs/toy/promptrl_flow.yaml): the first num_sde_steps are
    flow-SDE steps (nonzero std) and trained, the rest ODE; LM-only samples every step by ODE."""
    trainer = make(tmp_path, "model.family=flow", "model.path=tiny:sd3", "sampling.mode=sde",
                   f"train.prompt_rewrite.trains={trains}")  # fmt: skip
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    stds = batch.trajectory.parts["generator"].stds
    if trains == "rewriter":
        assert (stds == 0).all()
        return
    assert (stds[:, :2] > 0).all() and (stds[:, 2:] == 0).all()  # sampling.num_sde_steps: 2 of 4
    assert trainer._trainable_steps(batch).tolist() == [0, 1]
    for k in (0, 1):
        steps = torch.full((batch.trajectory.batch_size,), k, dtype=torch.long)
        _, info = trainer.loss(trainer.policy, batch.trajectory, steps, batch.advantages)
        assert info["generator_ratio"].item() == 1.0 and info["rewriter_ratio"].item() == 1.0


def test_the_toy_flow_recipe_runs_two_steps_and_samples_as_the_gap_measurement(tmp_path):
    from genalign.toy.rewriter import FLOW_GAP_SAMPLING

    config = load_recipe(
        FLOW_RECIPE,
        ["train.num_steps=2", "train.group_size=4", "train.minibatch_size=8",
         f"logging.run_dir={tmp_path}/run", "logging.progress=false"],
    )  # fmt: skip
    assert config.model.family == "flow" and config.model.path.endswith("toy-flow")
    sampling = dataclasses.asdict(config.sampling)
    assert {k: sampling[k] for k in FLOW_GAP_SAMPLING} == FLOW_GAP_SAMPLING
    history = build_trainer(config, base_dir=FLOW_RECIPE.parent).train()
    assert [m["step"] for m in history] == [0, 1]
    assert all(math.isfinite(m["grad_norm"]) and m["lr_generator"] == 3e-4 for m in history)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rewriter.lr=1.0", r"unknown config key 'lr' in rewriter"),
        ("rewriter.family=sd", r"rewriter\.family must be 'language'"),
        ("train.strategy=groups", r"needs a rewriter section"),
        ("train.prompt_rewrite.num_retained=4", r"num_retained 4 must be below train.group_size 4"),
        ("train.prompt_rewrite.tempalte=x", r"'tempalte' in train.prompt_rewrite"),
        ("train.prompt_rewrite.template=no placeholder", r"must hold '\{prompt\}'"),
        ("train.policy_learning_rates={rewriter: 0.5}", r"rewriter.learning_rate .* disagree"),
        ("sampling.num_sde_steps=5", r"sampling\.num_sde_steps must lie in \[0, num_inference_steps=4\]"),
    ],
)
def test_bad_recipes_name_the_key(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(RECIPE, [*TINY, override])


def test_the_toy_recipe_runs_two_steps(tmp_path):
    config = load_recipe(
        RECIPE, ["train.num_steps=2", f"logging.run_dir={tmp_path}/run", "logging.progress=false"]
    )
    history = build_trainer(config, base_dir=RECIPE.parent).train()
    assert [m["step"] for m in history] == [0, 1]
    assert all(math.isfinite(m["reward_mean"]) and m["lr_rewriter"] == 1e-4 for m in history)


@pytest.mark.slow
def test_the_toy_recipe_runs_to_the_end(tmp_path):
    config = load_recipe(RECIPE, [f"logging.run_dir={tmp_path}/run", "logging.progress=false"])
    history = build_trainer(config, base_dir=RECIPE.parent).train()
    assert len(history) == config.train.num_steps
    assert all(math.isfinite(m["grad_norm"]) for m in history)


@pytest.mark.parametrize("folder", ["flux", "sd35"])
def test_the_real_model_recipes_load(folder):
    config = load_recipe(ROOT / "configs" / folder / "promptrl_geneval.yaml")
    assert config.train.group_size == 8 and config.sampling.num_inference_steps == 20
    assert config.sampling.num_sde_steps == 6 and config.train.policy_learning_rates == {"rewriter": 1e-6}
    assert config.train.learning_rate == 2e-7 and config.sampling.language.max_new_tokens == 512
