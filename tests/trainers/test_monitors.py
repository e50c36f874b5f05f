"""Reward monitors: scored on the training rollouts, logged, never used for advantages."""

from __future__ import annotations

from pathlib import Path

import pytest

from genalign.config import ConfigError
from genalign.trainers import build_trainer, load_recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "tiny" / "ddpo_jpeg.yaml"
SMALL = [
    "sampling.num_inference_steps=3",
    "train.prompts_per_step=2",
    "train.group_size=2",
    "train.minibatch_size=4",
    "logging.progress=false",
]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def test_monitor_scores_the_same_rollouts_as_the_reward(tmp_path):
    # the training reward itself as a monitor must report exactly the logged reward mean, and a
    # second monitor (the verifier) a value in [0, 1]; the advantages come from the reward alone
    config = load_recipe(
        RECIPE,
        [
            *SMALL,
            f"logging.run_dir={tmp_path}/run",
            "reward.monitors={jpeg_compressibility: {}, shapes_eval: {partial: true}}",
            "prompts.prompts=[a red circle, two blue squares]",
        ],
    )
    trainer = build_trainer(config, base_dir=RECIPE.parent)
    assert set(trainer.monitors) == {"jpeg_compressibility", "shapes_eval"}
    metrics = trainer.train_step(0)
    assert metrics["monitor_jpeg_compressibility"] == pytest.approx(metrics["reward_mean"], rel=1e-6)
    assert 0.0 <= metrics["monitor_shapes_eval"] <= 1.0


def test_unknown_monitor_is_named(tmp_path):
    config = load_recipe(
        RECIPE, [*SMALL, f"logging.run_dir={tmp_path}/run", "reward.monitors={no_such_reward: {}}"]
    )
    with pytest.raises((KeyError, ValueError, ConfigError), match="no_such_reward"):
        build_trainer(config, base_dir=RECIPE.parent)
