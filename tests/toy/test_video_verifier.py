"""The toy video verifier: ground-truth renders pass, wrong videos are rejected, from pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genalign.toy.scenes import Scene, SceneObject, render_scenes
from genalign.toy.video.captions import (
    VIDEO_CATEGORIES,
    motion_binding_spec,
    one_moving_spec,
    relation_motion_spec,
    single_motion_spec,
)
from genalign.toy.video.prompts import sample_video_for_prompt
from genalign.toy.video.scenes import MovingObject, VideoScene, render_video, render_videos
from genalign.toy.video.verifier import Track, evaluate_videos, track_objects, verify_video

SIZE = 48


def _video(*objects: MovingObject, frames: int = 8) -> torch.Tensor:
    return render_video(VideoScene(objects, frames), SIZE)


@pytest.fixture(scope="module")
def ground_truth():
    """150 train-split and 50 unseen-combination videos per category, rendered at 48 px."""
    rng = np.random.default_rng(2026)
    scenes, specs = [], []
    for split, count in (("train", 150), ("unseen_combinations", 50)):
        for category in VIDEO_CATEGORIES:
            for _ in range(count):
                scene, _, spec = sample_video_for_prompt(category, rng, split)
                scenes.append(scene)
                specs.append(spec)
    return render_videos(scenes, SIZE), specs


def test_ground_truth_renders_are_verified_correct(ground_truth):
    videos, specs = ground_truth
    result = evaluate_videos(videos, specs)
    assert set(result["per_category"]) == set(VIDEO_CATEGORIES)
    for category, accuracy in result["per_category"].items():
        assert accuracy >= 0.98, (
            category,
            [s["reasons"] for s in result["per_sample"] if not s["correct"]][:5],
        )
    assert result["counts"] == dict.fromkeys(VIDEO_CATEGORIES, 200)
    assert result["mean_fraction"] >= 0.99


def test_a_missed_frame_does_not_break_a_correct_video(ground_truth):
    """Tracks bridge a gap and relations need a majority of frames, not all of them."""
    videos, specs = ground_truth
    for index in range(0, 800, 100):  # every category
        video = videos[index].clone()
        video[3] = 1.0  # a blank white frame
        assert verify_video(video, specs[index]).correct, specs[index]["prompt"]


def test_rejects_wrong_direction_with_partial_credit():
    spec = single_motion_spec("red", "circle", "right")
    assert verify_video(_video(MovingObject("circle", "red", 0.3, 0.5, 0.25, "right", 0.03)), spec).correct
    check = verify_video(_video(MovingObject("circle", "red", 0.7, 0.5, 0.25, "left", 0.03)), spec)
    assert (
        not check.correct and check.clauses[0]["motion"] is False and check.clauses[0]["motions"] == ["left"]
    )
    assert (check.passed, check.total) == (2, 3) and check.fraction == pytest.approx(2 / 3)
    assert "found left" in check.reasons[0]
    falling = verify_video(_video(MovingObject("circle", "red", 0.5, 0.3, 0.25, "down", 0.03)), spec)
    assert falling.clauses[0]["motions"] == ["down"] and not falling.correct


def test_rejects_a_static_object_when_motion_is_asked():
    spec = single_motion_spec("blue", "square", "up")
    check = verify_video(_video(MovingObject("square", "blue", 0.5, 0.5, 0.25)), spec)
    assert not check.correct and check.clauses[0]["motions"] == ["static"]
    # and a moving one when standing still is asked
    still = single_motion_spec("blue", "square", "static")
    assert verify_video(_video(MovingObject("square", "blue", 0.5, 0.5, 0.25)), still).correct
    moving = verify_video(_video(MovingObject("square", "blue", 0.5, 0.7, 0.25, "up", 0.03)), still)
    assert not moving.correct and moving.clauses[0]["motions"] == ["up"]


def test_rejects_wrong_colour_and_wrong_shape():
    spec = single_motion_spec("red", "circle", "right")
    check = verify_video(_video(MovingObject("circle", "blue", 0.3, 0.5, 0.25, "right", 0.03)), spec)
    assert not check.correct and check.clauses[0]["colour"] is False and "blue" in check.reasons[0]
    check = verify_video(_video(MovingObject("triangle", "red", 0.3, 0.5, 0.25, "right", 0.03)), spec)
    assert not check.correct and check.clauses[0]["present"] is False


def test_rejects_a_missing_object_and_a_wrong_mover():
    spec = one_moving_spec("red", "circle", "right", "blue", "square")
    mover = MovingObject("circle", "red", 0.25, 0.25, 0.22, "right", 0.03)
    still = MovingObject("square", "blue", 0.5, 0.75, 0.22)
    assert verify_video(_video(mover, still), spec).correct
    check = verify_video(_video(mover), spec)
    assert not check.correct and check.clauses[1]["present"] is False and check.clauses[0]["motion"] is True
    # the wrong object moves: both motion checks fail
    swapped = (
        MovingObject("circle", "red", 0.25, 0.25, 0.22),
        MovingObject("square", "blue", 0.3, 0.75, 0.22, "right", 0.03),
    )
    check = verify_video(_video(*swapped), spec)
    assert [c["motion"] for c in check.clauses] == [False, False]
    # the verifier checks any clauses of the grammar's words, not only its categories' forms
    reversed_spec = {
        **spec,
        "include": [spec["include"][0] | {"motion": "static"}, spec["include"][1] | {"motion": "right"}],
    }
    assert verify_video(_video(*swapped), reversed_spec).correct


def test_rejects_swapped_colour_motion_binding():
    spec = motion_binding_spec("red", "circle", "left", "blue", "circle", "up")
    red_left = MovingObject("circle", "red", 0.7, 0.25, 0.22, "left", 0.03)
    blue_up = MovingObject("circle", "blue", 0.5, 0.75, 0.22, "up", 0.03)
    assert verify_video(_video(red_left, blue_up), spec).correct
    red_up = MovingObject("circle", "red", 0.25, 0.7, 0.22, "up", 0.03)
    blue_left = MovingObject("circle", "blue", 0.75, 0.25, 0.22, "left", 0.03)
    check = verify_video(_video(red_up, blue_left), spec)
    assert not check.correct and [c["motion"] for c in check.clauses] == [False, False]


def test_relations_need_a_majority_of_frames():
    spec = relation_motion_spec("blue", "square", "left of", "green", "triangle", "right")
    target = MovingObject("triangle", "green", 0.6, 0.75, 0.2)
    kept = MovingObject("square", "blue", 0.15, 0.7, 0.2, "right", 0.02)  # ends at x = 0.29, still left
    assert verify_video(_video(kept, target), spec).correct
    # starts left of the triangle (the first frame would pass) and drifts past it above
    drifting = MovingObject("square", "blue", 0.15, 0.3, 0.2, "right", 0.1)
    check = verify_video(_video(drifting, target), spec)
    assert not check.correct and check.clauses[1]["position"] is False and check.clauses[1]["motion"] is True
    # the mirrored layout: right of, never left of
    mirrored = MovingObject("square", "blue", 0.75, 0.35, 0.2, "right", 0.02)
    check = verify_video(_video(mirrored, MovingObject("triangle", "green", 0.3, 0.4, 0.2)), spec)
    assert not check.correct and check.clauses[1]["position"] is False


def test_oblique_motion_matches_no_direction():
    frames = [
        Scene((SceneObject("circle", "red", 0.25 + 0.05 * t, 0.25 + 0.05 * t, 0.22),)) for t in range(8)
    ]
    video = render_scenes(frames, SIZE, backend="skia")
    check = verify_video(video, single_motion_spec("red", "circle", "right"))
    assert not check.correct and check.clauses[0]["motions"] == ["oblique"]


def test_tracks_and_motion_from_known_boxes():
    track = Track(
        "circle", "red", [0, 1, 2, 3], [(0.1 + 0.02 * t, 0.5, 0.3 + 0.02 * t, 0.7) for t in range(4)]
    )
    assert track.velocity == pytest.approx((0.02, 0.0)) and track.motion == "right"
    assert Track("circle", "red", [0, 2], [(0.1, 0.5, 0.3, 0.7), (0.1, 0.5, 0.3, 0.7)]).motion == "static"
    # two same-looking objects are kept apart by nearest centre; a far jump starts a new track
    frames = [
        [
            SceneObject("square", "red", 0.2, 0.2 + 0.03 * t, 0.2),
            SceneObject("square", "red", 0.8, 0.8 - 0.03 * t, 0.2),
        ]
        for t in range(5)
    ]
    tracks = track_objects(frames)
    assert sorted(t.motion for t in tracks) == ["down", "up"] and all(len(t.frames) == 5 for t in tracks)
    jumpy = track_objects(
        [[SceneObject("square", "red", 0.2, 0.2, 0.2)], [SceneObject("square", "red", 0.8, 0.8, 0.2)]]
    )
    assert len(jumpy) == 2


def test_input_errors_name_the_value():
    with pytest.raises(ValueError, match=r"\[F, 3, H, W\]"):
        verify_video(torch.ones(3, 48, 48), single_motion_spec("red", "circle", "right"))
    spec = single_motion_spec("red", "circle", "right")
    spec["include"][0]["motion"] = "diagonal"
    with pytest.raises(ValueError, match="'diagonal'"):
        verify_video(torch.ones(8, 3, 48, 48), spec)
    with pytest.raises(ValueError, match="2 videos but 1 specs"):
        evaluate_videos(torch.ones(2, 8, 3, 48, 48), [single_motion_spec("red", "circle", "right")])


def test_toy_video_eval_reward_from_specs_and_from_prompts():
    from genalign.rewards import load_reward

    reward = load_reward("toy_video_eval")
    right = _video(MovingObject("circle", "red", 0.3, 0.5, 0.25, "right", 0.03))
    left = _video(MovingObject("circle", "red", 0.7, 0.5, 0.25, "left", 0.03))
    videos = torch.stack([right, left, right])
    prompts = ["a red circle moving right", "a red circle moving right", "a red circle flying"]
    out = reward(videos, prompts)
    assert out.scores.tolist() == [1.0, 0.0, 0.0] and out.details["unparsed_count"] == 1
    assert out.details["tracks"][1][0]["motion"] == "left"
    partial = load_reward("toy_video_eval", partial=True)
    specs = [single_motion_spec("red", "circle", "right")] * 3
    assert partial(videos, prompts, specs=specs).scores.tolist() == pytest.approx([1.0, 2 / 3, 1.0])
    with pytest.raises(ValueError, match=r"\[B, F, 3, H, W\], got \(8, 3, 48, 48\)"):
        reward(right, ["a red circle moving right"])  # a single video, not a batch
