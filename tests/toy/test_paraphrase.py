"""Paraphrases of toy captions: deterministic, meaning-preserving, read back to their specs, and
scored by the ``shapes_eval`` reward with their own spec."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import genalign.toy  # noqa: F401  (registers "shapes_eval")
from genalign.rewards.base import load_reward
from genalign.toy.captions import CaptionParseError, parse_caption
from genalign.toy.paraphrase import (
    KINDS,
    paraphrase,
    paraphrase_set,
    read_paraphrase,
    write_paraphrase_files,
)
from genalign.toy.prompts import prompts_for, scene_for_spec
from genalign.toy.scenes import render_scenes

ROOT = Path(__file__).resolve().parents[2]


def _same_scenes(spec_a: dict, spec_b: dict) -> bool:
    """Same include clauses up to a position caption's converse (parse both canonical captions)."""
    return spec_a["include"] == spec_b["include"] or (
        spec_a["tag"] == spec_b["tag"] == "position"
        and {c["class"] for c in spec_a["include"]} == {c["class"] for c in spec_b["include"]}
    )


def test_paraphrases_are_deterministic_and_differ_from_the_caption():
    prompt = prompts_for("rl_heldout", "color_attr")[0]
    first = [paraphrase(prompt, seed=3, index=i) for i in range(5)]
    assert first == [paraphrase(prompt, seed=3, index=i) for i in range(5)]
    assert paraphrase_set("rl_train", 2, seed=1) == paraphrase_set("rl_train", 2, seed=1)
    assert paraphrase_set("rl_train", 1, seed=1) != paraphrase_set("rl_train", 1, seed=2)
    for item in paraphrase_set("rl_heldout", 2, seed=0):
        assert item.text != item.canonical and item.kinds and set(item.kinds) <= set(KINDS)


@pytest.mark.parametrize("split", ["rl_train", "rl_heldout"])
def test_every_paraphrase_reads_back_to_its_canonical_spec(split):
    for item in paraphrase_set(split, 3, seed=5):
        spec = read_paraphrase(item.text)
        assert spec["tag"] == item.spec["tag"] == item.category
        assert spec["include"] == item.spec["include"], item.text
        assert spec.get("exclude") == item.spec.get("exclude")
        assert spec["prompt"] == item.canonical or _same_scenes(parse_caption(spec["prompt"]), item.spec)


def test_each_kind_changes_the_caption_as_named():
    prompt = next(p for p in prompts_for("rl_train", "position"))
    verbose = paraphrase(prompt, 0, 0, kinds=("verbose",))
    assert verbose.text.endswith(prompt.caption[len("a photo of ") :]) or prompt.caption in verbose.text
    order = paraphrase(prompt, 0, 0, kinds=("order",))
    assert order.text.endswith(" it") and " with " in order.text
    counting = prompts_for("rl_train", "counting")[0]
    synonym = paraphrase(counting, 0, 0, kinds=("synonym",))
    assert (
        synonym.text != counting.caption
        and read_paraphrase(synonym.text)["include"] == counting.spec["include"]
    )


def test_read_paraphrase_keeps_parse_captions_reading_and_refuses_other_text():
    assert read_paraphrase("A photo of a red circle.") == parse_caption("A photo of a red circle.")
    with pytest.raises(CaptionParseError):
        read_paraphrase("i would like to see a cat")


def test_shapes_eval_scores_a_paraphrased_prompt_by_its_spec():
    items = paraphrase_set("rl_heldout", 1, seed=0)[:12]
    rng = np.random.default_rng(0)
    images = render_scenes([scene_for_spec(item.spec, rng) for item in items], 64)
    reward = load_reward("shapes_eval")
    from_text = reward(images, [item.text for item in items])
    from_specs = reward(images, [item.text for item in items], specs=[item.spec for item in items])
    assert from_text.details["unparsed_count"] == 0
    assert from_text.scores.tolist() == from_specs.scores.tolist()
    assert from_text.scores.mean() > 0.8


def test_shipped_prompt_files_are_up_to_date(tmp_path):
    written = write_paraphrase_files(tmp_path)
    for key, path in written.items():
        shipped = ROOT / "configs" / "prompts" / path.name
        assert shipped.read_text() == path.read_text(), f"regenerate {shipped} with write_paraphrase_files()"
        assert key.startswith(("rl_train", "rl_heldout"))
    assert len(written["rl_train_balanced"].read_text().splitlines()) == 3 + 6 * 40
