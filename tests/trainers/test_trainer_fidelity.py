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
