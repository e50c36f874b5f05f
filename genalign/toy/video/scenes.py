"""Scenes of the toy video world: the toy world's shapes, each standing still or moving at a
constant speed along one axis, rendered frame by frame with the image world's renderer.

A :class:`VideoScene` is a tuple of :class:`MovingObject` s and a frame count. Each object is
a ``scenes.SceneObject`` at frame 0 (``shape, colour, x, y, size`` in canvas fractions, ``y``
down) plus a ``motion`` in :data:`MOTIONS` and a ``speed`` in canvas fractions per frame:

- ``"right"`` / ``"left"``: x grows / shrinks by ``speed`` each frame;
- ``"down"`` / ``"up"``: y grows / shrinks (y points down, so "down" is falling);
- ``"static"``: speed 0.

Frame ``t`` (0-based) is the image scene with every object at ``(x, y) + t * speed * direction``.
The sampler (:func:`layout_moving_objects`) keeps every object inside the canvas margin and every
two bounding boxes :data:`scenes.GAP` apart on *every* frame, so objects never touch or occlude
one another and the per-frame detector sees each one whole. Speeds are drawn in
:data:`SPEED_RANGE` (0.025-0.04 of the side per frame: 1.2-1.9 px per frame at 48 px, 6-10 px
over the default 8 frames), far above the verifier's static threshold.

Videos are float ``[F, 3, H, W]`` in [0, 1] per scene and ``[B, F, 3, H, W]`` per batch, the
layout of the ``ar_video`` policy's decoded videos and of ``rewards.video``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from genalign.toy.scenes import (
    GAP,
    MARGIN,
    MIN_SIZE,
    SAMPLER_POSITION_CUTOFF,
    SAMPLER_POSITION_THRESHOLD,
    Scene,
    SceneObject,
    _boxes_apart,
    as_generator,
    relative_position,
    render_scenes,
)

MOTIONS: tuple[str, ...] = ("static", "left", "right", "up", "down")
DIRECTIONS: tuple[str, ...] = MOTIONS[1:]  # the moving ones
UNIT: dict[str, tuple[int, int]] = {
    "static": (0, 0),
    "left": (-1, 0),
    "right": (1, 0),
    "up": (0, -1),
    "down": (0, 1),
}
NUM_FRAMES = 8  # default frames per video
VIDEO_SIZE = 48  # default side in pixels
SPEED_RANGE = (0.025, 0.04)  # canvas fraction per frame of a moving object
VIDEO_MAX_SIZE = {1: 0.32, 2: 0.28}  # largest object of a video with n objects (room to move)


@dataclass(frozen=True)
class MovingObject:
    """A toy-world shape at frame 0 and its constant motion (``speed`` in canvas fractions per
    frame; 0 exactly when ``motion`` is ``"static"``)."""

    shape: str
    colour: str
    x: float
    y: float
    size: float
    motion: str = "static"
    speed: float = 0.0

    def __post_init__(self) -> None:
        if self.motion not in MOTIONS:
            raise ValueError(f"unknown motion {self.motion!r}; motions are {MOTIONS}")
        if self.speed < 0 or (self.speed == 0) != (self.motion == "static"):
            raise ValueError(f"speed {self.speed} does not fit motion {self.motion!r} (static iff speed 0)")
        SceneObject(self.shape, self.colour, self.x, self.y, self.size)  # validates the rest

    def at(self, frame: int) -> SceneObject:
        """The object as drawn on ``frame``."""
        ux, uy = UNIT[self.motion]
        step = frame * self.speed
        return SceneObject(self.shape, self.colour, self.x + ux * step, self.y + uy * step, self.size)

    @property
    def colour_shape(self) -> tuple[str, str]:
        return (self.colour, self.shape)


@dataclass(frozen=True)
class VideoScene:
    """A toy-world video: ``objects`` drawn in order on white for ``num_frames`` frames."""

    objects: tuple[MovingObject, ...]
    num_frames: int = NUM_FRAMES

    def __post_init__(self) -> None:
        object.__setattr__(self, "objects", tuple(self.objects))
        if not isinstance(self.num_frames, int) or self.num_frames < 2:
            raise ValueError(f"a video needs at least 2 frames, got num_frames={self.num_frames!r}")

    def __len__(self) -> int:
        return len(self.objects)

    def frame(self, index: int) -> Scene:
        """The image scene of frame ``index``."""
        return Scene(tuple(obj.at(index) for obj in self.objects))

    def frames(self) -> list[Scene]:
        return [self.frame(t) for t in range(self.num_frames)]

    def to_dict(self) -> dict[str, Any]:
        return {"num_frames": self.num_frames, "objects": [vars(obj).copy() for obj in self.objects]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VideoScene:
        return cls(tuple(MovingObject(**obj) for obj in data["objects"]), int(data["num_frames"]))


def render_video(scene: VideoScene, size: int = VIDEO_SIZE, backend: str = "skia") -> torch.Tensor:
    """Rasterise every frame: float ``[F, 3, size, size]`` in [0, 1] (``scenes.render_scene``)."""
    return render_scenes(scene.frames(), size, backend)


def render_videos(
    scenes: Sequence[VideoScene], size: int = VIDEO_SIZE, backend: str = "skia"
) -> torch.Tensor:
    """Rasterise a batch of videos of one frame count: ``[B, F, 3, size, size]`` in [0, 1]."""
    if not scenes:
        return torch.empty(0, NUM_FRAMES, 3, size, size)
    counts = {scene.num_frames for scene in scenes}
    if len(counts) != 1:
        raise ValueError(f"videos of a batch need one frame count, got {sorted(counts)}")
    return torch.stack([render_video(scene, size, backend) for scene in scenes])


# -- random layouts ---------------------------------------------------------------------------------


def _trajectory_fits(obj: MovingObject, num_frames: int) -> bool:
    low, high = MARGIN - 1e-9, 1 - MARGIN + 1e-9
    return all(low <= v <= high for t in (0, num_frames - 1) for v in obj.at(t).box)


def _apart_on_every_frame(a: MovingObject, b: MovingObject, num_frames: int) -> bool:
    return all(_boxes_apart(a.at(t).box, b.at(t).box, GAP) for t in range(num_frames))


def _place(
    rng: np.random.Generator, item: tuple[str, str, str], max_size: float, num_frames: int
) -> MovingObject:
    """One object of ``(shape, colour, motion)`` at a random size, speed and start whose whole
    trajectory lies inside the canvas margin."""
    shape, colour, motion = item
    size = float(rng.uniform(MIN_SIZE, max_size))
    speed = 0.0 if motion == "static" else round(float(rng.uniform(*SPEED_RANGE)), 4)
    travel = speed * (num_frames - 1)
    ux, uy = UNIT[motion]
    low, high = MARGIN + size / 2, 1 - MARGIN - size / 2
    # the start range shrinks by the travel on the moving axis, on the side it moves towards
    x = float(rng.uniform(low + max(-ux, 0) * travel, high - max(ux, 0) * travel))
    y = float(rng.uniform(low + max(-uy, 0) * travel, high - max(uy, 0) * travel))
    return MovingObject(shape, colour, round(x, 4), round(y, 4), round(size, 4), motion, speed)


def layout_moving_objects(
    rng: int | np.random.Generator | None,
    items: Sequence[tuple[str, str, str]],
    relation: tuple[int, str, int] | None = None,
    num_frames: int = NUM_FRAMES,
    max_attempts: int = 2000,
) -> VideoScene:
    """Place ``(shape, colour, motion)`` items with random sizes, speeds and starts.

    Every trajectory stays inside the canvas margin and every two boxes stay :data:`GAP` apart on
    every frame. ``relation = (i, "above", j)`` requires item i to stand in that relation to item
    j on *every* frame with the image sampler's stricter margin, so a verifier reading it on the
    first frame, on a majority of frames or on all of them agrees. Rejection sampling;
    deterministic given ``rng``.
    """
    rng = as_generator(rng)
    if not 1 <= len(items) <= 2:
        raise ValueError(f"a toy video holds 1-2 objects, got {len(items)}")
    for shape, colour, motion in items:
        if motion not in MOTIONS:
            raise ValueError(f"unknown motion {motion!r} for the {colour} {shape}; motions are {MOTIONS}")
    max_size = VIDEO_MAX_SIZE[len(items)]
    for _ in range(max_attempts):
        objects = [_place(rng, item, max_size, num_frames) for item in items]
        if not all(_trajectory_fits(obj, num_frames) for obj in objects):
            continue
        if len(objects) == 2 and not _apart_on_every_frame(objects[0], objects[1], num_frames):
            continue
        if relation is not None:
            i, name, j = relation
            if not all(
                name
                in relative_position(
                    objects[i].at(t).box,
                    objects[j].at(t).box,
                    SAMPLER_POSITION_THRESHOLD,
                    SAMPLER_POSITION_CUTOFF,
                )
                for t in range(num_frames)
            ):
                continue
        return VideoScene(tuple(objects), num_frames)
    raise RuntimeError(f"could not lay out {list(items)} (relation {relation}) in {max_attempts} attempts")
