"""B2-DiffuRL: branch rollouts, the backward progressive schedule, selection, weights, training."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import torch

from genalign.algorithms.b2diffurl import (
    PromptRewardHistory,
    branch_advantages,
    select_in_branch_groups,
    split_step_at,
    train_window,
)
from genalign.config import ConfigError
from genalign.policies import load_policy
from genalign.rewards import Reward, RewardOutput
from genalign.trainers import STRATEGIES, build_trainer, load_recipe
from genalign.trainers.checkpoint import flatten_state, unflatten_state
from genalign.trainers.strategies.b2diffurl import B2DiffuRLStrategy

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny" / "b2diffurl_jpeg.yaml"
RECIPES = sorted((ROOT / "configs" / "sd14").glob("*.yaml")) + sorted(
    (ROOT / "configs" / "tiny").glob("b2diffurl_*.yaml")
)
SMALL = [
    "sampling.num_inference_steps=4",
    "train.prompts_per_step=2",
    "train.minibatch_size=2",
    "train.b2diffurl.split_step_start=2",
    "train.b2diffurl.split_step_end=4",
    "train.b2diffurl.stage_steps=1",
    "train.b2diffurl.split_step_increment=1",
    "train.b2diffurl.branches=3",
    "train.adam_weight_decay=0.0",
    "logging.progress=false",
]
FLOW = ["model.family=flow", "model.path=tiny:sd3"]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


class MeanReward(Reward):
    """Deterministic stand-in reward: the mean pixel value of each image."""

    def score(self, images, prompts, **metadata):
        return RewardOutput(images.float().mean(dim=(1, 2, 3)))


def make_trainer(tmp_path: Path, *overrides: str):
    config = load_recipe(TINY, [*SMALL, f"logging.run_dir={tmp_path}/run", *overrides])
    trainer = build_trainer(config, base_dir=TINY.parent)
    trainer.reward = MeanReward()
    return trainer


# ----------------------------------------------------------------------------- branch rollouts
@pytest.mark.parametrize(
    "family, path", [("sd", "tiny:sd"), ("flow", "tiny:sd3"), ("consistency", "tiny:lcm")]
)
def test_branches_share_their_prefix_exactly_and_diverge_after_it(family, path):
    policy = load_policy(family, path, lora={"rank": 4})
    kwargs = {"num_inference_steps": 4, "guidance_scale": 3.0, "seeds": torch.tensor([11, 12])}
    full = policy.rollout(["a red circle", "a blue square"], **kwargs)
    prefix = policy.rollout(["a red circle", "a blue square"], stop_step=2, **kwargs)
    # a prefix is exactly the first steps of the full rollout, undecoded
    assert torch.equal(prefix.latents, full.latents[:, :3])
    assert torch.equal(prefix.log_probs, full.log_probs[:, :2])
    assert prefix.images.numel() == 0

    branched = policy.continue_rollout(prefix, 2, seeds=torch.arange(100, 106), repeats=3)
    assert branched.latents.shape == (6, *full.latents.shape[1:])
    assert branched.log_probs.shape == branched.stds.shape == (6, 4)
    assert branched.prompts == ["a red circle"] * 3 + ["a blue square"] * 3
    assert torch.equal(branched.extras["prefix_seeds"], torch.tensor([11] * 3 + [12] * 3))
    for source in range(2):
        rows = range(3 * source, 3 * source + 3)
        for row in rows:  # bitwise copies of the source's prefix: x_T .. x_{t_s} and its log-probs
            assert torch.equal(branched.latents[row, :3], full.latents[source, :3])
            assert torch.equal(branched.log_probs[row, :2], full.log_probs[source, :2])
        for a in rows:  # every later latent differs between branches
            for b in rows:
                if a < b:
                    for i in (3, 4):
                        assert not torch.allclose(branched.latents[a, i], branched.latents[b, i])
    assert not torch.allclose(branched.images[0], branched.images[1])
    # the continuation is reproducible from its seeds, and its log-probs are exact (ratio 1)
    again = policy.continue_rollout(prefix, 2, seeds=torch.arange(100, 106), repeats=3)
    assert torch.equal(again.latents, branched.latents)
    if family != "consistency":  # sd / flow re-score bitwise; LCM's tiny UNet is batch-sensitive
        assert torch.equal(policy.log_prob(branched, [2, 3]), branched.log_probs[:, 2:])
    else:
        torch.testing.assert_close(policy.log_prob(branched, [2]), branched.log_probs[:, 2:3])


def test_continue_rollout_rejects_bad_arguments():
    policy = load_policy("sd", "tiny:sd", lora={"rank": 4})
    prefix = policy.rollout(
        ["a red circle"], num_inference_steps=4, guidance_scale=1.0, generator=0, stop_step=1
    )
    with pytest.raises(ValueError, match="holds 1 steps, fewer than from_step=2"):
        policy.continue_rollout(prefix, 2, generator=0)
    with pytest.raises(ValueError, match=r"from_step must be an integer in \[0, 4\)"):
        policy.continue_rollout(prefix, 4, generator=0)
    with pytest.raises(ValueError, match="repeats must be a positive integer"):
        policy.continue_rollout(prefix, 1, generator=0, repeats=0)
    with pytest.raises(ValueError, match="seeds must have shape"):
        policy.continue_rollout(prefix, 1, seeds=torch.tensor([1, 2]), repeats=3)
    with pytest.raises(ValueError, match="stop_step must be an integer"):
        policy.rollout(["a red circle"], num_inference_steps=4, generator=0, stop_step=5)


# ----------------------------------------------------------------------------- the schedule
def test_schedule_spreads_the_split_steps_as_the_official_script():
    # run_process.sh: interval = right - left + 1; level = i * interval / stages; split = left + level
    for i in range(100):
        assert split_step_at(i, 100, 14, 20) == 14 + (i * 7) // 100
    assert [split_step_at(i, 7, 14, 20) for i in range(7)] == list(range(14, 21))


def test_schedule_with_stage_steps_and_increment_produces_the_configured_windows():
    splits = [split_step_at(step, 50, 2, 9, increment=3, stage_steps=4) for step in range(16)]
    # 2, 5, 8 then capped at the end value 9; each held for 4 steps; the last held forever
    assert splits == [2] * 4 + [5] * 4 + [8] * 4 + [9] * 4
    assert split_step_at(1000, 50, 2, 9, increment=3, stage_steps=4) == 9
    assert train_window(2, 10).tolist() == [8, 9]
    assert train_window(10, 10).tolist() == list(range(10))
    with pytest.raises(ValueError, match="split_step must lie in"):
        train_window(11, 10)
    with pytest.raises(ValueError, match="1 <= start <= end"):
        split_step_at(0, 10, 5, 4)


def test_strategy_trains_the_window_of_each_stage(tmp_path):
    trainer = make_trainer(tmp_path, "train.b2diffurl.stage_steps=2", "train.b2diffurl.split_step_end=null")
    strategy = trainer.strategy
    windows = [strategy.split_step(step, 4) for step in range(7)]
    assert windows == [2, 2, 3, 3, 4, 4, 4]
    batch = strategy.collect(trainer.rollout_context(), 2)
    assert batch.train_steps.tolist() == [1, 2, 3]
    assert batch.trajectory.extras["branch_step"] == 1
    assert batch.details["split_step"] == 3 and batch.details["window_start"] == 1


# ----------------------------------------------------------------------------- selection and weights
def test_selection_keeps_exactly_the_samples_the_rule_names():
    scores = torch.tensor(
        [
            [0.2, 1.3, -0.7],  # best 1.3 >= 0.5 kept, worst -0.7 < -0.5 kept
            [0.4, 0.1, -0.2],  # neither passes
            [0.5, -0.5, 0.0],  # best exactly 0.5 kept (>=); worst exactly -0.5 not (<)
            [-2.0, -1.0, -3.0],  # best -1.0 fails; worst -3.0 kept
            [0.9, 0.9, 0.1],  # tie: the first maximum is kept
        ]
    ).flatten()
    index, positive = select_in_branch_groups(scores, 3, pos_threshold=0.5, neg_threshold=-0.5)
    assert index.tolist() == [1, 2, 6, 11, 12]
    assert positive.tolist() == [True, False, True, False, True]
    # a single branch: a sample is its group's best and worst at once
    index, positive = select_in_branch_groups(torch.tensor([0.7, 0.0, -0.9]), 1, 0.5, -0.5)
    assert index.tolist() == [0, 2] and positive.tolist() == [True, False]
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        select_in_branch_groups(scores, 4, 0.5, -0.5)


def test_positive_and_negative_weights_scale_the_clipped_scores():
    scores = torch.tensor([2.0, 7.0, -0.6, -9.0, 0.0])
    advantages = branch_advantages(scores, clip=5.0, pos_weight=1.5, neg_weight=0.25)
    expected = [2.0 * 1.5, 5.0 * 1.5, -0.6 * 0.25, -5.0 * 0.25, 0.0]
    assert advantages.tolist() == pytest.approx(expected)


def test_per_prompt_normalisation_pools_the_recent_steps():
    history = PromptRewardHistory(history_steps=2)
    steps = [
        (["a", "a", "b", "b"], [1.0, 2.0, 5.0, 7.0]),
        (["a", "b", "b", "c"], [4.0, 6.0, 9.0, 3.0]),
        (["a", "a", "c", "c"], [0.0, 3.0, 1.0, 2.0]),
        (["a", "b", "b", "a"], [8.0, 1.0, 2.0, 5.0]),  # step 0 has left the 2-step history
    ]
    kept: list[tuple[list[str], list[float]]] = []
    for prompts, rewards in steps:
        out = history.normalise(prompts, torch.tensor(rewards)).tolist()
        for i, (prompt, reward) in enumerate(zip(prompts, rewards)):
            pooled = [r for ps, rs in kept[-2:] for p, r in zip(ps, rs) if p == prompt]
            pooled += [r for p, r in zip(prompts, rewards) if p == prompt]
            expected = (
                (reward - statistics.mean(pooled)) / (statistics.stdev(pooled) + 1e-8)
                if len(pooled) > 1
                else 0.0
            )
            assert out[i] == pytest.approx(expected, abs=1e-9)
        kept.append((prompts, rewards))
    restored = PromptRewardHistory(history_steps=2)
    restored.load_state_dict(unflatten_state(*flatten_state(history.state_dict())))
    probe = (["a", "b", "c"], torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(restored.normalise(*probe), history.normalise(*probe))


def test_advantages_in_a_step_follow_the_rule(tmp_path):
    trainer = make_trainer(
        tmp_path,
        "train.prompts_per_step=3",
        "train.b2diffurl.pos_threshold=0.3",
        "train.b2diffurl.neg_threshold=-0.3",
        "train.b2diffurl.pos_weight=2.0",
        "train.b2diffurl.neg_weight=0.5",
        "train.minibatch_size=3",
    )
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    prompts, _, _, _ = trainer.strategy.global_batch(trainer.rollout_context(), 0)
    rewards = batch.global_rewards.double().tolist()
    branch_prompts = [p for p in prompts for _ in range(3)]
    z = []
    for prompt, reward in zip(branch_prompts, rewards):
        pooled = [r for p, r in zip(branch_prompts, rewards) if p == prompt]
        z.append((reward - statistics.mean(pooled)) / (statistics.stdev(pooled) + 1e-8))
    expected_rows, expected_advantages = [], []
    for g in range(3):
        group = z[3 * g : 3 * g + 3]
        best = max(range(3), key=lambda k: (group[k], -k))
        worst = min(range(3), key=lambda k: (group[k], k))
        for k, keep in ((best, group[best] >= 0.3), (worst, group[worst] < -0.3)):
            if keep:
                expected_rows.append(3 * g + k)
                expected_advantages.append(max(-5.0, min(5.0, group[k])) * (2.0 if group[k] > 0 else 0.5))
    order = sorted(range(len(expected_rows)), key=lambda i: expected_rows[i])
    assert batch.global_batch_size == len(expected_rows) > 0
    assert batch.global_index.tolist() == list(range(len(expected_rows)))
    assert batch.advantages.tolist() == pytest.approx([expected_advantages[i] for i in order], abs=1e-5)
    assert batch.rewards.double().tolist() == pytest.approx([rewards[expected_rows[i]] for i in order])
    assert batch.trajectory.prompts == [branch_prompts[expected_rows[i]] for i in order]


# ----------------------------------------------------------------------------- training
@pytest.mark.parametrize("family", ["sd", "flow"])
def test_first_inner_step_is_on_policy_and_only_window_steps_are_trained(tmp_path, family):
    trainer = make_trainer(
        tmp_path, *(FLOW if family == "flow" else []), "train.b2diffurl.neg_threshold=-0.3"
    )
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    trajectory = batch.trajectory
    assert batch.train_steps.tolist() == [2, 3] and trajectory.batch_size > 0
    for index in (2, 3):
        out = trainer.policy.step(trajectory, index)
        # the same computation up to float rounding: on some CPUs (AVX-512 / AMX kernels) the
        # rollout's no-grad pass and this one round a log-prob of ~940 differently in the last
        # ulp (6e-5); an off-policy recompute (another timestep, noise or model) differs by far more
        torch.testing.assert_close(out.log_prob, trajectory.log_probs[:, index], rtol=1e-6, atol=0)
    steps = torch.full((trajectory.batch_size,), 2)
    _, info = trainer.loss(trainer.policy, trajectory, steps, batch.advantages)
    assert info["ratio"].item() == pytest.approx(1.0, abs=1e-5)
    assert info["approx_kl"].item() == pytest.approx(0.0, abs=1e-9)

    # instrument the loss: every re-scored step index must lie in the window of its step
    seen: list[tuple[int, list[int]]] = []
    loss = trainer.loss

    def recording_loss(policy, sub, step_index, advantages):
        seen.append((trainer.strategy.split_step(current, 4), step_index.tolist()))
        return loss(policy, sub, step_index, advantages)

    trainer.loss = recording_loss
    before = {n: p.detach().clone() for n, p in trainer.policy.named_trainable_parameters().items()}
    for current in (0, 1, 2):
        metrics = trainer.train_step(current)
        assert not metrics.get("skipped"), metrics.get("skip_reason")
    for split_step, indices in seen:
        assert all(4 - split_step <= i < 4 for i in indices), (split_step, indices)
    assert {i for _, indices in seen for i in indices} >= {0, 3}  # the window did grow to step 0
    after = trainer.policy.named_trainable_parameters()
    assert any(not torch.equal(before[n], p) for n, p in after.items())


def test_sharding_over_two_processes_reproduces_the_one_process_batch(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, "train.prompts_per_step=4", "train.b2diffurl.neg_threshold=-0.3")
    single = trainer.strategy.collect(trainer.rollout_context(), 3)
    selected_prompts = single.trajectory.prompts
    shards = []
    for rank in (0, 1):
        strategy = B2DiffuRLStrategy(trainer.config.train)
        monkeypatch.setattr(
            trainer, "local_rows", lambda n, rank=rank: torch.arange(rank * n // 2, (rank + 1) * n // 2)
        )

        def gather(tensor, rank=rank):
            # the other process would contribute its own rows: take them from the one-process run
            size = tensor.shape[0]
            torch.testing.assert_close(tensor.cpu(), single.global_rewards[rank * size : (rank + 1) * size])
            return single.global_rewards.to(tensor.device)

        monkeypatch.setattr(trainer, "gather", gather)
        shards.append(strategy.collect(trainer.rollout_context(), 3))
    assert all(s.global_batch_size == single.global_batch_size for s in shards)
    index = torch.cat([s.global_index for s in shards])
    assert sorted(index.tolist()) == list(range(single.global_batch_size))
    order = torch.argsort(index)
    assert torch.cat([s.advantages for s in shards])[order].tolist() == single.advantages.tolist()
    assert [p for s in shards for p in s.trajectory.prompts] == [selected_prompts[i] for i in index.tolist()]
    latents = torch.cat([s.trajectory.latents for s in shards])[order]
    torch.testing.assert_close(latents, single.trajectory.latents)


def test_chunked_rollouts_give_the_same_batch(tmp_path):
    whole = make_trainer(tmp_path, "train.b2diffurl.neg_threshold=-0.3")
    chunked = make_trainer(
        tmp_path, "train.b2diffurl.neg_threshold=-0.3", "train.b2diffurl.sample_batch_size=1"
    )
    a, b = (
        whole.strategy.collect(whole.rollout_context(), 1),
        chunked.strategy.collect(chunked.rollout_context(), 1),
    )
    torch.testing.assert_close(b.global_rewards, a.global_rewards)
    assert b.global_index.tolist() == a.global_index.tolist() and b.trajectory.prompts == a.trajectory.prompts
    torch.testing.assert_close(b.trajectory.latents, a.trajectory.latents)
    assert torch.equal(b.trajectory.extras["prefix_seeds"], a.trajectory.extras["prefix_seeds"])


def test_resumed_strategy_keeps_its_history(tmp_path):
    trainer = make_trainer(tmp_path, "train.num_steps=2")
    trainer.train()
    fresh = make_trainer(tmp_path, "train.num_steps=2", "logging.resume=latest")
    fresh.resume("latest")
    assert fresh.step == 2
    saved = trainer.strategy.history.state_dict()["steps"]
    loaded = fresh.strategy.history.state_dict()["steps"]
    assert len(saved) == len(loaded) == 2
    for a, b in zip(saved, loaded):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class NaNReward(Reward):
    def score(self, images, prompts, **metadata):
        scores = torch.zeros(images.shape[0])
        scores[1] = float("nan")
        return RewardOutput(scores)


def test_nan_reward_or_an_empty_selection_skips_the_step(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.reward = NaNReward()
    metrics = trainer.train_step(0)
    assert metrics["skipped"] and "NaN" in metrics["skip_reason"]
    trainer = make_trainer(tmp_path, "train.b2diffurl.pos_threshold=50", "train.b2diffurl.neg_threshold=-50")
    before = {n: p.detach().clone() for n, p in trainer.policy.named_trainable_parameters().items()}
    metrics = trainer.train_step(0)
    assert metrics["skipped"] and "selection thresholds" in metrics["skip_reason"]
    assert all(torch.equal(before[n], p) for n, p in trainer.policy.named_trainable_parameters().items())


# ----------------------------------------------------------------------------- recipes and config
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recipes_load(recipe):
    config = load_recipe(recipe)
    assert config.train.strategy == "b2diffurl" and STRATEGIES.get("b2diffurl") is B2DiffuRLStrategy
    b2 = config.train.b2diffurl
    assert b2.branches >= 2 and b2.neg_threshold <= b2.pos_threshold
    assert config.prompts.load(recipe.parent)
    if recipe.parent.name == "sd14":  # the paper's settings
        assert config.model.path == "CompVis/stable-diffusion-v1-4" and config.model.lora is not None
        assert (config.sampling.num_inference_steps, config.sampling.eta, config.sampling.guidance_scale) == (
            20,
            1.0,
            5.0,
        )
        assert (b2.split_step_start, b2.split_step_end, b2.branches) == (14, 20, 5)
        assert (b2.pos_threshold, b2.neg_threshold) == (0.5, -0.5)
        assert config.reward.name == "clip"
        # the official template1 split: 45 training prompts, 15 animals per activity, none of the
        # 90 held-out pairs (template1_test.json) among them
        train = config.prompts.load(recipe.parent)
        test = [
            line
            for line in (recipe.parent / "b2diffurl_test_prompts.txt").read_text().splitlines()
            if line and not line.startswith("#")
        ]
        assert (len(train), len(set(train)), len(test), set(train) & set(test)) == (45, 45, 90, set())
        for activity in ("washing dishes", "riding a bike", "playing chess"):
            assert sum(prompt.endswith(activity) for prompt in train) == 15
            assert sum(prompt.endswith(activity) for prompt in test) == 30


def test_tiny_recipe_runs_two_steps_through_the_cli(tmp_path, capsys):
    from genalign.cli import main

    run = tmp_path / "run"
    code = main(["train", str(TINY), "train.num_steps=2", f"logging.run_dir={run}", "logging.progress=false"])
    assert code == 0, capsys.readouterr().err
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    assert all(math.isfinite(m["reward_mean"]) and m["samples"] == 12 for m in lines)
    assert [m["reward_split_step"] for m in lines] == [2, 2]
    assert (run / "final" / "pytorch_lora_weights.safetensors").is_file()


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.b2diffurl.branches=0", "train.b2diffurl.branches must be positive"),
        ("train.b2diffurl.split_step_start=0", "train.b2diffurl.split_step_start must be positive"),
        ("train.b2diffurl.stage_steps=0", "train.b2diffurl.stage_steps must be positive"),
        ("train.b2diffurl.split_step_end=1", "split_step_end 1 is below train.b2diffurl.split_step_start 2"),
        ("train.b2diffurl.neg_threshold=0.9", "neg_threshold 0.9 exceeds train.b2diffurl.pos_threshold"),
        ("train.b2diffurl.neg_weight=-1", "train.b2diffurl.neg_weight must be >= 0"),
        ("train.b2diffurl.split_step_end=9", r"exceed sampling.num_inference_steps 4"),
        ("train.b2diffurl.branchs=2", "unknown config key 'branchs'"),
    ],
)
def test_bad_options_fail_at_load_time_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(TINY, [*SMALL, override])
