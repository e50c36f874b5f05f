"""The toy video world (issue #26 item 6): moving shapes, motion captions, the video verifier.

- ``scenes``: :class:`VideoScene` / :class:`MovingObject` (the toy world's shapes with a constant
  axis-aligned motion), random layouts that keep objects apart and inside the canvas on every
  frame, rendering to ``[F, 3, H, W]`` / ``[B, F, 3, H, W]`` in [0, 1] (the ``ar_video`` layout).
- ``captions``: four categories (single object moving, one of two moving, relation plus motion,
  colour-motion binding), specs with ``motion`` clauses, validation and a caption parser.
- ``prompts``: the enumerated grammar, the splits (train, unseen combinations, balanced RL sets)
  and video scenes sampled for a prompt.
- ``verifier``: detection per frame, tracking, motion from centroid slopes and spec checks.
- ``data``: ``(frames, caption)`` pairs for training a toy video generator.
- ``reward``: the verifier as the ``toy_video_eval`` reward (registered lazily in
  :mod:`genalign.rewards`), a reward or a monitor.

    >>> from genalign.toy.video import sample_video_for_prompt, render_video, verify_video
    >>> scene, caption, spec = sample_video_for_prompt("relation_motion", rng=0)
    >>> verify_video(render_video(scene), spec).correct
    True
"""

from __future__ import annotations

from genalign.toy.video.captions import (
    MOTION_PHRASES,
    VIDEO_CATEGORIES,
    parse_video_caption,
    validate_video_spec,
    video_caption_for_spec,
)
from genalign.toy.video.data import toy_video_dataset
from genalign.toy.video.prompts import (
    VIDEO_SPLITS,
    VideoPromptSpec,
    all_video_prompts,
    is_video_heldout,
    sample_video_for_prompt,
    video_prompts_for,
    video_scene_for_spec,
)
from genalign.toy.video.scenes import (
    DIRECTIONS,
    MOTIONS,
    MovingObject,
    VideoScene,
    layout_moving_objects,
    render_video,
    render_videos,
)
from genalign.toy.video.verifier import (
    Track,
    VideoSpecCheck,
    VideoVerifierConfig,
    check_video_spec,
    detect_video,
    evaluate_videos,
    scene_tracks,
    track_objects,
    verify_video,
)

__all__ = [
    "DIRECTIONS",
    "MOTIONS",
    "MOTION_PHRASES",
    "VIDEO_CATEGORIES",
    "VIDEO_SPLITS",
    "MovingObject",
    "Track",
    "VideoPromptSpec",
    "VideoScene",
    "VideoSpecCheck",
    "VideoVerifierConfig",
    "all_video_prompts",
    "check_video_spec",
    "detect_video",
    "evaluate_videos",
    "is_video_heldout",
    "layout_moving_objects",
    "parse_video_caption",
    "render_video",
    "render_videos",
    "sample_video_for_prompt",
    "scene_tracks",
    "toy_video_dataset",
    "track_objects",
    "validate_video_spec",
    "verify_video",
    "video_caption_for_spec",
    "video_prompts_for",
    "video_scene_for_spec",
]
