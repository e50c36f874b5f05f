"""The toy video world: moving scenes, motion captions and specs, prompt splits, the data API."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from genalign.toy.captions import CaptionParseError
from genalign.toy.scenes import GAP, MARGIN, render_scene
from genalign.toy.video.captions import (
    VIDEO_CATEGORIES,
    motion_binding_spec,
    one_moving_spec,
    parse_video_caption,
    relation_motion_spec,
    single_motion_spec,
    validate_video_spec,
)
from genalign.toy.video.data import toy_video_dataset
from genalign.toy.video.prompts import (
    HELDOUT_MOVERS,
    RL_HELDOUT_PER_CATEGORY,
    RL_TRAIN_PER_CATEGORY,
    all_video_prompts,
    sample_video_for_prompt,
    video_prompts_for,
    video_scene_for_spec,
    video_scene_key,
)
from genalign.toy.video.scenes import (
    MovingObject,
    VideoScene,
    layout_moving_objects,
    render_video,
    render_videos,
)
from genalign.toy.video.verifier import check_video_spec, evaluate_videos, scene_tracks

# -- scenes ---------------------------------------------------------------------------------------


def test_moving_object_positions_and_validation():
    obj = MovingObject("circle", "red", 0.3, 0.5, 0.2, "right", 0.03)
    assert obj.at(0).x == pytest.approx(0.3) and obj.at(4).x == pytest.approx(0.42)
    assert obj.at(4).y == pytest.approx(0.5)
    falling = MovingObject("square", "blue", 0.5, 0.2, 0.2, "down", 0.04)
    assert falling.at(5).y == pytest.approx(0.4)  # y points down
    with pytest.raises(ValueError, match="'sideways'"):
        MovingObject("circle", "red", 0.5, 0.5, 0.2, "sideways", 0.03)
    with pytest.raises(ValueError, match="speed 0.0"):
        MovingObject("circle", "red", 0.5, 0.5, 0.2, "left", 0.0)
    with pytest.raises(ValueError, match="speed 0.03"):
        MovingObject("circle", "red", 0.5, 0.5, 0.2, "static", 0.03)
    with pytest.raises(ValueError, match="'pink'"):
        MovingObject("circle", "pink", 0.5, 0.5, 0.2)
    with pytest.raises(ValueError, match="num_frames=1"):
        VideoScene((obj,), num_frames=1)
    with pytest.raises(ValueError, match="'sideways'"):
        layout_moving_objects(0, [("circle", "red", "sideways")])


def test_layouts_stay_inside_and_apart_on_every_frame():
    rng = np.random.default_rng(1)
    for category in VIDEO_CATEGORIES:
        for _ in range(40):
            scene, _, spec = sample_video_for_prompt(category, rng)
            assert [o.motion for o in scene.objects] == [c.get("motion", "static") for c in spec["include"]]
            for t in range(scene.num_frames):
                boxes = [obj.box for obj in scene.frame(t).objects]
                assert all(MARGIN - 1e-6 <= v <= 1 - MARGIN + 1e-6 for box in boxes for v in box)
                if len(boxes) == 2:
                    a, b = boxes
                    assert (
                        a[2] + GAP <= b[0] + 1e-9
                        or b[2] + GAP <= a[0] + 1e-9
                        or a[3] + GAP <= b[1] + 1e-9
                        or b[3] + GAP <= a[1] + 1e-9
                    )


def test_rendering_layout_and_determinism():
    spec = relation_motion_spec("blue", "square", "above", "green", "triangle", "down")
    scene = video_scene_for_spec(spec, rng=5, num_frames=6)
    assert scene == video_scene_for_spec(spec, rng=5, num_frames=6)
    assert scene != video_scene_for_spec(spec, rng=6, num_frames=6)
    assert VideoScene.from_dict(scene.to_dict()) == scene
    video = render_video(scene, size=32)
    assert video.shape == (6, 3, 32, 32) and 0 <= video.min() and video.max() <= 1
    torch.testing.assert_close(video[3], render_scene(scene.frame(3), 32, backend="skia"))
    assert not torch.equal(video[0], video[-1])  # the square moved
    batch = render_videos([scene, scene], size=32)
    assert batch.shape == (2, 6, 3, 32, 32)  # [B, F, 3, H, W], the ar_video layout
    with pytest.raises(ValueError, match="frame count"):
        render_videos([scene, video_scene_for_spec(spec, 5, num_frames=4)])


# -- captions and specs ---------------------------------------------------------------------------


def test_captions_of_every_category():
    assert single_motion_spec("red", "circle", "right")["prompt"] == "a red circle moving right"
    assert single_motion_spec("orange", "diamond", "static")["prompt"] == "an orange diamond standing still"
    spec = relation_motion_spec("blue", "square", "above", "green", "triangle", "down")
    assert spec["prompt"] == "a blue square above a green triangle, falling"
    target, subject = spec["include"]
    assert subject == {
        "class": "square",
        "count": 1,
        "color": "blue",
        "motion": "down",
        "position": ["above", 0],
    }
    assert "motion" not in target  # the caption says nothing of the target's motion
    assert (
        one_moving_spec("red", "circle", "up", "blue", "square")["prompt"]
        == "a red circle rising and a blue square standing still"
    )
    assert (
        motion_binding_spec("red", "circle", "left", "blue", "circle", "right")["prompt"]
        == "a red circle moving left and a blue circle moving right"
    )


def test_parser_reads_every_caption_back_and_variants():
    for prompt in all_video_prompts()[::7]:
        assert parse_video_caption(prompt.caption) == prompt.spec
    spec = parse_video_caption("A Red circle moving up.")
    assert spec["include"] == [{"class": "circle", "count": 1, "color": "red", "motion": "up"}]
    spec = parse_video_caption("a blue square to the left of a green triangle moving down")
    assert spec["tag"] == "relation_motion" and spec["include"][1]["position"] == ["left of", 0]
    for bad, word in [
        ("a red circle moving sideways", "moving sideways"),
        ("a pink circle moving left", "pink"),
        ("a red star moving left", "star"),
        ("a red circle moving left and a blue square moving left", "different directions"),
    ]:
        with pytest.raises(CaptionParseError, match=word):
            parse_video_caption(bad)


def test_validation_names_the_value_at_fault():
    good = single_motion_spec("red", "circle", "right")
    cases = [
        ({"include": [good["include"][0] | {"motion": "sideways"}]}, "'sideways'"),
        ({"include": [good["include"][0] | {"count": 2}]}, "count 2"),
        ({"include": [good["include"][0] | {"speed": 3}]}, "speed"),
        ({"tag": "counting"}, "'counting'"),
        ({"exclude": [{"class": "circle", "count": 2}]}, "exclude"),
        ({"include": [{"class": "circle", "count": 1, "color": "red"}]}, "single_motion"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            validate_video_spec(good | change)
    binding = motion_binding_spec("red", "circle", "left", "blue", "square", "up")
    binding["include"][1]["motion"] = "left"
    with pytest.raises(ValueError, match="different directions"):
        validate_video_spec(binding)


# -- splits ---------------------------------------------------------------------------------------


def triples(prompt):
    return {(c.get("color"), c["class"], c.get("motion")) for c in prompt.spec["include"]}


def test_pretraining_split_partitions_the_grammar_and_holds_out_combinations():
    everything = [p.caption for p in all_video_prompts()]
    assert len(everything) == len(set(everything)) == 140 + 2016 + 8064 + 8064
    train, unseen = video_prompts_for("train"), video_prompts_for("unseen_combinations")
    assert not {p.caption for p in train} & {p.caption for p in unseen}
    assert sorted(p.caption for p in train + unseen) == sorted(everything)
    assert [p.caption for p in video_prompts_for("heldout")] == [p.caption for p in unseen]
    assert not any(triples(p) & HELDOUT_MOVERS for p in train)
    assert HELDOUT_MOVERS <= set().union(*(triples(p) for p in unseen))
    assert set(Counter(p.category for p in unseen)) == set(VIDEO_CATEGORIES)
    # word-order twins (the same videos) never straddle the split
    keys = {video_scene_key(p) for p in train}
    assert not any(video_scene_key(p) in keys for p in unseen)


def test_rl_sets_are_disjoint_balanced_inside_train_and_deterministic():
    train = {p.caption for p in video_prompts_for("train")}
    rl_train, rl_heldout = video_prompts_for("rl_train"), video_prompts_for("rl_heldout")
    assert Counter(p.category for p in rl_train) == dict.fromkeys(VIDEO_CATEGORIES, RL_TRAIN_PER_CATEGORY)
    assert Counter(p.category for p in rl_heldout) == dict.fromkeys(VIDEO_CATEGORIES, RL_HELDOUT_PER_CATEGORY)
    assert {p.caption for p in rl_train} <= train and {p.caption for p in rl_heldout} <= train
    assert not {video_scene_key(p) for p in rl_train} & {video_scene_key(p) for p in rl_heldout}
    assert [p.caption for p in video_prompts_for("rl_heldout")] == [p.caption for p in rl_heldout]
    with pytest.raises(ValueError, match="'validation'"):
        video_prompts_for("validation")
    with pytest.raises(ValueError, match="'counting'"):
        video_prompts_for("train", "counting")


def test_sampled_videos_satisfy_their_specs_in_ground_truth():
    rng = np.random.default_rng(0)
    for split in ("train", "unseen_combinations", "rl_heldout"):
        for category in VIDEO_CATEGORIES:
            for _ in range(25):
                scene, caption, spec = sample_video_for_prompt(category, rng, split)
                assert spec["prompt"] == caption and spec["tag"] == category
                check = check_video_spec(scene_tracks(scene), spec, scene.num_frames)
                assert check.correct, (caption, check.reasons)


# -- data API -------------------------------------------------------------------------------------


def test_toy_video_dataset_layout_determinism_and_train_only():
    videos, captions = toy_video_dataset(10, seed=3, frames=6, size=32)
    assert videos.shape == (10, 6, 3, 32, 32) and videos.dtype == torch.uint8
    again, captions_again = toy_video_dataset(10, seed=3, frames=6, size=32)
    assert torch.equal(videos, again) and captions == captions_again
    assert toy_video_dataset(10, seed=4, frames=6, size=32)[1] != captions
    assert set(captions) <= {p.caption for p in video_prompts_for("train")}
    assert toy_video_dataset(0)[0].shape == (0, 8, 3, 48, 48)
    with pytest.raises(ValueError, match="caption_noise"):
        toy_video_dataset(2, caption_noise=1.5)
    with pytest.raises(ValueError, match="frames"):
        toy_video_dataset(2, frames=1)


def test_caption_noise_makes_captions_loose():
    specs = {p.caption: p.spec for p in video_prompts_for("train")}
    accuracy = {}
    for noise in (0.0, 1.0):
        videos, captions = toy_video_dataset(16, seed=0, caption_noise=noise)
        accuracy[noise] = evaluate_videos(videos.float() / 255, [specs[c] for c in captions])[
            "video_accuracy"
        ]
    assert accuracy[0.0] == 1.0
    assert accuracy[1.0] < 0.5
