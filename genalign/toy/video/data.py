"""Training data for a toy video generator: renders of train prompts with their captions.

:func:`toy_video_dataset` is the video counterpart of ``genalign.toy.generators.data.toy_dataset``:
it draws only from the pretraining ``train`` split, so ``unseen_combinations`` stays unseen and
``rl_train`` / ``rl_heldout`` (subsets of train) lie inside the generator's distribution.
"""

from __future__ import annotations

import json
import lzma

import numpy as np
import torch

from genalign.toy.video.captions import VIDEO_CATEGORIES
from genalign.toy.video.prompts import sample_video_for_prompt
from genalign.toy.video.scenes import NUM_FRAMES, VIDEO_SIZE, render_videos

CHUNK = 256  # videos rendered per batch


def toy_video_dataset(
    num_videos: int,
    seed: int = 0,
    frames: int = NUM_FRAMES,
    size: int = VIDEO_SIZE,
    caption_noise: float = 0.0,
    backend: str = "skia",
    categories: tuple[str, ...] | list[str] | None = None,
) -> tuple[torch.Tensor, list[str]]:
    """Videos and captions for training: ``(uint8 [N, frames, 3, size, size], captions)``, the
    ``ar_video`` frame layout (``/ 255`` gives its [0, 1] floats).

    Each video draws a category uniformly (from ``categories``, default all of
    :data:`VIDEO_CATEGORIES`; an unknown name is a ValueError naming it), then a **train** prompt of it and a video that
    satisfies it (:func:`sample_video_for_prompt`); deterministic given ``seed``. With probability
    ``caption_noise`` the video shows a scene drawn for *another* train prompt of the same category
    while keeping the first prompt's caption (loose captions, as ``toy_dataset``'s): a generator
    trained on them follows its captions only part of the time, which RL on the verifier corrects.
    """
    if not isinstance(num_videos, int) or num_videos < 0:
        raise ValueError(f"num_videos must be a non-negative integer, got {num_videos!r}")
    if not 0 <= caption_noise <= 1:
        raise ValueError(f"caption_noise must be in [0, 1], got {caption_noise}")
    if not isinstance(frames, int) or frames < 2:
        raise ValueError(f"frames must be an integer >= 2, got {frames!r}")
    drawn = tuple(VIDEO_CATEGORIES if categories is None else categories)
    unknown = [c for c in drawn if c not in VIDEO_CATEGORIES]
    if unknown or not drawn:
        raise ValueError(
            f"categories: {unknown or 'none given'}; expected some of {', '.join(VIDEO_CATEGORIES)}"
        )
    rng = np.random.default_rng(seed)
    scenes, captions = [], []
    for _ in range(num_videos):
        category = drawn[int(rng.integers(len(drawn)))]
        scene, caption, _ = sample_video_for_prompt(category, rng, "train", frames)
        if caption_noise and rng.random() < caption_noise:
            scene = sample_video_for_prompt(category, rng, "train", frames)[0]
        scenes.append(scene)
        captions.append(caption)
    if not scenes:
        return torch.empty(0, frames, 3, size, size, dtype=torch.uint8), []
    chunks = [
        (render_videos(scenes[i : i + CHUNK], size, backend) * 255).round().to(torch.uint8)
        for i in range(0, len(scenes), CHUNK)
    ]
    return torch.cat(chunks), captions


PACK_FORMAT = "genalign-toy-video-pack/1"


def save_video_pack(path, videos: torch.Tensor, captions: list[str]) -> None:
    """Write rendered training videos (uint8 ``[N, F, 3, H, W]``) and their captions to one
    lzma-compressed file: a JSON header line, then the raw bytes. Toy videos compress about 70x
    (a few hundred bytes each), so a set rendered once can be reused across runs or carried to
    another machine (one without the SVG rasteriser, a GPU box) at a fraction of its size."""
    if videos.dtype != torch.uint8 or videos.dim() != 5 or len(videos) != len(captions):
        raise ValueError(
            f"a video pack holds uint8 videos [N, F, 3, H, W] and N captions, got {videos.dtype} "
            f"{tuple(videos.shape)} and {len(captions)} captions"
        )
    header = {"format": PACK_FORMAT, "shape": list(videos.shape), "captions": list(captions)}
    with lzma.open(path, "wb", preset=6) as f:
        f.write(json.dumps(header).encode() + b"\n")
        f.write(videos.contiguous().numpy().tobytes())


def load_video_pack(path) -> tuple[torch.Tensor, list[str]]:
    """Read a file written by :func:`save_video_pack`: ``(uint8 videos, captions)``. A file that is
    not a pack, or is cut short, fails naming the file."""
    try:
        with lzma.open(path, "rb") as f:
            header = json.loads(f.readline())
            data = f.read()
    except (OSError, lzma.LZMAError, ValueError, EOFError) as error:
        raise ValueError(f"{path}: not a toy video pack ({error})") from None
    if not isinstance(header, dict) or header.get("format") != PACK_FORMAT:
        raise ValueError(
            f"{path}: not a toy video pack (format {header.get('format') if isinstance(header, dict) else None!r})"
        )
    shape = tuple(header["shape"])
    if len(data) != int(np.prod(shape)) or len(header["captions"]) != shape[0]:
        raise ValueError(f"{path}: truncated toy video pack ({len(data)} bytes for videos {shape})")
    videos = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).reshape(shape).copy())
    return videos, list(header["captions"])
