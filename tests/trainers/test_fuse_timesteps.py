"""``train.fuse_timesteps``: a minibatch's trained steps as one loss call on the repeated rows give
the unfused update (same gradient, same metrics), and losses that are not a mean over their rows
refuse it by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genalign.config import ConfigError
from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.minibatches import MinibatchPass, loss_calls

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny"


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def test_loss_calls_unfused_one_per_step_fused_one_on_repeated_rows():
    part = MinibatchPass(
        rows=[3, 0, 5],
        step_indices=torch.tensor([[1, 4], [2, 0], [7, 3]]),
        share=0.75,
        dummy=False,
        optimizer_step=True,
    )
    unfused = loss_calls(part, fuse=False)
    assert [(rows, steps.tolist(), weight) for rows, steps, weight in unfused] == [
        ([3, 0, 5], [1, 2, 7], 0.375),
        ([3, 0, 5], [4, 0, 3], 0.375),
    ]
    [(rows, steps, weight)] = loss_calls(part, fuse=True)
    # k-major: every row's first step, then every row's second; the mean over 6 rows weighs
    # share, as share / 2 times each of the two means over 3 rows
    assert (rows, steps.tolist(), weight) == ([3, 0, 5, 3, 0, 5], [1, 2, 7, 4, 0, 3], 0.75)
    one_step = MinibatchPass([1, 2], torch.tensor([[5], [6]]), 1.0, False, True)
    assert [(r, s.tolist(), w) for r, s, w in loss_calls(one_step, fuse=True)] == [([1, 2], [5, 6], 1.0)]


@pytest.mark.parametrize(
    ("recipe", "loss"),
    [("nft_sd_jpeg.yaml", "nft"), ("flow_grpo_jpeg.yaml", "ppo_clip")],
)
def test_a_fused_step_updates_as_the_unfused_one(tmp_path, recipe, loss):
    """Two training steps with and without fusing: the same gradient norms, losses and weights
    (up to the float order of batched kernels); a wrong weight on the fused call would scale the
    gradient by the number of steps."""
    runs = {}
    for fuse in (False, True):
        config = load_recipe(
            TINY / recipe,
            [
                f"logging.run_dir={tmp_path}/{fuse}",
                "train.num_steps=2",
                f"train.fuse_timesteps={str(fuse).lower()}",
            ],
        )
        assert config.train.loss == loss
        trainer = build_trainer(config)
        initial = [p.detach().clone() for p in trainer.parameters]
        history = trainer.train()
        runs[fuse] = (trainer, history, initial)
    (plain, plain_history, initial), (fused, fused_history, _) = runs[False], runs[True]
    for a, b in zip(plain_history, fused_history, strict=True):
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], rel=1e-4, abs=1e-7)
    moved = [not torch.equal(a, b) for a, b in zip(initial, plain.parameters)]
    assert any(moved)
    for a, b in zip(plain.parameters, fused.parameters, strict=True):
        # Adam at lr 1e-3 moves a weight by ~1e-3 a step; batched kernels' float order (AVX-512 /
        # AMX CPUs) leaves ~3e-6 on a few near-zero weights, well inside 1% of one step
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("recipe", ["rwr_jpeg.yaml", "astrolabe_jpeg.yaml"])
def test_losses_that_are_not_row_means_refuse_fusing_by_name(tmp_path, recipe):
    config = load_recipe(TINY / recipe, [f"logging.run_dir={tmp_path}/run", "train.fuse_timesteps=true"])
    with pytest.raises(
        ConfigError, match=rf"train.fuse_timesteps: the '{config.train.loss}' loss is not a mean"
    ):
        build_trainer(config)
