"""The toy video verifier: recover objects and their motion from frames and check a video spec.

From the frames alone (``[F, 3, H, W]`` in [0, 1], the ``ar_video`` layout per video):

1. **Detect** every frame with the image world's detector (``genalign.toy.detection``); objects
   of no shape or no colour are dropped (they can satisfy no clause).
2. **Track** (:func:`track_objects`): frame by frame, each detection joins the track of the same
   colour and shape whose last centre is nearest, within ``max_jump`` canvas sides per frame
   since that track was last seen (pairs taken greedily, nearest first); the rest start new
   tracks. A track missing a frame keeps its identity, so a one-frame miss or misreading does
   not split an object. Only tracks present on a majority of frames (more than half) count as
   objects: a one-frame misreading is a short track and is ignored.
3. **Motion** (:attr:`Track.motion`): least-squares slopes of the box centre's x and y against the
   frame index give a velocity in canvas sides per frame. Below ``static_speed`` the object is
   ``"static"``; otherwise its direction is the dominant axis's sign (``right`` / ``left`` /
   ``down`` / ``up``, y pointing down) when that component is at least ``axis_ratio`` times the
   other, else ``"oblique"`` (matches no direction: ground-truth motion is axis-aligned).
4. **Check** (:func:`check_video_spec`), ShapesEval's rules per include clause, one atomic check
   each for presence (a track of the clause's shape), colour, motion and relation when the clause
   states them; tracks are narrowed in that order, and a relation is checked against the tracks
   that met the target clause.

**Relations are read on a majority of frames** (GenEval's rule, ``scenes.relative_position``,
on more than half of the video's frames, each frame where both objects are seen counting once):
a caption describes the whole clip, so a generator that starts in the relation and drifts out of
it should fail, which reading the first frame alone would pass; requiring every frame would fail
a correct video on one misdetected frame. The sampler keeps ground-truth relations on every
frame with a stricter margin, so ground truth passes under any of the three rules.

The verdict (:class:`VideoSpecCheck`) gives 0/1 correctness, passed / total atomic checks (a
fraction for partial credit) and per-clause results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from genalign.toy.captions import Spec
from genalign.toy.detection import ShapesEvalConfig, detect_objects
from genalign.toy.scenes import json_record, relative_position
from genalign.toy.shapes_eval import CheckTally, SpecCheck, verdict_summary
from genalign.toy.video.captions import VIDEO_CATEGORIES, validate_video_spec
from genalign.toy.video.scenes import VideoScene

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class VideoVerifierConfig:
    """Thresholds of the video verifier (module docstring).

    Attributes:
        detector: the per-frame detector's thresholds.
        max_jump: largest centre displacement of a track per frame, in canvas sides (the sampler's
            fastest object moves 0.04).
        static_speed: speed (canvas sides per frame) below which an object is static (ground-truth
            movers move at least 0.025; at 48 px this is 0.38 px per frame).
        axis_ratio: the dominant velocity component must be this many times the other for a
            direction, else the motion is ``"oblique"``.
    """

    detector: ShapesEvalConfig = field(default_factory=ShapesEvalConfig)
    max_jump: float = 0.15
    static_speed: float = 0.008
    axis_ratio: float = 2.0


@dataclass
class Track:
    """One object followed across frames: its colour and shape, the frames it was seen on and its
    boxes there (canvas fractions, ``(x0, y0, x1, y1)``, y down)."""

    shape: str
    colour: str
    frames: list[int]
    boxes: list[Box]
    config: VideoVerifierConfig = field(default_factory=VideoVerifierConfig, repr=False)

    @property
    def centres(self) -> np.ndarray:
        """Box centres ``[n, 2]`` (x, y) in canvas fractions."""
        boxes = np.asarray(self.boxes, dtype=float).reshape(-1, 4)
        return (boxes[:, :2] + boxes[:, 2:]) / 2

    @property
    def velocity(self) -> tuple[float, float]:
        """Least-squares slope of the centre against the frame index (canvas sides per frame);
        ``(0, 0)`` for a track seen on one frame."""
        if len(set(self.frames)) < 2:
            return (0.0, 0.0)
        frames = np.asarray(self.frames, dtype=float)
        centred = frames - frames.mean()
        slopes = centred @ (self.centres - self.centres.mean(axis=0)) / (centred @ centred)
        return (float(slopes[0]), float(slopes[1]))

    @property
    def motion(self) -> str:
        """``"static"``, ``"left"``, ``"right"``, ``"up"``, ``"down"`` or ``"oblique"``."""
        vx, vy = self.velocity
        if np.hypot(vx, vy) < self.config.static_speed:
            return "static"
        major, minor = max(abs(vx), abs(vy)), min(abs(vx), abs(vy))
        if major < self.config.axis_ratio * minor:
            return "oblique"
        if abs(vx) >= abs(vy):
            return "right" if vx > 0 else "left"
        return "down" if vy > 0 else "up"

    def box_at(self, frame: int) -> Box | None:
        return self.boxes[self.frames.index(frame)] if frame in self.frames else None

    def to_dict(self) -> dict[str, Any]:
        return json_record(self, "shape", "colour", "frames", "motion", "velocity")


def track_objects(
    frame_objects: Sequence[Sequence[Any]],
    canvas: tuple[int, int] = (1, 1),
    config: VideoVerifierConfig | None = None,
) -> list[Track]:
    """Link per-frame objects into tracks (module docstring, step 2).

    ``frame_objects[t]``: objects with ``shape``, ``colour`` and ``box`` (``DetectedObject`` or
    ``scenes.SceneObject``); boxes in pixels of a ``canvas = (height, width)`` image (``(1, 1)``
    for boxes already in canvas fractions). Objects of no shape or colour are dropped.
    """
    config = config or VideoVerifierConfig()
    height, width = canvas
    scale = np.array([width, height, width, height], dtype=float)
    tracks: list[Track] = []
    for t, objects in enumerate(frame_objects):
        found = [
            (obj.shape, obj.colour, tuple(float(v) for v in np.asarray(obj.box, dtype=float) / scale))
            for obj in objects
            if obj.shape is not None and obj.colour is not None
        ]
        pairs = []
        for d, (shape, colour, box) in enumerate(found):
            centre = np.array([(box[0] + box[2]) / 2, (box[1] + box[3]) / 2])
            for k, track in enumerate(tracks):
                if (track.shape, track.colour) != (shape, colour):
                    continue
                distance = float(np.hypot(*(centre - track.centres[-1])))
                if distance <= config.max_jump * (t - track.frames[-1]):
                    pairs.append((distance, d, k))
        used_detections, used_tracks = set(), set()
        for _, d, k in sorted(pairs):
            if d in used_detections or k in used_tracks:
                continue
            used_detections.add(d)
            used_tracks.add(k)
            tracks[k].frames.append(t)
            tracks[k].boxes.append(found[d][2])
        for d, (shape, colour, box) in enumerate(found):
            if d not in used_detections:
                tracks.append(Track(shape, colour, [t], [box], config))
    return tracks


def detect_video(video: torch.Tensor, config: VideoVerifierConfig | None = None) -> list[Track]:
    """Tracks of a video ``[F, 3, H, W]`` in [0, 1] (detection on every frame, then tracking)."""
    config = config or VideoVerifierConfig()
    if video.ndim != 4 or video.shape[1] != 3:
        raise ValueError(f"a video is [F, 3, H, W], got shape {tuple(video.shape)}")
    frames = [detect_objects(frame, config.detector) for frame in video]
    return track_objects(frames, (int(video.shape[2]), int(video.shape[3])), config)


def scene_tracks(scene: VideoScene, config: VideoVerifierConfig | None = None) -> list[Track]:
    """The ground-truth tracks of a video scene (no rendering): what a perfect detector sees."""
    return track_objects([frame.objects for frame in scene.frames()], (1, 1), config)


# -- checking ----------------------------------------------------------------------------------------


@dataclass
class VideoSpecCheck(SpecCheck):
    """The verdict on one video (:class:`~genalign.toy.shapes_eval.SpecCheck`'s fields) and
    ``clauses[i]``, clause i's results (``present``, ``colour``, ``motion``, ``position``: True /
    False, or None when not asked) and ``motions`` (the motions read for the clause's shape and
    colour)."""

    clauses: list[dict[str, Any]] = field(default_factory=list)


def _relation_frames(subject: Track, target: Track, relation: str, threshold: float) -> int:
    """Frames on which ``subject`` stands in ``relation`` to ``target``."""
    count = 0
    for frame, box in zip(subject.frames, subject.boxes):
        other = target.box_at(frame)
        count += other is not None and relation in relative_position(box, other, threshold)
    return count


def check_video_spec(
    tracks: Sequence[Track], spec: Spec, num_frames: int, config: VideoVerifierConfig | None = None
) -> VideoSpecCheck:
    """Check tracks of a ``num_frames``-frame video against a video spec (module docstring, step 4).

    The spec's words and indices are validated, not its category's form: any clauses of the
    grammar's words can be checked (say, both objects of a ``one_moving`` spec moving)."""
    config = config or VideoVerifierConfig()
    validate_video_spec(spec, form=False)
    majority = num_frames // 2 + 1
    objects = [track for track in tracks if len(set(track.frames)) >= majority]
    tally = CheckTally()
    record = tally.record
    clauses: list[dict[str, Any]] = []
    matched_groups: list[list[Track]] = []

    for clause in spec["include"]:
        shape, colour, motion = clause["class"], clause.get("color"), clause.get("motion")
        result: dict[str, Any] = {"present": None, "colour": None, "motion": None, "position": None}
        candidates = [track for track in objects if track.shape == shape]
        result["present"] = record(bool(candidates), f"expected a {shape}, found none")
        if colour is not None:
            found = ", ".join(sorted(track.colour for track in candidates)) or "none"
            coloured = [track for track in candidates if track.colour == colour]
            result["colour"] = record(bool(coloured), f"expected a {colour} {shape}, found colours: {found}")
            candidates = coloured
        result["motions"] = sorted(track.motion for track in candidates)
        if motion is not None:
            moving = [track for track in candidates if track.motion == motion]
            name = f"{colour} {shape}" if colour else shape
            found = ", ".join(result["motions"]) or "no such object"
            result["motion"] = record(bool(moving), f"expected the {name} {motion}, found {found}")
            candidates = moving
        if "position" in clause:
            relation, target = clause["position"]
            hits = [
                _relation_frames(track, other, relation, config.detector.position_threshold)
                for track in candidates
                for other in matched_groups[target]
            ]
            best = max(hits, default=0)
            ok = best >= majority
            result["position"] = record(
                ok,
                f"expected {shape} {relation} target on >= {majority} of {num_frames} frames, found {best}",
            )
            candidates = candidates if ok else []
        matched_groups.append(candidates)
        clauses.append(result)
    return VideoSpecCheck(tally.passed == tally.total, tally.passed, tally.total, tally.reasons, clauses)


