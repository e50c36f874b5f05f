"""Astrolabe's selective KL in the trainer (``train.astrolabe.selective_kl``): the mask that reaches
the loss, the masked KL against the lagging reference, the reset rule, exact resume and the
recipe's refusals, on the tiny video model with an ensemble of the toy CLIP and JPEG rewards."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from genalign.algorithms.nft import nft_loss_in_x0
from genalign.algorithms.selective_kl import SelectiveKLState, select_kl_samples
from genalign.config import ConfigError
from genalign.policies import load_policy
from genalign.rewards import load_reward
from genalign.trainers.config import load_recipe
from genalign.trainers.losses import AstrolabeLoss
from genalign.trainers.losses.forward_process import seeded_noise, swapped_trainable_parameters
from genalign.trainers.losses.selective_kl import KL_MASK_KEY, SelectiveKL
from genalign.trainers.strategies.astrolabe import AstrolabeStrategy
from genalign.trainers.trainer import build_trainer

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "tiny" / "astrolabe_selective_kl.yaml"
JPEG_RECIPE = ROOT / "configs" / "tiny" / "astrolabe_jpeg.yaml"
SIZE = {"height": 32, "width": 32}


@pytest.fixture(autouse=True)
def _run_from_the_repository(monkeypatch, tmp_path_factory):
    monkeypatch.chdir(ROOT)  # the recipe names assets/models/toy-clip relative to the repository
    os.environ["GENALIGN_TINY_CACHE"] = str(tmp_path_factory.getbasetemp() / "tiny-cache")


def _config(tmp_path, *overrides):
    return load_recipe(RECIPE, [f"logging.run_dir={tmp_path}/run", *overrides])


def test_the_mask_reaching_the_loss_is_select_kl_samples_on_the_batch_ranks(tmp_path, monkeypatch):
    config = _config(tmp_path, "train.num_steps=2")
    batches, calls = [], []
    sample = AstrolabeStrategy.sample
    monkeypatch.setattr(
        AstrolabeStrategy, "sample", lambda self, c, s: batches.append(sample(self, c, s)) or batches[-1]
    )
    call = AstrolabeLoss.__call__

    def spy(self, policy, trajectory, step_index, advantages):
        calls.append((self.current_step, trajectory.seeds.clone(), trajectory.extras[KL_MASK_KEY].clone()))
        return call(self, policy, trajectory, step_index, advantages)

    monkeypatch.setattr(AstrolabeLoss, "__call__", spy)
    history = build_trainer(config, base_dir=RECIPE.parent).train()
    # independently: the ensemble scored afresh on each step's videos, ranked, selected
    reward = load_reward(config.reward.name, **config.reward.kwargs)
    state = SelectiveKLState.initial()
    selected = 0
    for step, batch in enumerate(batches):
        trajectory = batch.trajectory
        with torch.no_grad():
            details = reward(trajectory.outputs, list(trajectory.prompts)).details
        state, expected, _ = select_kl_samples(state, details["clip"], [details["jpeg"]])
        row = {int(seed): i for i, seed in enumerate(trajectory.seeds.tolist())}
        step_calls = [(seeds, mask) for s, seeds, mask in calls if s == step]
        assert sum(len(seeds) for seeds, _ in step_calls) == trajectory.batch_size  # every row, once
        for seeds, mask in step_calls:
            rows = torch.tensor([row[int(seed)] for seed in seeds.tolist()])
            assert torch.equal(mask, expected[rows])
        assert history[step]["selective_kl_selected"] == int(expected.sum())
        assert history[step]["selective_kl_fraction"] == pytest.approx(state.fraction)
        selected += int(expected.sum())
    assert selected > 0  # the mask selected something, so the comparison saw both values


@pytest.fixture(scope="module")
def video_policy(tmp_path_factory):
    os.environ["GENALIGN_TINY_CACHE"] = str(tmp_path_factory.getbasetemp() / "tiny-cache")
    return load_policy("ar_video", "tiny:ar_video", lora={"rank": 4})


def test_the_kl_applies_to_the_selected_samples_only_against_the_lagging_reference(video_policy, tmp_path):
    policy = video_policy
    trajectory = policy.rollout(["a red circle"], group_size=3, generator=3, num_frames=2, **SIZE)
    loss = AstrolabeLoss(_config(tmp_path, "train.astrolabe.kl_weight=10.0").train)
    loss.begin_step(5)
    loss._ensure_old(policy)
    reference = loss.selective.ensure_reference(policy)
    with torch.no_grad():  # a lagging reference away from the current weights
        for i, value in enumerate(reference):
            value.add_(0.1 * torch.randn(value.shape, generator=torch.Generator().manual_seed(i)))
    advantages = torch.tensor([1.0, -2.0, 0.5])
    timestep, t = loss.draw_level()
    x0 = trajectory.latents[:, -1]
    eps = seeded_noise(trajectory.seeds, torch.zeros(3, dtype=torch.long), x0.shape[1:], step=5)
    x_t = (1 - t) * x0 + t * eps
    levels = torch.full((3, 2), float(timestep))
    with torch.no_grad():
        x0_old = x_t - t * policy.transformer_output(x_t, levels, trajectory.conditioning)
        with swapped_trainable_parameters(policy, reference, "reference"):
            x0_ref = x_t - t * policy.transformer_output(x_t, levels, trajectory.conditioning)
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
    kl = ((x0_theta - x0_ref) ** 2).mean(dim=(1, 2, 3, 4))  # [3] per-sample KL
    assert float(kl.min()) > 0
    for mask, expected_kl in (
        ([True, False, True], (kl[0] + kl[2]) / 2),
        ([False, True, False], kl[1]),
        ([False, False, False], torch.tensor(0.0)),
    ):
        loss.calls, loss.selective.kl_values = 0, []  # the same level and noise each time
        trajectory.extras[KL_MASK_KEY] = torch.tensor(mask)
        value, metrics = loss(policy, trajectory, torch.zeros(3, dtype=torch.long), advantages)
        torch.testing.assert_close(metrics["astrolabe_kl_loss"], expected_kl, atol=1e-8, rtol=1e-5)
        torch.testing.assert_close(
            value.detach(), per_sample.mean() + 10.0 * expected_kl, atol=1e-7, rtol=1e-5
        )
        assert loss.selective.kl_values == [pytest.approx(float(expected_kl), rel=1e-5, abs=1e-9)]
    del trajectory.extras[KL_MASK_KEY]
    with pytest.raises(ValueError, match="carries no KL mask"):
        loss(policy, trajectory, torch.zeros(3, dtype=torch.long), advantages)


def test_the_lagging_reference_resets_when_the_rule_says_and_otherwise_stays_fixed(tmp_path, monkeypatch):
    # one loss call and one optimiser step per training step, so the step's KL metric is what the
    # rule watches; a tiny threshold makes a KL trigger a reset (step 2), a gap of 2 the other (step 5)
    config = _config(
        tmp_path,
        "train.num_steps=6",
        "train.minibatch_size=8",
        "train.astrolabe.selective_kl_constants.kl_threshold=1.0e-9",
        "train.astrolabe.selective_kl_constants.max_epochs_without_reset=2",
    )
    records = []
    prepare = SelectiveKL.prepare

    def spy(self, trainer, batch, step):
        before = [t.clone() for t in self.ensure_reference(trainer.policy)]
        weights = [p.detach().clone() for p in trainer.policy.trainable_parameters()]
        metrics = prepare(self, trainer, batch, step)
        records.append((before, weights, [t.clone() for t in self.reference]))
        return metrics

    monkeypatch.setattr(SelectiveKL, "prepare", spy)
    trainer = build_trainer(config, base_dir=RECIPE.parent)
    initial = [p.detach().clone() for p in trainer.parameters]
    history = trainer.train()
    # the released rule, from the metrics: a pending flag from the previous step's KL against the
    # threshold then in force, or more than max_epochs_without_reset steps since the last reset
    last_reset, pending, expected = 0, False, []
    for step, row in enumerate(history):
        reset = (step != 0 and pending) or step - last_reset > 2
        expected.append(reset)
        if reset:
            last_reset, pending = step, False
        pending = pending or row["astrolabe_kl_loss"] > row["selective_kl_reset_threshold"]
    assert [bool(row["selective_kl_reset"]) for row in history] == expected
    assert any(expected) and not all(expected)
    assert expected == [False, False, True, False, False, True]  # one reset by each rule
    for a, b in zip(records[0][0], initial):  # the first reference: the initial weights
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for step, (before, weights, after) in enumerate(records):
        if step:  # between steps the reference does not move
            for a, b in zip(before, records[step - 1][2]):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
        target = weights if expected[step] else before
        for a, b in zip(after, target):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        if expected[step]:  # the reset is visible: the weights had moved away from the reference
            assert any(not torch.equal(a, b) for a, b in zip(weights, before))


def _train(tmp_path, name, *overrides) -> list[dict]:
    from genalign.cli import main

    assert main(["train", str(RECIPE), f"logging.run_dir={tmp_path}/{name}", *overrides]) == 0
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_a_run_with_selective_kl_resumes_exactly(tmp_path, monkeypatch):
    from genalign.trainers.checkpoint import latest_checkpoint, load_checkpoint

    threshold = "train.astrolabe.selective_kl_constants.kl_threshold=1.0e-9"  # a reset pending over the cut
    # seed 2: step 0's KL is 0 (its selected sample is trained before the first optimiser step), so
    # the flag first rises at step 1, the cut below
    seed = "train.seed=2"
    straight = _train(tmp_path, "a", "train.num_steps=4", threshold, seed)
    assert straight[1]["selective_kl_reset_pending"] == 1.0  # the checkpoint of step 1 carries the flag
    assert straight[2]["selective_kl_reset"] == 1.0  # and the first resumed step resets
    _train(tmp_path, "b", "train.num_steps=2", threshold, seed)  # stopped after step 1
    resumed = _train(tmp_path, "b", "train.num_steps=4", "logging.resume=latest", threshold, seed)
    # step 2 fails in its first loss call, after its reset and selection, before any optimiser
    # step: the snapshot checkpoint of step 1 it writes must still resume exactly
    config = load_recipe(RECIPE, [f"logging.run_dir={tmp_path}/c", "train.num_steps=4", threshold, seed])
    trainer = build_trainer(config, base_dir=RECIPE.parent)
    call = AstrolabeLoss.__call__

    def failing(self, *args):
        if self.current_step == 2:
            raise RuntimeError("a loss failure")
        return call(self, *args)

    monkeypatch.setattr(AstrolabeLoss, "__call__", failing)
    with pytest.raises(RuntimeError, match="a loss failure"):
        trainer.train()
    monkeypatch.setattr(AstrolabeLoss, "__call__", call)
    assert trainer.loss.selective.step_state is not None  # the failed step had reset and selected
    after_failure = _train(tmp_path, "c", "train.num_steps=4", "logging.resume=latest", threshold, seed)
    a = load_checkpoint(latest_checkpoint(tmp_path / "a"))
    assert any(key.startswith("ref.") for key in a.tensors["loss"])
    assert any(key.startswith("selective_kl.") for key in a.tensors["loss"])
    compared = ("selective_kl_", "astrolabe_", "reward_", "policy_loss", "param_change")
    for name, rows in (("b", resumed), ("c", after_failure)):
        assert [row["step"] for row in rows] == [0, 1, 2, 3]
        for step in (2, 3):
            for key, value in straight[step].items():
                if key.startswith(compared):
                    assert rows[step][key] == pytest.approx(value, rel=1e-6, abs=1e-12), (name, step, key)
        b = load_checkpoint(latest_checkpoint(tmp_path / name))
        for group in ("trainable", "loss"):
            assert sorted(a.tensors[group]) == sorted(b.tensors[group])
            for key in a.tensors[group]:
                torch.testing.assert_close(a.tensors[group][key], b.tensors[group][key])


def test_the_recipe_refuses_selective_kl_without_what_it_needs(tmp_path):
    cases = [
        (["train.astrolabe.kl_weight=0"], "train.astrolabe.selective_kl selects .*kl_weight > 0"),
        (["train.astrolabe.main_reward=null"], "train.astrolabe.main_reward is required"),
        (["train.astrolabe.other_rewards=[clip]"], "train.astrolabe.other_rewards must be distinct"),
        (["train.astrolabe.other_rewards=[]"], "train.astrolabe.other_rewards must be distinct"),
        (
            ["train.astrolabe.selective_kl_constants.fraction_min=0.5"],
            "train.astrolabe.selective_kl_constants: need 0 < fraction_min",
        ),
        (
            ["train.astrolabe.selective_kl_constants.kl_threshold=0"],
            "train.astrolabe.selective_kl_constants.kl_threshold must be positive",
        ),
        (["train.astrolabe.selective_kl=false"], "train.astrolabe.main_reward is an option of"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            _config(tmp_path, *overrides)
    with pytest.raises(
        ConfigError, match="ranks the members of an 'ensemble' reward, but reward.name is 'video'"
    ):
        load_recipe(
            JPEG_RECIPE,
            [
                f"logging.run_dir={tmp_path}/j",
                "train.astrolabe.selective_kl=true",
                "train.astrolabe.main_reward=a",
            ],
        )


def test_the_ranked_rewards_are_checked_against_the_ensemble_members(tmp_path):
    options = _config(tmp_path).train.astrolabe
    jpeg = {"name": "video", "kwargs": {"reward": "jpeg_compressibility"}}
    three = load_reward("ensemble", members=[{**jpeg, "key": k} for k in ("avg", "clip", "a", "b", "c")])
    helper = SelectiveKL(options)
    helper.bind(three)  # the released choice: the first two members other than the main one and "avg"
    assert (helper.main, helper.others) == ("clip", ["a", "b"])
    with pytest.raises(ConfigError, match="train.astrolabe.main_reward 'clip' is not one of"):
        SelectiveKL(options).bind(
            load_reward("ensemble", members=[{**jpeg, "key": "x"}, {**jpeg, "key": "y"}])
        )
    with pytest.raises(ConfigError, match="needs an ensemble member besides main_reward 'clip'"):
        SelectiveKL(options).bind(load_reward("ensemble", members=[{**jpeg, "key": "clip"}]))
    with pytest.raises(ConfigError, match="has no member keys"):
        SelectiveKL(options).bind(load_reward("video", reward="jpeg_compressibility"))
    chosen = _config(tmp_path, "train.astrolabe.other_rewards=[c]").train.astrolabe
    helper = SelectiveKL(chosen)
    helper.bind(three)
    assert helper.others == ["c"]
    with pytest.raises(ConfigError, match=r"train.astrolabe.other_rewards \['z'\] are not among"):
        SelectiveKL(_config(tmp_path, "train.astrolabe.other_rewards=[z]").train.astrolabe).bind(three)


@pytest.mark.slow
def test_two_processes_rank_the_global_batch_as_one_process_does(tmp_path):
    """Each process scores its rows; the ranks, the selection and the update are the global batch's."""
    from safetensors.torch import load_file

    from tests.trainers.test_trainer import _torchrun

    script = Path(__file__).with_name("distributed_run.py")
    recipe = f"recipe={RECIPE.relative_to(ROOT)}"
    _torchrun(script, tmp_path / "two", recipe, "train.num_steps=2")
    _torchrun(script, tmp_path / "one", recipe, "train.num_steps=2", processes=1)
    rows = {}
    for name in ("one", "two"):
        lines = (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()
        rows[name] = [json.loads(line) for line in lines]
    assert sum(row["selective_kl_selected"] for row in rows["one"]) > 0
    for one, two in zip(rows["one"], rows["two"], strict=True):
        for key in one:
            if key.startswith("selective_kl_") and key != "selective_kl_reset_pending":
                assert two[key] == pytest.approx(one[key], rel=1e-9), key
        assert two["reward_mean"] == pytest.approx(one["reward_mean"], rel=1e-6)
    rank0 = load_file(tmp_path / "two" / "params-rank0.safetensors")
    single = load_file(tmp_path / "one" / "params-rank0.safetensors")
    for key in rank0:
        torch.testing.assert_close(rank0[key], single[key], atol=1e-4, rtol=1e-3)
