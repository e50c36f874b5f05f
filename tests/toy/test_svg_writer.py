"""The toy SVG writer (assets/models/toy-svg-writer): the canonical serialisation, its tokenizer, the
untrained writer's build, the shipped model's size and card, and its validity on held-out scenes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from genalign.policies import load_policy
from genalign.rewards.svg import render_local
from genalign.tiny.language import chat_tokenizer
from genalign.toy.svg_eval import load_svg_writer, score_svgs, svg_eval_set, write_svgs
from genalign.toy.svg_tasks import compact_svg, toy_svg_examples, toy_svg_pool
from genalign.toy.svg_writer import (
    SIZE_BUDGET_BYTES,
    WRITER_DIR,
    SVGWriterRecipe,
    build_svg_writer,
    svg_pieces,
    svg_writer_tokenizer,
)
from genalign.trainers.config import load_recipe

ROOT = Path(__file__).resolve().parents[2]
SFT_RECIPE = ROOT / "configs" / "toy" / "svg_writer_sft.yaml"
RL_RECIPE = ROOT / "configs" / "toy" / "rlrf_im2svg.yaml"


@pytest.fixture(scope="module")
def tokenizer():
    return svg_writer_tokenizer(SVGWriterRecipe(corpus_scenes=300))


def test_the_canonical_order_sorts_elements_and_renders_the_same_pixels():
    for _, _, scene, _ in toy_svg_examples(24, seed=4, split="train"):
        drawn, canonical = compact_svg(scene), compact_svg(scene, canonical=True)
        assert sorted(drawn) == sorted(canonical)  # the same characters, reordered elements
        assert torch.equal(render_local(drawn, 32, 32).image, render_local(canonical, 32, 32).image)
        xs = [obj.x for obj in sorted(scene.objects, key=lambda o: (o.x, o.y))]
        assert xs == sorted(xs)


def test_the_split_keeps_every_category_it_has():
    categories = {spec["tag"] for *_, spec in toy_svg_examples(12, seed=0, split="rl_train")}
    assert "single_object" in categories  # rl_train has single-object prompts
    heldout = {spec["tag"] for *_, spec in toy_svg_examples(12, seed=0, split="heldout")}
    assert "single_object" not in heldout  # heldout has none


def test_the_writer_tokenizer_spells_a_scene_in_a_fraction_of_the_tiny_tokens(tokenizer):
    tiny = chat_tokenizer()
    ours, theirs = [], []
    for _, svg, _, _ in toy_svg_examples(40, seed=9, split="rl_heldout", svg_style="canonical"):
        ids = tokenizer(svg, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == svg
        ours.append(len(ids))
        theirs.append(len(tiny(svg, add_special_tokens=False)["input_ids"]))
    assert max(ours) <= 40 and sum(ours) < 0.4 * sum(theirs)
    for piece in svg_pieces():
        assert len(tokenizer(piece, add_special_tokens=False)["input_ids"]) == 1, piece
    text = "any other text: 123 <g transform='x'>"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_an_untrained_writer_reloads_as_a_vlm_policy_with_the_same_tokens(tmp_path):
    recipe = SVGWriterRecipe(hidden_size=32, intermediate_size=64, layers=1, corpus_scenes=200)
    model, processor = build_svg_writer(tmp_path / "init", recipe)
    policy = load_policy("language", str(tmp_path / "init"), lora=None, train=False)
    assert policy.is_vlm
    svg = toy_svg_pool(count=1, svg_style="canonical").metadata["completions"][0]
    assert policy.tokenizer(svg)["input_ids"] == processor.tokenizer(svg)["input_ids"]
    assert sum(p.numel() for p in policy.model.parameters()) == sum(p.numel() for p in model.parameters())


def test_the_recipes_train_and_start_from_the_writer():
    sft = load_recipe(SFT_RECIPE, [])
    assert sft.train.method == "sft" and sft.prompts.source_kwargs["svg_style"] == "canonical"
    assert sft.prompts.source_kwargs["split"] == "rl_train"
    rl = load_recipe(RL_RECIPE, [])
    assert Path(rl.model.path) == Path("assets/models/toy-svg-writer")
    assert rl.prompts.source_kwargs["svg_style"] == "canonical"


# -- the shipped model ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def card():
    return json.loads((WRITER_DIR / "card.json").read_text())


def test_the_shipped_writer_fits_its_budget_and_its_card(card):
    size = sum(f.stat().st_size for f in WRITER_DIR.rglob("*") if f.is_file())
    assert size < SIZE_BUDGET_BYTES, f"toy-svg-writer is {size} bytes, over its budget"
    assert (WRITER_DIR / "README.md").is_file()
    policy = load_svg_writer(str(WRITER_DIR))
    assert sum(p.numel() for p in policy.model.parameters()) == card["parameters"]


def test_the_shipped_writer_writes_valid_svg_on_held_out_scenes_at_the_cards_rate(card):
    torch.set_num_threads(1)
    policy = load_svg_writer(str(WRITER_DIR))
    eval_set = svg_eval_set(count=24, seed=777)  # not the card's scenes
    from genalign.rewards import load_reward

    reward = load_reward("svg_fidelity", embedder=None)
    scores = score_svgs(write_svgs(policy, eval_set, max_new_tokens=64), eval_set, reward)
    validity = sum(scores["valid"]) / len(eval_set)
    expected = card["eval"]["models"]["after SFT"]["validity"]["mean"]
    assert validity >= expected - 0.15, f"validity {validity:.2f}, card {expected:.2f}"
    before = card["eval"]["models"].get("before SFT")
    if before is not None:  # the writer learned something the random one did not
        assert sum(scores["shapes_eval"]) / len(eval_set) > before["shapes_eval"]["mean"]


def test_the_shipped_writer_keeps_toy_clips_image_tower_as_its_sft_recipe_freezes_it(tmp_path):
    """Trained in SFT at the recipe's lr 2e-3 the tower lost what it saw of shape (held-out
    ShapesEval 31% against 64% frozen, docs/language.md 5.3): the recipe freezes it, and the shipped
    writer's tower is a fresh writer's (toy-clip's) to the bit."""
    assert load_recipe(SFT_RECIPE, []).model.frozen == ["model.vision_tower"]
    recipe = SVGWriterRecipe(hidden_size=32, intermediate_size=64, layers=1, corpus_scenes=200)
    fresh, _ = build_svg_writer(tmp_path / "init", recipe)
    shipped = load_svg_writer(str(WRITER_DIR)).model
    towers = [dict(m.model.vision_tower.named_parameters()) for m in (fresh, shipped)]
    assert towers[0].keys() == towers[1].keys() and len(towers[0]) > 10
    for name, value in towers[0].items():
        assert torch.equal(value, towers[1][name]), name
