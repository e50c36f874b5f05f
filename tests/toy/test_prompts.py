"""Prompt sets: the train / held-out split, the RL sets inside it, scenes sampled for prompts, JSONL files."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from genalign.toy.captions import CATEGORIES
from genalign.toy.prompts import (
    HELDOUT_COLOUR_SHAPES,
    HELDOUT_COUNTS,
    HELDOUT_RELATIONS,
    RL_TRAIN_PROMPT_FILE,
    PromptSpec,
    all_prompts,
    balanced_prompts,
    export_prompt_sets,
    heldout_prompts,
    prompts_for,
    read_jsonl,
    rl_heldout_prompts,
    rl_train_prompt_file,
    rl_train_prompts,
    sample_scene_for_prompt,
    scene_for_spec,
    scene_key,
    train_prompts,
    unseen_combination_prompts,
    write_jsonl,
    write_rl_train_prompt_file,
)
from genalign.toy.scenes import render_scene
from genalign.toy.shapes_eval import check_spec


def test_split_is_a_partition_and_deterministic():
    train, heldout = train_prompts(), heldout_prompts()
    captions = [p.caption for p in all_prompts()]
    assert len(captions) == len(set(captions)) == 608
    assert not {p.caption for p in train} & {p.caption for p in heldout}
    assert sorted(p.caption for p in train + heldout) == sorted(captions)
    assert [p.caption for p in train_prompts()] == [p.caption for p in train]
    assert set(Counter(p.category for p in train)) == set(CATEGORIES)
    assert set(Counter(p.category for p in heldout)) == set(CATEGORIES) - {"single_object"}


def test_heldout_combinations_never_appear_in_train():
    for prompt in train_prompts():
        include = prompt.spec["include"]
        for clause in include:
            assert (clause.get("color"), clause["class"]) not in HELDOUT_COLOUR_SHAPES
        if prompt.category == "counting":
            assert (include[0]["class"], include[0]["count"]) not in HELDOUT_COUNTS
        if prompt.category == "position":
            target, subject = include
            triple = (subject["class"], subject["position"][0], target["class"])
            assert triple not in HELDOUT_RELATIONS
        if prompt.category == "two_object":
            assert {c["class"] for c in include} != {"triangle", "diamond"}
    # a colour-attribution combination is held out in both word orders
    heldout = {p.caption for p in heldout_prompts()}
    for prompt in heldout_prompts():
        if prompt.category == "color_attr":
            first, second = prompt.caption.removeprefix("a photo of ").split(" and ")
            assert f"a photo of {second} and {first}" in heldout


def test_captions_match_their_scenes():
    """The ground-truth objects of every sampled scene satisfy the spec of its caption."""
    rng = np.random.default_rng(0)
    for category in CATEGORIES:
        for split in ("train", "heldout", "all"):
            if split == "heldout" and category == "single_object":
                continue
            for _ in range(60):
                scene, caption, spec = sample_scene_for_prompt(category, rng, split=split)
                assert spec["tag"] == category and spec["prompt"] == caption
                check = check_spec(scene.objects, spec)
                assert check.correct, (caption, scene, check.reasons)
                assert len(scene) == sum(c["count"] for c in spec["include"])  # nothing else


def test_train_sampling_never_returns_heldout_captions():
    heldout = {p.caption for p in heldout_prompts()}
    rng = np.random.default_rng(1)
    for category in CATEGORIES:
        for _ in range(40):
            assert sample_scene_for_prompt(category, rng)[1] not in heldout
    with pytest.raises(ValueError, match="single_object"):
        sample_scene_for_prompt("single_object", rng, split="heldout")


def test_scene_sampling_is_seeded():
    a = sample_scene_for_prompt("color_attr", 5)
    b = sample_scene_for_prompt("color_attr", np.random.default_rng(5))
    assert a == b
    prompt = train_prompts()[100]
    assert scene_for_spec(prompt, 3) == scene_for_spec(prompt.spec, 3)
    assert render_scene(scene_for_spec(prompt, 3)).equal(render_scene(scene_for_spec(prompt, 3)))


def test_jsonl_round_trip(tmp_path):
    prompts = heldout_prompts()
    path = write_jsonl(prompts, tmp_path / "heldout.jsonl")
    assert read_jsonl(path) == prompts
    paths = export_prompt_sets(tmp_path / "sets")
    assert read_jsonl(paths["train"]) == train_prompts()
    assert read_jsonl(paths["rl_heldout"]) == rl_heldout_prompts()
    assert read_jsonl(paths["unseen_combinations"]) == heldout_prompts()
    assert paths["rl_train_captions"].read_text().splitlines() == [p.caption for p in rl_train_prompts()]
    assert paths["train_captions"].read_text().splitlines() == [p.caption for p in train_prompts()]
    assert PromptSpec.from_spec(prompts[0].spec) == prompts[0]


# -- the RL sets --------------------------------------------------------------------------------------

# per-category counts the prompts module documents (its docstring's table)
RL_TRAIN_COUNTS = {
    "single_object": 2,
    "two_object": 6,
    "counting": 5,
    "colors": 12,
    "position": 20,
    "color_attr": 264,
}
RL_HELDOUT_COUNTS = {
    "single_object": 2,
    "two_object": 4,
    "counting": 5,
    "colors": 12,
    "position": 20,
    "color_attr": 48,
}


def test_rl_sets_are_disjoint_and_partition_the_pretraining_split():
    rl_train = {p.caption for p in rl_train_prompts()}
    rl_heldout = {p.caption for p in rl_heldout_prompts()}
    unseen = {p.caption for p in unseen_combination_prompts()}
    assert not rl_train & rl_heldout
    assert not (rl_train | rl_heldout) & unseen
    # both inside the generator's pretraining split, and together all of it
    assert rl_train | rl_heldout == {p.caption for p in train_prompts()}
    assert unseen == {p.caption for p in heldout_prompts()}
    assert prompts_for("unseen_combinations") == prompts_for("heldout")


def test_rl_sets_are_balanced_over_the_six_categories():
    assert Counter(p.category for p in rl_train_prompts()) == RL_TRAIN_COUNTS
    assert Counter(p.category for p in rl_heldout_prompts()) == RL_HELDOUT_COUNTS
    # the 40 held-out prompts, where the pretraining split has them: colour attribution
    # (312 train prompts); position has only 40 in the train split, half of them held out
    assert len(prompts_for("rl_heldout", "color_attr")) >= 40
    assert len(prompts_for("rl_heldout", "position")) == len(prompts_for("train", "position")) // 2 == 20


def test_rl_sets_are_deterministic_and_sorted():
    order = [(CATEGORIES.index(p.category), p.caption) for p in rl_heldout_prompts()]
    assert order == sorted(order)
    assert rl_heldout_prompts() == rl_heldout_prompts()
    # the assignment is a pure function of the captions: rebuild it from CRC-32 by hand
    import zlib

    for category in CATEGORIES:
        keys = sorted(
            {scene_key(p) for p in prompts_for("train", category)}, key=lambda k: (zlib.crc32(k.encode()), k)
        )
        expected = set(keys[: min(len(keys) // 2, 24)])
        assert {scene_key(p) for p in prompts_for("rl_heldout", category)} == expected


def test_captions_of_the_same_scenes_fall_in_the_same_rl_set():
    rl_heldout = {p.caption for p in rl_heldout_prompts()}
    rl_train = {p.caption for p in rl_train_prompts()}
    converse = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
    positions = 0
    for prompt in rl_heldout_prompts() + rl_train_prompts():
        same_set = rl_heldout if prompt.caption in rl_heldout else rl_train
        body = prompt.caption.removeprefix("a photo of ")
        if prompt.category == "position":
            for relation in sorted(converse, key=len, reverse=True):
                if f" {relation} " in body:
                    subject, target = body.split(f" {relation} ")
                    break
            assert f"a photo of {target} {converse[relation]} {subject}" in same_set, prompt.caption
            positions += 1
        if prompt.category in ("two_object", "color_attr"):
            first, second = body.split(" and ")
            assert f"a photo of {second} and {first}" in same_set, prompt.caption
    assert positions == 40


def test_rl_sets_sample_scenes():
    rng = np.random.default_rng(2)
    rl_heldout = {p.caption for p in rl_heldout_prompts()}
    for category in CATEGORIES:
        scene, caption, spec = sample_scene_for_prompt(category, rng, split="rl_heldout")
        assert caption in rl_heldout and check_spec(scene.objects, spec).correct


def test_balanced_prompts_repeat_small_categories_and_thin_large_ones():
    lines = balanced_prompts("rl_train", per_category=10)
    category_of = {p.caption: p.category for p in all_prompts()}
    by_category = Counter(category_of[line] for line in lines)
    assert by_category == dict.fromkeys(CATEGORIES, 10)
    single = Counter(
        line for line in lines if line in {p.caption for p in prompts_for("rl_train", "single_object")}
    )
    assert sorted(single.values()) == [5, 5]
    two_object = Counter(
        line for line in lines if line in {p.caption for p in prompts_for("rl_train", "two_object")}
    )
    assert sorted(two_object.values()) == [1, 1, 2, 2, 2, 2]  # 10 lines over 6 prompts, in turn
    colour_attr = [p.caption for p in prompts_for("rl_train", "color_attr")]
    assert [line for line in lines if line in colour_attr] == sorted(
        colour_attr[int(i * 26.4)] for i in range(10)
    )
    assert set(lines) <= {p.caption for p in rl_train_prompts()}
    with pytest.raises(ValueError, match="positive"):
        balanced_prompts(per_category=0)


def test_shipped_rl_train_prompt_file_is_what_the_function_writes(tmp_path):
    """configs/toy/rl_train_prompts.txt is generated; regenerate it with write_rl_train_prompt_file()."""
    assert RL_TRAIN_PROMPT_FILE.read_text(encoding="utf-8") == rl_train_prompt_file()
    written = write_rl_train_prompt_file(tmp_path / "prompts.txt", per_category=3)
    text = written.read_text(encoding="utf-8")
    assert text.startswith("# ") and "balanced_prompts('rl_train', 3)" in text
    prompts = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert prompts == balanced_prompts("rl_train", per_category=3) and len(prompts) == 18
