"""The SVG writer's oracle reward (genalign.toy.svg_oracle): ShapesEval on the render, with the scene's
spec handed through the pool and the svg strategy; its control recipe runs a GRPO step; and the svg
strategy's ReMax baseline (`train.svg.baseline: greedy`) is the reward of each group's greedy answer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from genalign.config import ConfigError
from genalign.rewards import load_reward
from genalign.toy.shapes_eval import evaluate
from genalign.toy.svg_tasks import toy_svg_examples, toy_svg_pool
from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.strategies.svg import divergence_mask

from .svg_helpers import ONE_STEP, greedy_answers_by_hand, greedy_baseline_advantages

ROOT = Path(__file__).resolve().parents[2]
ORACLE_RECIPE = ROOT / "configs" / "toy" / "rlrf_im2svg_oracle.yaml"


@pytest.fixture(scope="module")
def pool():
    return toy_svg_pool(count=12, seed=3, split="rl_train", svg_style="canonical", specs=True)


def test_the_pool_carries_each_scenes_spec_only_when_asked(pool):
    examples = toy_svg_examples(12, seed=3, split="rl_train", svg_style="canonical")
    assert pool.metadata["specs"] == [spec for *_, spec in examples]
    plain = toy_svg_pool(count=12, seed=3, split="rl_train", svg_style="canonical")
    assert "specs" not in plain.metadata
    assert plain.metadata["reference_svgs"] == pool.metadata["reference_svgs"]
    assert plain.digest() != pool.digest()  # a resume cannot mix the two


@pytest.mark.parametrize("mode", ["correct", "partial", "mixed"])
def test_the_reward_is_shapes_eval_on_the_render(pool, mode):
    reward = load_reward("toy_svg_verifier", mode=mode)
    svgs = pool.metadata["reference_svgs"]
    # the reference's render through ShapesEval directly, as the independent computation
    verdict = evaluate(pool.metadata["images"], pool.metadata["specs"])["per_sample"]
    correct = torch.tensor([float(v["correct"]) for v in verdict])
    assert correct.mean() > 0.8  # the verifier accepts most ground-truth renders at 32 px
    out = reward(svgs, list(pool), specs=pool.metadata["specs"])
    assert torch.equal(out.details["correct"], correct)
    expected = {"correct": correct, "partial": out.details["partial"]}.get(mode)
    if mode == "mixed":
        expected = correct + 0.5 * out.details["partial"]
    assert torch.allclose(out.scores, expected)
    assert ((out.details["partial"] == 1) == (correct == 1)).all()


def test_a_wrong_colour_loses_and_bad_svg_scores_the_floor(pool):
    reward = load_reward("toy_svg_verifier", mode="mixed", min_reward=-1.0)
    row = next(i for i, spec in enumerate(pool.metadata["specs"]) if spec["tag"] == "colors")
    spec, svg = pool.metadata["specs"][row], pool.metadata["reference_svgs"][row]
    fill = svg.split('fill="')[1].split('"')[0]
    recoloured = svg.replace(fill, "#1a1a1a" if fill != "#1a1a1a" else "#e61a1a")
    bad = ["", '<svg viewBox="0 0 32 32"></svg>', '<svg viewBox="0 0 32 32"><script>x()</script></svg>']
    out = reward([svg, recoloured, *bad], list(pool)[:5], specs=[spec] * 5)
    assert out.scores[0] > out.scores[1] >= 0
    assert out.scores[2:].tolist() == [-1.0, -1.0, -1.0]
    assert out.details["failure_count"] == 3


def test_scene_mode_pays_for_the_targets_objects_not_for_added_ones(pool):
    from genalign.toy.detection import compare_scenes

    reward = load_reward("toy_svg_verifier", mode="scene")
    svgs, specs, targets = pool.metadata["reference_svgs"], pool.metadata["specs"], pool.metadata["images"]
    padded = [svg.replace("</svg>", '<circle cx="4" cy="4" r="3" fill="#1a1a1a"/></svg>') for svg in svgs]
    mixed = load_reward("toy_svg_verifier", mode="mixed")(padded, list(pool), specs=specs)
    out = reward([*svgs, *padded], list(pool) * 2, specs=specs * 2, targets=torch.cat([targets, targets]))
    n = len(svgs)
    assert out.details["scene_match"][:n].tolist() == [1.0] * n  # a reference holds its scene's objects
    assert out.details["scene_match"][n:].tolist() == [0.0] * n  # one object too many
    # the reward's own ShapesEval verdicts, and the object count by compare_scenes on a fresh render
    correct, partial = out.details["correct"], out.details["partial"]
    extra = torch.tensor([float(compare_scenes(_render(svg), t).extra) for svg, t in zip(padded, targets)])
    assert torch.equal(out.details["extra_objects"][n:], extra)
    assert extra.sum() >= n - 2  # the added circle may touch an object in a crowded scene
    assert torch.allclose(out.scores[n:], 0.5 * partial[n:] - 0.5 * extra)  # never right: no full credit
    assert torch.allclose(out.scores[:n], correct[:n] + 0.5 * partial[:n])
    # the padding still passes most ShapesEval specs (GenEval's "at least count" rule), and yet
    # every padded render scores below its reference in scene mode
    assert mixed.details["correct"].sum() >= 0.5 * n
    assert (out.scores[n:] < out.scores[:n]).all()
    with pytest.raises(ValueError, match="targets"):
        reward(svgs, list(pool), specs=specs)


def _render(svg):
    from genalign.rewards.svg import RenderLimits, render_batch

    return render_batch([svg], 32, 32, "cairosvg", RenderLimits())[0].image


def test_missing_or_mismatched_specs_say_what_to_do(pool):
    reward = load_reward("toy_svg_verifier")
    with pytest.raises(ValueError, match="specs: true"):
        reward(pool.metadata["reference_svgs"][:2], list(pool)[:2])
    with pytest.raises(ValueError, match="2 SVGs but 1 specs"):
        reward(pool.metadata["reference_svgs"][:2], list(pool)[:2], specs=pool.metadata["specs"][:1])
    with pytest.raises(ValueError, match="mode must be one of"):
        load_reward("toy_svg_verifier", mode="best")


def test_the_oracle_recipe_differs_from_the_rl_recipe_only_in_its_reward(tmp_path):
    oracle = load_recipe(ORACLE_RECIPE, [])
    rl = load_recipe(ROOT / "configs" / "toy" / "rlrf_im2svg.yaml", [])
    assert oracle.train == rl.train and oracle.sampling == rl.sampling and oracle.model == rl.model
    assert oracle.reward.name == "toy_svg_verifier" and oracle.prompts.source_kwargs["specs"] is True
    assert {k: v for k, v in oracle.prompts.source_kwargs.items() if k != "specs"} == rl.prompts.source_kwargs


def one_step_trainer(tmp_path, *overrides: str):
    """The oracle recipe for one step of 2 scenes x 4 samples from the shipped writer."""
    config = load_recipe(ORACLE_RECIPE, [f"logging.run_dir={tmp_path}/run", *ONE_STEP, *overrides])
    return build_trainer(config, base_dir=ROOT)


def test_the_svg_strategy_hands_the_specs_to_the_reward_in_a_grpo_step(tmp_path):
    trainer = one_step_trainer(tmp_path)
    seen = {}
    reward = trainer.reward

    def spy(outputs, prompts, **metadata):
        seen.update(metadata)
        return reward(outputs, prompts, **metadata)

    trainer.reward = spy
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    assert len(seen["specs"]) == 8 and set(seen) >= {"specs", "targets", "reference_svgs"}
    pool = trainer.prompts.metadata
    for svg, spec in zip(seen["reference_svgs"], seen["specs"]):  # each sample gets its own row's spec
        assert spec == pool["specs"][pool["reference_svgs"].index(svg)]
    assert batch.rewards.min() >= -1.0 and batch.rewards.max() <= 1.5
    history = trainer.train()
    assert len(history) == 1 and math.isfinite(history[0]["reward_mean"])


def test_the_greedy_baseline_is_the_reward_of_each_groups_greedy_answer(tmp_path):
    trainer = one_step_trainer(tmp_path, "train.svg.baseline=greedy")
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    greedy = batch.sample_details["greedy_reward"]
    assert torch.equal(batch.trajectory.group_ids, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))
    assert greedy[:4].unique().numel() == 1 and greedy[4:].unique().numel() == 1  # one per group
    # each group's input answered at 0.01 (the policy's mode) and scored by the verifier, by hand
    train = trainer.config.train
    _, expected = greedy_answers_by_hand(trainer, temperature=0.01, chat_template=True)
    torch.testing.assert_close(greedy[[0, 4]], expected)
    want = greedy_baseline_advantages(batch.rewards, expected, 4, train.advantage_clip)
    torch.testing.assert_close(batch.advantages, want)
    assert batch.metrics["greedy_reward_mean"] == pytest.approx(float(expected.mean()))


def test_the_svg_baseline_option_is_checked():
    with pytest.raises(ConfigError, match="greedy_temperature must be positive"):
        load_recipe(ORACLE_RECIPE, ["train.svg.baseline=greedy", "train.svg.greedy_temperature=0"])
    with pytest.raises(ConfigError, match="baseline"):
        load_recipe(ORACLE_RECIPE, ["train.svg.baseline=best"])


def test_divergence_credit_keeps_the_tokens_from_the_first_difference_from_the_greedy_answer():
    samples = torch.tensor([[5, 6, 7, 0], [5, 9, 7, 0], [5, 6, 7, 8], [1, 6, 7, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    greedy = torch.tensor([[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 6, 7]])  # shorter than the samples
    kept = divergence_mask(samples, mask, greedy)
    # row 0 is the greedy answer (nothing kept); row 1 differs at 1; row 2 goes on past it; row 3 at 0
    assert kept.tolist() == [[0, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1], [1, 1, 1, 0]]
    with pytest.raises(ConfigError, match="needs train.svg.baseline 'greedy'"):
        load_recipe(ORACLE_RECIPE, ["train.svg.credit=divergence"])


def test_a_divergence_step_trains_only_past_each_samples_first_difference(tmp_path):
    trainer = one_step_trainer(tmp_path, "train.svg.baseline=greedy", "train.svg.credit=divergence")
    full = one_step_trainer(tmp_path / "full", "train.svg.baseline=greedy")
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    plain = full.strategy.collect(full.rollout_context(), 0)
    assert torch.equal(batch.trajectory.completion_ids, plain.trajectory.completion_ids)  # same rollout
    kept, everything = batch.trajectory.completion_mask, plain.trajectory.completion_mask
    assert (kept <= everything).all() and kept.sum() < everything.sum()
    assert 0 < batch.metrics["divergence_token_fraction"] < 1
    history = trainer.train()
    assert len(history) == 1 and math.isfinite(history[0]["reward_mean"])
