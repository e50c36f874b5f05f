"""Sol-RL: candidate selection, ranking fidelity, regeneration from the candidates' seeds and
initial noise, config checks, and every recipe loading."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch

from genalign.algorithms.sol_rl import ranking_fidelity, select_candidates
from genalign.config import ConfigError
from genalign.trainers import STRATEGIES, build_trainer, load_recipe
from genalign.trainers.method_config import SolRLConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def test_best_worst_keeps_the_stated_indices():
    rewards = torch.tensor([[0.3, 0.9, 0.1, 0.5, 0.7, 0.2], [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    kept = select_candidates(rewards, "best_worst", keep_top=2, keep_bottom=1)
    assert kept.tolist() == [[1, 4, 2], [0, 1, 5]]  # best first, then the worst
    # ties never put one candidate in both halves; NaN ranks last
    tied = select_candidates(torch.zeros(1, 4), "best_worst", keep_top=2, keep_bottom=2)
    assert sorted(tied[0].tolist()) == [0, 1, 2, 3]
    nan = select_candidates(torch.tensor([[1.0, float("nan"), 0.5]]), "best_worst", 1, 1)
    assert nan.tolist() == [[0, 1]]


def test_random_and_all_selection():
    rewards = torch.randn(3, 8)
    first = select_candidates(rewards, "random", 2, 2, torch.Generator().manual_seed(4))
    again = select_candidates(rewards, "random", 2, 2, torch.Generator().manual_seed(4))
    assert torch.equal(first, again) and first.shape == (3, 4)
    assert all(len(set(row.tolist())) == 4 for row in first)
    assert select_candidates(rewards, "all", 2, 2).tolist() == [list(range(8))] * 3
    with pytest.raises(ValueError, match="unknown selection"):
        select_candidates(rewards, "median", 2, 2)


def test_ranking_fidelity_equals_a_hand_computation():
    preview = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    final = torch.tensor([[1.0, 2.0, 4.0, 3.0], [4.0, 3.0, 2.0, 1.0]])
    # row 1: one discordant pair of 6 -> tau = (5 - 1) / 6; rho = 1 - 6 * 2 / (4 * 15) = 0.8
    # row 2: reversed -> tau = rho = -1; top-2 hits: row 1 {2, 3} vs {2, 3} = 1, row 2 = 0
    out = ranking_fidelity(preview, final, top_k=2)
    assert out["kendall_tau"] == pytest.approx((4 / 6 - 1) / 2)
    assert out["spearman_rho"] == pytest.approx((0.8 - 1) / 2)
    assert out["top_k_hit_rate"] == pytest.approx(0.5)
    assert ranking_fidelity(preview[:1], final[:1], top_k=1)["top_k_hit_rate"] == 0.0


def test_ranking_fidelity_leaves_out_tied_prompts_without_a_warning():
    preview = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5]])  # row 2: every preview tied
    final = torch.tensor([[1.0, 2.0, 4.0, 3.0], [4.0, 3.0, 2.0, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scipy warns on a constant input; it must not be called
        out = ranking_fidelity(preview, final, top_k=2)
    assert out["kendall_tau"] == pytest.approx(4 / 6)  # row 1 alone
    assert out["spearman_rho"] == pytest.approx(0.8)


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="train.sol_rl.keep_top"):
        SolRLConfig(pool_size=4, keep_top=3, keep_bottom=3)
    with pytest.raises(ConfigError, match="train.group_size 4 must equal"):
        load_recipe(ROOT / "configs" / "tiny" / "sol_rl_jpeg.yaml", ["train.sol_rl.keep_top=3"])
    with pytest.raises(ConfigError, match="preview_precision"):
        load_recipe(ROOT / "configs" / "tiny" / "sol_rl_jpeg.yaml", ["train.sol_rl.preview_precision=int4"])
    assert "sol_rl" in STRATEGIES.names()


def make_trainer(tmp_path, *overrides):
    recipe = ROOT / "configs" / "tiny" / "sol_rl_jpeg.yaml"
    config = load_recipe(recipe, [f"logging.run_dir={tmp_path}/run", *overrides])
    return build_trainer(config, base_dir=recipe.parent)


def record_rollouts(trainer, monkeypatch):
    calls = []
    rollout = trainer.policy.rollout

    def spy(prompts, **kwargs):
        trajectory = rollout(prompts, **kwargs)
        calls.append(trajectory)
        return trajectory

    monkeypatch.setattr(trainer.policy, "rollout", spy)
    return calls


def test_regeneration_uses_the_selected_candidates_seeds_and_initial_noise(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path)
    calls = record_rollouts(trainer, monkeypatch)
    strategy = trainer.strategy
    with trainer.loss.rollout_policy(trainer, 0):
        batch = strategy.collect(trainer.rollout_context(), step=0)
    preview, regenerated = calls
    assert preview.settings.num_inference_steps == 2 and regenerated.settings.num_inference_steps == 4
    prompts, pool_seeds = strategy.global_pool(trainer.rollout_context(), 0)
    assert torch.equal(preview.seeds, pool_seeds)
    # the preview ranking decides which candidates come back: best 2 then worst 2 per prompt
    preview_rewards = trainer.reward(preview.images, preview.prompts).scores.reshape(2, 8)
    kept = select_candidates(preview_rewards, "best_worst", 2, 2)
    expected_rows = (torch.arange(2)[:, None] * 8 + kept).flatten()
    assert torch.equal(regenerated.seeds, pool_seeds[expected_rows])
    assert regenerated.prompts == [prompts[0]] * 4 + [prompts[1]] * 4
    assert torch.equal(regenerated.latents[:, 0], preview.latents[expected_rows, 0])  # same initial noise
    assert torch.equal(batch.trajectory.seeds, regenerated.seeds)
    assert batch.trajectory.group_ids.tolist() == [0] * 4 + [1] * 4
    for key in (
        "sol_kendall_tau",
        "sol_spearman_rho",
        "sol_top_k_hit_rate",
        "time_exploration",
        "time_regeneration",
    ):
        assert key in batch.metrics
    assert batch.metrics["sol_preview_simulated"] == 0.0
    # the global batch is a pure function of (seed, step)
    again_prompts, again_seeds = strategy.global_pool(trainer.rollout_context(), 0)
    assert again_prompts == prompts and torch.equal(again_seeds, pool_seeds)
    assert not torch.equal(strategy.global_pool(trainer.rollout_context(), 1)[1], pool_seeds)


def test_naive_scaling_trains_on_the_selected_pool_samples(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, "train.sol_rl.preview_steps=0")
    calls = record_rollouts(trainer, monkeypatch)
    batch = trainer.strategy.collect(trainer.rollout_context(), step=0)
    (pool,) = calls  # no regeneration
    assert pool.settings.num_inference_steps == 4
    rewards = trainer.reward(pool.images, pool.prompts).scores.reshape(2, 8)
    kept = select_candidates(rewards, "best_worst", 2, 2)
    rows = (torch.arange(2)[:, None] * 8 + kept).flatten()
    assert torch.equal(batch.trajectory.seeds, pool.seeds[rows])
    assert torch.equal(batch.trajectory.latents, pool.latents[rows])


def test_sol_rl_with_ppo_clip_on_sde_rollouts(tmp_path):
    trainer = make_trainer(
        tmp_path,
        "train.loss=ppo_clip",
        "sampling.mode=sde",
        "train.sol_rl.selection=all",
        "train.group_size=8",
        "train.minibatch_size=8",
    )
    before = [p.detach().clone() for p in trainer.parameters]
    metrics = trainer.train_step(0)
    assert "clipfrac" in metrics and "nft_r" not in metrics
    assert math.isfinite(metrics["sol_kendall_tau"])
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.parameters))


RECIPES = sorted(p for p in (ROOT / "configs").glob("*/*.yaml") if p.parent.name != "accelerate")


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_recipe_loads(recipe):
    config = load_recipe(recipe)
    if config.train.strategy == "sol_rl" and recipe.parent.name != "tiny":
        sol = config.train.sol_rl
        assert (sol.pool_size, sol.keep_top, sol.keep_bottom, config.train.group_size) == (96, 12, 12, 24)
        assert config.sampling.num_inference_steps == 10 and config.train.nft.beta == 1.0
        assert sol.preview_steps in (0, 6) and sol.preview_precision == "nvfp4"