def verify_video(
    video: torch.Tensor, spec: Spec, config: VideoVerifierConfig | None = None
) -> VideoSpecCheck:
    """Check one video ``[F, 3, H, W]`` in [0, 1] against a video spec, from its pixels."""
    config = config or VideoVerifierConfig()
    return check_video_spec(detect_video(video, config), spec, int(video.shape[0]), config)


def evaluate_videos(
    videos: torch.Tensor | Sequence[torch.Tensor],
    specs: Sequence[Any],
    config: VideoVerifierConfig | None = None,
) -> dict[str, Any]:
    """Score videos ``[B, F, 3, H, W]`` against specs (dicts or ``VideoPromptSpec`` s).

    Returns ``{"overall": mean over categories of the accuracy, "video_accuracy", "mean_fraction",
    "per_category": {tag: accuracy}, "counts": {tag: videos}, "per_sample": [{"correct",
    "fraction", "category", "prompt", "reasons", "clauses", "tracks"}, ...]}``.
    """
    config = config or VideoVerifierConfig()
    if len(videos) != len(specs):
        raise ValueError(f"got {len(videos)} videos but {len(specs)} specs")
    per_sample = []
    for video, item in zip(videos, specs):
        spec = getattr(item, "spec", item)
        tracks = detect_video(video, config)
        check = check_video_spec(tracks, spec, int(video.shape[0]), config)
        per_sample.append(
            {
                "correct": check.correct,
                "fraction": check.fraction,
                "category": spec["tag"],
                "prompt": spec.get("prompt", ""),
                "reasons": check.reasons,
                "clauses": check.clauses,
                "tracks": [track.to_dict() for track in tracks],
            }
        )
    return verdict_summary(per_sample, VIDEO_CATEGORIES, "video_accuracy", mean_fraction="fraction")
