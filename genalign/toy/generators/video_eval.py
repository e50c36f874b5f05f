"""The video verifier's accuracy on a toy AR video generator's rollouts, with fixed seeds and a 95%
interval (the numbers of toy-ar-video's card)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genalign.toy.training import torch_threads
from genalign.toy.video.captions import VIDEO_CATEGORIES
from genalign.toy.video.prompts import VideoPromptSpec, video_prompts_for
from genalign.toy.video.scenes import NUM_FRAMES, VIDEO_SIZE
from genalign.toy.video.verifier import evaluate_videos

# How the card's numbers are sampled (and the toy Astrolabe recipe's rollouts): the ar_video
# policy's 4 Self-Forcing steps per block, 48 px, 8 latent frames (= 8 frames: no temporal compression).
VIDEO_SAMPLING = {
    "num_inference_steps": 4,
    "height": VIDEO_SIZE,
    "width": VIDEO_SIZE,
    "num_frames": NUM_FRAMES,
}


def video_eval_items(
    split: str = "rl_heldout", per_category: int | None = None, num_per_prompt: int = 1, seed: int = 0
) -> list[tuple[VideoPromptSpec, int]]:
    """(prompt, seed) pairs: ``split``'s prompts (or the first ``per_category`` of each category),
    ``num_per_prompt`` each; video ``j`` of prompt ``i`` has seed ``seed + i * num_per_prompt + j``."""
    if num_per_prompt < 1 or (per_category is not None and per_category < 1):
        raise ValueError("num_per_prompt and per_category must be positive")
    prompts = video_prompts_for(split)
    if per_category is not None:
        prompts = [
            p for c in VIDEO_CATEGORIES for p in [q for q in prompts if q.category == c][:per_category]
        ]
    return [(p, seed + i * num_per_prompt + j) for i, p in enumerate(prompts) for j in range(num_per_prompt)]


def accuracy_interval(correct: list[float], categories: list[str]) -> tuple[float, float, float]:
    """The mean-of-categories accuracy and its 95% interval, stratified by category: the accuracy ±
    ``z sqrt(Σ_c v_c) / K`` with Agresti and Coull's variance per category
    (``p~_c = (x_c + z²/2) / (n_c + z²)``, ``v_c = p~_c (1 - p~_c) / (n_c + z²)``), clipped to
    [0, 1]. A category where every video is wrong (or right) keeps a width, where the plain
    ``p (1 - p) / n`` reads [0, 0]; the interval is centred on the estimate, so it always holds it
    (shrunk centres summed over several tiny categories need not)."""
    z = 1.959964
    labels = np.asarray(categories)
    values = np.asarray(correct, dtype=np.float64)
    means, variances = [], []
    for category in dict.fromkeys(categories):
        x = values[labels == category]
        shrunk = (x.sum() + z * z / 2) / (len(x) + z * z)
        means.append(x.mean())
        variances.append(shrunk * (1 - shrunk) / (len(x) + z * z))
    k = len(means)
    accuracy, half = float(sum(means) / k), z * math.sqrt(sum(variances)) / k
    return accuracy, max(0.0, accuracy - half), min(1.0, accuracy + half)


SAMPLERS = ("self_forcing", "ode")


@torch.no_grad()
def evaluate_video_generator(
    path: str | Path | Any,
    split: str = "rl_heldout",
    per_category: int | None = None,
    num_per_prompt: int = 1,
    seed: int = 0,
    steps: int = 4,
    batch_size: int = 32,
    num_threads: int | None = None,
    keep_per_video: bool = False,
    sampler: str = "self_forcing",
    guidance_scale: float = 1.0,
    shift: float | None = None,
) -> dict[str, Any]:
    """The verifier's accuracy on rollouts of an ``ar_video`` generator (a folder, ``tiny:`` id or
    a loaded policy) for ``split``'s prompts (:func:`video_eval_items`), sampled as
    :data:`VIDEO_SAMPLING` with ``steps`` steps per block.

    ``sampler``: ``"self_forcing"`` (the policy's rollout, as RL samples) or ``"ode"``, the base
    model's own block-by-block Euler ODE
    (:func:`~genalign.toy.generators.video_reflow.ode_video_samples`, ``shift`` default the
    policy's) with classifier-free guidance ``guidance_scale`` against the empty caption: what an
    undistilled generator draws, the teacher a few-step student is distilled from. Video ``i``'s
    noise comes from its item seed under either sampler.

    Returns :func:`~genalign.toy.video.evaluate_videos`'s ``overall``, ``video_accuracy``,
    ``mean_fraction``, ``per_category`` and ``counts``, plus ``interval`` (95%, of ``overall``) and
    ``settings`` (all that reproduces the numbers); with ``keep_per_video`` also ``correct`` and
    ``categories``, one per video (for paired before / after intervals).
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler {sampler!r}: expected one of {', '.join(SAMPLERS)}")
    if sampler == "self_forcing" and float(guidance_scale) != 1.0:
        raise ValueError(
            "guidance_scale: the Self-Forcing rollout samples without guidance (use sampler='ode')"
        )
    items = video_eval_items(split, per_category, num_per_prompt, seed)
    sampling = dict(VIDEO_SAMPLING, num_inference_steps=steps)
    with torch_threads(num_threads):
        policy = _policy(path)
        draw = _rollout_videos if sampler == "self_forcing" else _ode_videos(policy, guidance_scale, shift)
        videos = [
            draw(policy, items[start : start + batch_size], sampling)
            for start in range(0, len(items), batch_size)
        ]
    settings = {
        "split": split,
        "per_category": per_category,
        "num_prompts": len(items) // num_per_prompt,
        "num_per_prompt": num_per_prompt,
        "seed": seed,
        **sampling,
    }
    if sampler == "self_forcing":
        settings["sampler"] = "Self-Forcing (x0 prediction, re-noised with fresh noise), KV cache"
    else:
        settings["guidance_scale"] = guidance_scale
        settings["shift"] = policy.timestep_shift if shift is None else shift
        settings["sampler"] = "Euler ODE per block, clean earlier blocks as context"
    return _scored(torch.cat(videos), items, settings, keep_per_video)


def _rollout_videos(
    policy, chunk: list[tuple[VideoPromptSpec, int]], sampling: dict[str, Any]
) -> torch.Tensor:
    """Self-Forcing rollouts of ``chunk``'s (prompt, seed) pairs: videos ``[B, F, 3, H, W]``."""
    seeds = torch.tensor([s for _, s in chunk], dtype=torch.long)
    return policy.rollout([p.caption for p, _ in chunk], seeds=seeds, **sampling).images.float().cpu()


def _ode_videos(policy, guidance_scale: float, shift: float | None):
    """A drawer like :func:`_rollout_videos` that samples the guided Euler ODE instead."""
    from genalign.toy.generators.video_reflow import ode_video_samples
    from genalign.toy.generators.video_train import prompt_embeddings

    negative = prompt_embeddings(policy.pipeline, [""]) if float(guidance_scale) != 1.0 else None
    factor = int(policy.pipeline.vae_scale_factor_spatial)

    def draw(policy, chunk: list[tuple[VideoPromptSpec, int]], sampling: dict[str, Any]) -> torch.Tensor:
        shape = (
            int(policy.denoiser.config.in_channels),
            int(sampling["num_frames"]),
            int(sampling["height"]) // factor,
            int(sampling["width"]) // factor,
        )
        noise = torch.stack(
            [torch.randn(shape, generator=torch.Generator().manual_seed(s)) for _, s in chunk]
        )
        embeds = prompt_embeddings(policy.pipeline, [p.caption for p, _ in chunk])
        steps = int(sampling["num_inference_steps"])
        latents = ode_video_samples(policy, noise, embeds, steps, guidance_scale, negative, shift)
        return policy.decode(latents, None).float().cpu()

    return draw


def _policy(path: str | Path | Any):
    """An ``ar_video`` policy: ``path`` itself when it is one, else loaded from the folder or id."""
    from genalign.policies import DiffusionPolicy, load_policy

    return path if isinstance(path, DiffusionPolicy) else load_policy("ar_video", str(path), train=False)


def _scored(
    videos: torch.Tensor,
    items: list[tuple[VideoPromptSpec, int]],
    settings: dict[str, Any],
    keep: bool = False,
) -> dict[str, Any]:
    """The verifier's result on ``videos`` of ``items`` with its 95% ``interval`` and ``settings``
    (and, with ``keep``, ``correct`` and ``categories`` per video)."""
    result = evaluate_videos(videos, [p.spec for p, _ in items])
    per_sample = result.pop("per_sample")
    correct = [float(s["correct"]) for s in per_sample]
    categories = [s["category"] for s in per_sample]
    _, low, high = accuracy_interval(correct, categories)
    result["interval"] = [round(low, 4), round(high, 4)]
    if keep:
        result["correct"], result["categories"] = correct, categories
    result["settings"] = settings
    return result
