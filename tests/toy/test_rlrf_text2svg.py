"""Text-to-SVG RLRF on the toy world: the shipped text-to-SVG writer, its SFT recipe, and a GRPO step
of `configs/toy/rlrf_text2svg.yaml` whose rewards are toy-vlm's VQAScore of each render plus the
length term, recomputed here from the batch's SVGs (issue #25)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from genalign.rewards import load_reward
from genalign.rewards.svg import render_batch
from genalign.trainers import build_trainer, load_recipe

from .svg_helpers import ONE_STEP

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "toy" / "rlrf_text2svg.yaml"
WRITER = ROOT / "assets" / "models" / "toy-svg-writer-t2s"


def test_the_recipes_are_text_to_svg_end_to_end():
    rl = load_recipe(RECIPE, [])
    assert rl.model.path == "assets/models/toy-svg-writer-t2s"
    assert rl.train.svg.task == "text_to_svg" and rl.prompts.source_kwargs["task"] == "text_to_svg"
    assert rl.reward.name == "svg_render" and rl.reward.kwargs["reward"] == "vlm_yes"
    assert rl.reward.kwargs["length_weight"] > 0
    sft = load_recipe(ROOT / "configs" / "toy" / "svg_writer_t2s_sft.yaml", [])
    assert sft.prompts.source_kwargs["task"] == "text_to_svg" and sft.train.sft.image_inputs is False
    # SFT and RL draw different scenes of the RL-train split; the evaluation draws RL-held-out ones
    assert sft.prompts.source_kwargs["split"] == rl.prompts.source_kwargs["split"] == "rl_train"
    assert sft.prompts.source_kwargs["seed"] != rl.prompts.source_kwargs["seed"]


def test_the_shipped_writer_has_its_card():
    card = json.loads((WRITER / "card.json").read_text())
    assert card["eval"]["set"]["task"] == "text_to_svg" and card["eval"]["set"]["split"] == "rl_heldout"
    after = card["eval"]["models"]["after SFT"]
    assert after["validity"]["mean"] > 0.9 and 0 < after["shapes_eval"]["mean"] < 1
    assert (WRITER / "README.md").is_file()


def test_a_grpo_step_scores_each_render_with_vqascore_plus_the_length_term(tmp_path):
    trainer = build_trainer(
        load_recipe(RECIPE, [*ONE_STEP, f"logging.run_dir={tmp_path}/run"]), base_dir=ROOT
    )
    seen, reward = {}, trainer.reward

    def spy(outputs, prompts, **metadata):
        seen.update(metadata, outputs=list(outputs), prompts=list(prompts))
        return reward(outputs, prompts, **metadata)

    trainer.reward = spy
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    svgs, prompts, reference = (
        batch.trajectory.extras["svgs"],
        batch.trajectory.prompts,
        seen["reference_svgs"],
    )
    assert seen["outputs"] == svgs and seen["prompts"] == prompts
    assert set(prompts) <= set(trainer.prompts)  # captions, not an image instruction
    pool = trainer.prompts.metadata
    assert all(r in pool["reference_svgs"] for r in reference)
    # by hand: render, VQAScore of the renders that worked, RLRF's one-sided length term
    results = render_batch(svgs, 32, 32)
    ok = [i for i, r in enumerate(results) if r.ok]
    vqa = load_reward("vlm_yes", model=str(ROOT / "assets/models/toy-vlm"), batch_size=64)
    expected = torch.full((len(svgs),), -1.0 - 2.0)  # a failed SVG: the floor of both parts
    if ok:
        judged = vqa(torch.stack([results[i].image for i in ok]), [prompts[i] for i in ok]).scores
        for k, i in enumerate(ok):
            excess = max(0.0, len(svgs[i]) - 1.1 * len(reference[i])) / len(reference[i])
            expected[i] = judged[k] + 2.0 * max(-1.0, 1.0 - excess**2)
    torch.testing.assert_close(batch.rewards.float().cpu(), expected, atol=1e-4, rtol=0)
    history = trainer.train()
    assert len(history) == 1 and math.isfinite(history[0]["reward_mean"])


@pytest.mark.parametrize("override", ["reward.kwargs.length_weight=-1"])
def test_a_bad_length_weight_is_a_one_line_error(override, tmp_path):
    with pytest.raises(ValueError, match="length_weight"):
        build_trainer(load_recipe(RECIPE, [override, f"logging.run_dir={tmp_path}/run"]), base_dir=ROOT)
