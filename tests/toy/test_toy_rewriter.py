"""The toy rewriter (assets/models/toy-rewriter): size budget, loading, its SFT data and recipe, and
its answer-tag rate against the card's measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from genalign.algorithms.prompt_rewrite import GENEVAL_TEMPLATE
from genalign.policies import load_policy
from genalign.toy.paraphrase import paraphrase_set
from genalign.toy.prompts import prompts_for
from genalign.toy.rewriter import (
    REWRITER_DIR,
    SIZE_BUDGET_BYTES,
    build_rewriter,
    rewriter_pool,
    rewriter_rates,
)
from genalign.trainers.config import load_recipe
from genalign.trainers.trainer import build_trainer

ROOT = Path(__file__).resolve().parents[2]
SFT_RECIPE = ROOT / "configs" / "toy" / "rewriter_sft.yaml"


@pytest.fixture(scope="module")
def rewriter():
    torch.set_num_threads(1)
    return load_policy("language", str(REWRITER_DIR), lora=None, train=False)


@pytest.fixture(scope="module")
def card():
    return json.loads((REWRITER_DIR / "card.json").read_text())["rewriter"]


def test_the_rewriter_fits_its_size_budget():
    size = sum(f.stat().st_size for f in REWRITER_DIR.rglob("*") if f.is_file())
    assert size < SIZE_BUDGET_BYTES, f"toy-rewriter is {size} bytes, over its {SIZE_BUDGET_BYTES} budget"
    assert (REWRITER_DIR / "README.md").is_file()


def test_it_loads_as_a_language_policy_and_spells_the_paraphrase_vocabulary(rewriter, card):
    assert sum(p.numel() for p in rewriter.model.parameters()) == card["parameters"]
    tokenizer = rewriter.tokenizer
    for item in paraphrase_set("rl_heldout", 1, seed=3)[:20]:
        text = f"<answer>{item.canonical}</answer> {item.text}"
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
        assert len(ids) < len(text) / 2  # the BPE learned the toy words, not bytes


def test_sampled_and_greedy_rewrites_hold_answer_tags_at_the_cards_rate(rewriter, card):
    items = paraphrase_set("rl_heldout", 1, seed=7)[:32]
    inputs, canonicals = [p.text for p in items], [p.canonical for p in items]
    sampled = rewriter_rates(rewriter, inputs, canonicals, temperature=1.0, seed=0)
    greedy = rewriter_rates(rewriter, inputs, canonicals, temperature=0.01, seed=0)
    # 32 samples: a binomial standard error of at most 0.09; 3 of them as the tolerance
    assert abs(sampled["answer_rate"] - card["paraphrased_answer_rate_T1.0"]) <= 0.27
    assert abs(greedy["answer_rate"] - card["paraphrased_answer_rate_T0.01"]) <= 0.27
    assert abs(greedy["canonical_rate"] - card["paraphrased_canonical_rate_T0.01"]) <= 0.27
    assert sampled["answer_rate"] >= 0.7 and sampled["canonical_rate"] < 1.0  # well formed, room for RL


def test_the_sft_pool_pairs_templates_with_canonical_answers():
    pool = rewriter_pool("rl_train", paraphrases_per_prompt=2, copies_per_prompt=1, seed=0)
    captions = {p.caption for p in prompts_for("rl_train")}
    assert len(pool) == 3 * len(captions)
    for prompt, target in zip(pool, pool.metadata["completions"], strict=True):
        assert prompt.startswith(GENEVAL_TEMPLATE.split("{prompt}")[0])
        assert target.startswith("<answer>") and target.endswith("</answer>")
        assert target[len("<answer>") : -len("</answer>")] in captions
    assert pool[0] == GENEVAL_TEMPLATE.format(prompt=pool.metadata["completions"][0][8:-9])  # the copy


def test_the_sft_recipe_trains_a_freshly_built_rewriter(tmp_path):
    torch.set_num_threads(1)
    model, tokenizer = build_rewriter(tmp_path / "init", hidden=16, layers=1)
    assert len(tokenizer) == model.config.vocab_size
    overrides = [
        f"model.path={tmp_path / 'init'}",
        "train.num_steps=2",
        "train.prompts_per_step=4",
        "train.minibatch_size=4",
        f"logging.run_dir={tmp_path}/run",
        "logging.progress=false",
        "logging.checkpoint_every=0",
        "prompts.source_kwargs.paraphrases_per_prompt=1",
    ]
    config = load_recipe(SFT_RECIPE, overrides)
    history = build_trainer(config, base_dir=SFT_RECIPE.parent).train()
    assert len(history) == 2 and all(m["sft_loss"] > 0 for m in history)
