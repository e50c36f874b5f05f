"""``train.group_noise`` in DiffusionNFT's loss and the trainer: a prompt group's samples draw the same
forward noise and train together; the minibatch side is in test_minibatches.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from genalign.config import ConfigError
from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.losses.forward_process import seeded_noise
from genalign.trainers.losses.nft import GROUP_NOISE_KEY, NFTLoss
from genalign.trainers.train_config import TrainConfig

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny"


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def test_nft_noise_is_keyed_by_group_under_group_noise_and_by_seed_otherwise():
    trajectory = SimpleNamespace(seeds=torch.tensor([11, 12, 13, 14]), group_ids=torch.tensor([0, 0, 1, 1]))
    step_index, like = torch.tensor([2, 2, 2, 2]), torch.zeros(4, 4, 3, 3)
    shared = NFTLoss(TrainConfig(group_size=2, minibatch_size=2, group_noise=True))
    shared.begin_step(4)
    eps = shared.noise(trajectory, step_index, like)
    assert torch.equal(eps[0], eps[1]) and torch.equal(eps[2], eps[3]) and not torch.equal(eps[0], eps[2])
    expected = seeded_noise(
        torch.tensor([0, 1]) + GROUP_NOISE_KEY, torch.tensor([2, 2]), like.shape[1:], step=4
    )
    assert torch.equal(eps[::2], expected)
    # another noise level of the same group draws other noise
    other = shared.noise(trajectory, torch.tensor([2, 3, 2, 3]), like)
    assert not torch.equal(other[0], other[1])
    plain = NFTLoss(TrainConfig(group_size=2, minibatch_size=2))
    plain.begin_step(4)
    eps = plain.noise(trajectory, step_index, like)
    assert not torch.equal(eps[0], eps[1])
    assert torch.equal(eps, seeded_noise(trajectory.seeds, step_index, like.shape[1:], step=4))


def test_a_training_step_gives_each_minibatch_one_group_with_one_noise(tmp_path, monkeypatch):
    config = load_recipe(
        TINY / "nft_sd_jpeg.yaml",
        [
            f"logging.run_dir={tmp_path}/run",
            "train.num_steps=1",
            "train.group_noise=true",
            "train.fuse_timesteps=true",
        ],
    )
    trainer = build_trainer(config)
    seen = []
    draw = trainer.loss.noise

    def spy(trajectory, step_index, like):
        eps = draw(trajectory, step_index, like)
        seen.append((trajectory.group_ids.clone(), step_index.clone(), eps))
        return eps

    monkeypatch.setattr(trainer.loss, "noise", spy)
    initial = [p.detach().clone() for p in trainer.parameters]
    trainer.train()
    assert len(seen) == 2  # 2 groups of 4 in minibatches of 4, the 5 levels fused into one call
    for group_ids, step_index, eps in seen:
        assert len(set(group_ids.tolist())) == 1
        for level in step_index.unique():
            rows = (step_index == level).nonzero().flatten()
            assert len(rows) == 4 and all(torch.equal(eps[rows[0]], eps[r]) for r in rows)
    assert any(not torch.equal(a, b) for a, b in zip(initial, trainer.parameters))


def test_group_noise_resumes_exactly(tmp_path):
    recipe = TINY / "nft_sd_jpeg.yaml"
    on = ["train.group_noise=true"]
    straight = build_trainer(load_recipe(recipe, [f"logging.run_dir={tmp_path}/a", "train.num_steps=2", *on]))
    straight.train()
    build_trainer(load_recipe(recipe, [f"logging.run_dir={tmp_path}/b", "train.num_steps=1", *on])).train()
    resumed = build_trainer(
        load_recipe(
            recipe, [f"logging.run_dir={tmp_path}/b", "train.num_steps=2", "logging.resume=latest", *on]
        )
    )
    resumed.train()
    for a, b in zip(straight.parameters, resumed.parameters, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    ("recipe", "changes", "message"),
    [
        (
            "nft_sd_jpeg.yaml",
            ["train.minibatch_size=2"],
            "train.group_noise: train.minibatch_size 2 must be a multiple of train.group_size 4",
        ),
        ("flow_grpo_jpeg.yaml", [], "train.group_noise: the 'ppo_clip' loss does not draw its forward noise"),
        (
            "astrolabe_jpeg.yaml",
            [],
            "train.group_noise: the 'astrolabe' loss does not draw its forward noise",
        ),
    ],
)
def test_what_cannot_share_group_noise_fails_by_name(tmp_path, recipe, changes, message):
    with pytest.raises(ConfigError, match=message):
        config = load_recipe(
            TINY / recipe, [f"logging.run_dir={tmp_path}/run", "train.group_noise=true", *changes]
        )
        build_trainer(config)
