"""The trainer's update path against the official implementations (issue 20): which steps are
trained, rollout and re-scoring precision, zero-advantage filtering. Every expectation is computed
here by hand from the anchor's formula, not by calling genalign."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genalign.trainers import build_trainer, load_recipe

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny"


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def make_trainer(tmp_path: Path, recipe: str, *overrides: str):
    path = TINY / recipe
    config = load_recipe(path, [f"logging.run_dir={tmp_path}/run", "logging.progress=false", *overrides])
    return build_trainer(config, base_dir=path.parent)


class RecordingLoss:
    """Wraps a loss and records, per sample seed, the step indices it is trained on, in call order."""

    def __init__(self, loss) -> None:
        self.loss = loss
        self.steps: dict[int, list[int]] = {}
        self.advantages: list[torch.Tensor] = []

    def __call__(self, policy, trajectory, step_index, advantages):
        for seed, index in zip(trajectory.seeds.tolist(), step_index.tolist()):
            self.steps.setdefault(int(seed), []).append(int(index))
        self.advantages.append(advantages.detach().cpu())
        return self.loss(policy, trajectory, step_index, advantages)


# (recipe, T, fraction, order, k = int(T * fraction) as ddpo-pytorch / flow_grpo compute it)
STEP_CASES = [
    ("flow_grpo_jpeg.yaml", 10, 0.99, "first", 9),
    ("flow_grpo_jpeg.yaml", 3, 0.2, "first", 1),
    ("flow_grpo_jpeg.yaml", 10, 0.5, "random", 5),
    ("ddpo_jpeg.yaml", 10, 0.99, "random", 9),
    ("ddpo_jpeg.yaml", 20, 0.6, "first", 12),
]


@pytest.mark.parametrize("recipe, steps, fraction, order, expected", STEP_CASES)
def test_trained_steps_count_and_order(tmp_path, recipe, steps, fraction, order, expected):
    trainer = make_trainer(
        tmp_path,
        recipe,
        f"sampling.num_inference_steps={steps}",
        f"train.timestep_fraction={fraction}",
        f"train.timestep_order={order}",
        "train.prompts_per_step=2",
        "train.group_size=2",
        "train.minibatch_size=2",
        "train.kl_coef=0.0",
    )
    recorder = RecordingLoss(trainer.loss)
    trainer.loss = recorder
    trainer.train_step(0)
    assert len(recorder.steps) == 4
    for trained in recorder.steps.values():
        if order == "first":  # flow_grpo: for j in range(num_train_timesteps)
            assert trained == list(range(expected))
        else:  # ddpo-pytorch: the first k of a random permutation of range(T), per sample
            assert len(trained) == expected and len(set(trained)) == expected
            assert set(trained) <= set(range(steps))
    if order == "random" and expected < steps:
        assert len({tuple(sorted(t)) for t in recorder.steps.values()}) > 1


ON_POLICY = [
    "train.mixed_precision=bf16",
    "sampling.num_inference_steps=4",
    "train.prompts_per_step=2",
    "train.group_size=2",
    "train.minibatch_size=2",
    "train.gradient_accumulation_steps=2",  # one optimiser step after both minibatches
    "train.timestep_fraction=1.0",
]


@pytest.mark.parametrize("recipe", ["ddpo_jpeg.yaml", "flow_grpo_jpeg.yaml", "rlcm_jpeg.yaml"])
def test_rollout_and_rescoring_share_the_precision_context_under_bf16(tmp_path, recipe):
    """Under CPU bf16 autocast the stored log-probs are recomputed bit for bit, in any sub-batch."""
    trainer = make_trainer(tmp_path, recipe, *ON_POLICY)
    assert trainer.accelerator.mixed_precision == "bf16"
    trajectory = trainer.strategy.collect(trainer, 0).trajectory
    steps = trajectory.stochastic_steps().tolist()
    assert steps
    rows = [1, 2]
    sub = trajectory.select(rows)
    differs_outside = False
    for index in steps:
        with torch.no_grad(), trainer.precision():
            full = trainer.policy.step(trajectory, index).log_prob
            part = trainer.policy.step(sub, index).log_prob
        assert torch.equal(full, trajectory.log_probs[:, index])
        assert torch.equal(part, trajectory.log_probs[rows, index])
        with torch.no_grad():  # fp32 re-scoring of a bf16 rollout is off-policy: the test has teeth
            differs_outside |= not torch.equal(trainer.policy.step(trajectory, index).log_prob, full)
    assert differs_outside


@pytest.mark.parametrize("recipe", ["ddpo_jpeg.yaml", "flow_grpo_jpeg.yaml", "rlcm_jpeg.yaml"])
def test_an_on_policy_step_under_bf16_has_ratio_one_and_no_clipping(tmp_path, recipe):
    """Every loss call of this step is before the optimiser step, so each ratio must be exactly 1
    (issue 20 measured clipfrac 0.58 here before rollouts ran under the update's autocast)."""
    metrics = make_trainer(tmp_path, recipe, *ON_POLICY).train_step(0)
    assert metrics["ratio"] == 1.0
    assert metrics["clipfrac"] == 0.0 and metrics["approx_kl"] == 0.0


@pytest.mark.parametrize(
    "recipe, overrides",
    [
        ("b2diffurl_jpeg.yaml", []),
        ("sol_rl_jpeg.yaml", ["sampling.mode=sde", "train.loss=ppo_clip"]),  # preview, then regenerate
        ("naive_scaling_jpeg.yaml", ["sampling.mode=sde", "train.loss=ppo_clip"]),  # the pool is trained on
    ],
    ids=["b2diffurl", "sol_rl", "naive_scaling"],
)
def test_every_strategy_rolls_out_in_the_update_precision(tmp_path, recipe, overrides):
    trainer = make_trainer(tmp_path, recipe, "train.mixed_precision=bf16", *overrides)
    trajectory = trainer.strategy.collect(trainer, 0).trajectory
    assert trajectory.stochastic_steps().numel() > 0
    for index in trajectory.stochastic_steps().tolist():
        with torch.no_grad(), trainer.precision():
            log_prob = trainer.policy.step(trajectory, index).log_prob
        assert torch.equal(log_prob, trajectory.log_probs[:, index]), index
