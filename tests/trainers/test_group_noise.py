"""``train.group_noise``: the samples of a prompt group train on the same noise levels with the same
forward noise, in the same minibatch; off, every draw is what it was before the option existed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from genalign.config import ConfigError
from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.losses.forward_process import seeded_noise
from genalign.trainers.losses.nft import GROUP_NOISE_KEY, NFTLoss
from genalign.trainers.minibatches import epoch_passes, group_permutation
from genalign.trainers.strategies.base import step_generator
from genalign.trainers.train_config import TrainConfig

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny"


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def _train(group_noise: bool, **changes) -> SimpleNamespace:
    options = dict(
        seed=5,
        minibatch_size=4,
        timestep_fraction=0.5,
        timestep_order="random",
        drop_zero_advantage=False,
        gradient_accumulation_steps=1,
        group_noise=group_noise,
        strategy="groups",
    )
    return SimpleNamespace(**(options | changes))


def test_group_permutation_keeps_each_group_together_in_a_random_order():
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    permutation, group_index = group_permutation(group_ids, torch.Generator().manual_seed(0))
    assert sorted(permutation.tolist()) == list(range(12))
    assert torch.equal(group_index, group_ids)
    runs = group_ids[permutation].tolist()
    assert [runs[i : i + 3] for i in range(0, 12, 3)] == [[g] * 3 for g in runs[::3]]  # contiguous
    orders = {
        tuple(group_permutation(group_ids, torch.Generator().manual_seed(s))[0].tolist()) for s in range(6)
    }
    assert len(orders) > 1  # the order of the groups (and within them) is drawn
    # ids need not be 0..G-1: they are mapped to dense indices
    _, dense = group_permutation(torch.tensor([7, 7, 3, 3]), torch.Generator().manual_seed(0))
    assert dense.tolist() == [1, 1, 0, 0]


def test_minibatches_hold_whole_groups_that_share_their_noise_levels():
    group_ids = torch.arange(4).repeat_interleave(4)  # 4 groups of 4, minibatches of 4
    steps = torch.arange(10, 20)
    passes = list(
        epoch_passes(
            _train(True), 3, 0, torch.arange(16), 16, steps, torch.ones(16, dtype=bool), 0, group_ids
        )
    )
    assert len(passes) == 4
    levels = []
    for part in passes:
        assert len(set(group_ids[part.rows].tolist())) == 1 and len(part.rows) == 4
        assert part.step_indices.shape == (4, 5)
        assert (part.step_indices == part.step_indices[0]).all()  # the group's k levels, shared
        levels.append(tuple(part.step_indices[0].tolist()))
    assert len(set(levels)) > 1  # other groups draw other levels


def test_off_the_draws_are_the_per_sample_ones_and_missing_groups_fail_by_name():
    steps = torch.arange(10)
    kept = torch.ones(8, dtype=bool)
    (*parts,) = epoch_passes(_train(False), 2, 1, torch.arange(8), 8, steps, kept, 0, torch.zeros(8))
    generator = step_generator(5, 2, 1)
    permutation = torch.randperm(8, generator=generator)
    keys = torch.rand(8, 10, generator=generator)
    chosen = torch.argsort(keys, dim=1)[:, :5]
    assert [p.rows for p in parts] == [permutation[:4].tolist(), permutation[4:].tolist()]
    assert torch.equal(parts[0].step_indices, chosen[permutation[:4]])
    with pytest.raises(ValueError, match="train.group_noise: the 'groups' strategy reports no prompt groups"):
        list(epoch_passes(_train(True), 0, 0, torch.arange(8), 8, steps, kept, 0, None))


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
