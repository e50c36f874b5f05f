"""ShapesEval of a toy generator on a prompt split, with fixed seeds (the numbers of the cards)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from genalign.toy.captions import CATEGORIES
from genalign.toy.prompts import PromptSpec, prompts_for
from genalign.toy.shapes_eval import evaluate
from genalign.toy.training import torch_threads

FAMILIES = ("sd", "consistency", "flow")
# Sampling settings the cards are measured with (and the RL recipes use).
DEFAULT_EVAL = {
    "sd": {"steps": 10, "guidance": 4.5},
    "consistency": {"steps": 4, "guidance": 4.5},
    "flow": {"steps": 10, "guidance": 4.5},
}


def eval_prompts(split: str = "heldout", per_category: int | None = None) -> list[PromptSpec]:
    """The prompts an evaluation uses: ``split``'s prompts, or only the first ``per_category`` of
    each category (the small fixed subset the tests re-score)."""
    prompts = prompts_for(split)
    if per_category is None:
        return prompts
    if per_category < 1:
        raise ValueError(f"per_category must be positive, got {per_category}")
    chosen: list[PromptSpec] = []
    for category in CATEGORIES:
        chosen += [p for p in prompts if p.category == category][:per_category]
    return chosen


@torch.no_grad()
def evaluate_generator(
    path: str | Path | Any,
    family: str,
    split: str = "heldout",
    num_per_prompt: int = 4,
    seed: int = 0,
    steps: int | None = None,
    guidance: float | None = None,
    per_category: int | None = None,
    batch_size: int = 64,
    num_threads: int | None = None,
    categories: Sequence[str] | None = None,
) -> dict[str, Any]:
    """ShapesEval of a generator on a prompt split, with fixed seeds.

    Args:
        path: a model folder, ``tiny:NAME`` or an already loaded policy of ``family``.
        family: ``"sd"`` (deterministic DDIM, eta 0), ``"consistency"`` (LCM multistep sampling:
            the consistency estimate re-noised with seeded noise) or ``"flow"`` (Euler ODE).
        split / per_category: which prompts (:func:`eval_prompts`); ``categories`` keeps only
            those categories' prompts (seeds are then numbered over the kept prompts).
        num_per_prompt: images per prompt; image ``j`` of prompt ``i`` has seed
            ``seed + i * num_per_prompt + j``, whatever the batching.
        steps / guidance: sampling steps and guidance scale (default :data:`DEFAULT_EVAL`).

    Returns:
        ``{"overall", "image_accuracy", "per_category", "counts"}`` from :func:`genalign.toy.evaluate`
        plus ``"settings"`` (everything needed to reproduce the numbers).
    """
    from genalign.policies import DiffusionPolicy, load_policy

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if num_per_prompt < 1:
        raise ValueError(f"num_per_prompt must be positive, got {num_per_prompt}")
    steps = DEFAULT_EVAL[family]["steps"] if steps is None else steps
    guidance = DEFAULT_EVAL[family]["guidance"] if guidance is None else guidance
    with torch_threads(num_threads):
        policy = path if isinstance(path, DiffusionPolicy) else load_policy(family, str(path), train=False)
        prompts = eval_prompts(split, per_category)
        if categories is not None:
            unknown = sorted(set(categories) - {p.category for p in prompts})
            if unknown:
                raise ValueError(f"no {split} prompts in categories {unknown}")
            prompts = [p for p in prompts if p.category in set(categories)]
        captions = [p.caption for p in prompts for _ in range(num_per_prompt)]
        specs = [p.spec for p in prompts for _ in range(num_per_prompt)]
        seeds = seed + torch.arange(len(captions))
        kwargs = {"sd": {"eta": 0.0}, "flow": {"mode": "ode"}, "consistency": {}}[family]
        images = []
        for i in range(0, len(captions), batch_size):
            trajectory = policy.rollout(
                captions[i : i + batch_size],
                num_inference_steps=steps,
                guidance_scale=guidance,
                seeds=seeds[i : i + batch_size],
                **kwargs,
            )
            images.append(trajectory.images.float().cpu())
        result = evaluate(torch.cat(images), specs)
    result.pop("per_sample")
    result["settings"] = {
        "family": family,
        "split": split,
        "per_category": per_category,
        **({"categories": sorted(categories)} if categories is not None else {}),
        "num_prompts": len(prompts),
        "num_per_prompt": num_per_prompt,
        "seed": seed,
        "steps": steps,
        "guidance": guidance,
        "sampler": {"sd": "DDIM eta=0", "flow": "Euler ODE", "consistency": "LCM multistep"}[family],
    }
    return result
