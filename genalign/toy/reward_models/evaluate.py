"""The fixed held-out evaluation of the toy reward models, through the public reward API only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from genalign.toy.captions import caption_for_spec
from genalign.toy.prompts import PromptSpec, heldout_prompts, scene_for_spec
from genalign.toy.reward_models.data import (
    DEGRADATIONS,
    degrade,
    false_variants,
    gaussian_blur,
    one_attribute_variants,
)
from genalign.toy.reward_models.vlm_model import RATING_WORDS
from genalign.toy.scenes import Scene, render_scenes
from genalign.toy.shapes_eval import check_spec

MODEL_NAMES = ("toy-clip", "toy-vlm")
EVAL_SEED = 20240806
EVAL_PER_CATEGORY = 64
SUBSET_SIZE = 20


@dataclass
class EvalItem:
    """One held-out evaluation case (everything derived from ``(EVAL_SEED, index)``)."""

    index: int
    category: str
    caption: str
    spec: dict[str, Any]
    scene: Scene
    negative: str  # a one-attribute-changed caption false of the scene
    attribute: str
    negative_spec: dict[str, Any]
    random_negative: str  # another held-out caption false of the scene
    image: torch.Tensor  # clean render [3, 64, 64]
    noisy: torch.Tensor  # the render as a blurry, noisy generator sample
    negative_image: torch.Tensor  # a render of the negative caption (false for ``caption``)
    degradation: str
    severity: int
    degraded: torch.Tensor  # ``image`` degraded by (degradation, severity)


def _eval_plan(per_category: int) -> list[tuple[int, PromptSpec]]:
    prompts = heldout_prompts()
    by_category: dict[str, list[PromptSpec]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    plan = []
    for group in by_category.values():
        for k in range(per_category):
            plan.append(
                group[(k * len(group)) // per_category if len(group) >= per_category else k % len(group)]
            )
    return list(enumerate(plan))


def subset_indices(per_category: int = EVAL_PER_CATEGORY, size: int = SUBSET_SIZE) -> list[int]:
    """The small fixed subset (evenly spaced, so every category is in it) the cards report."""
    total = len(_eval_plan(per_category))
    return [int(i) for i in np.linspace(0, total - 1, size).round()]


def heldout_eval_set(
    per_category: int = EVAL_PER_CATEGORY, indices: Sequence[int] | None = None, seed: int = EVAL_SEED
) -> list[EvalItem]:
    """The fixed held-out evaluation set: ``per_category`` cases of each held-out category.

    Each case draws (from ``np.random.default_rng([seed, index])``, so any subset is built alone)
    a scene of a held-out prompt, a one-attribute-changed caption false of it (all attributes the
    category allows, uniformly), a random held-out caption false of it, a scene of the changed
    caption, and a degradation with a severity (``index % 5``). Rendered by cairosvg at 64 px.
    """
    plan = _eval_plan(per_category)
    heldout = heldout_prompts()
    items = []
    for index in indices if indices is not None else range(len(plan)):
        _, prompt = plan[index]
        rng = np.random.default_rng([seed, index])
        scene = scene_for_spec(prompt.spec, rng)
        variants = false_variants(scene, prompt.spec)
        attributes = sorted({a for _, a in variants})
        attribute = attributes[rng.integers(len(attributes))]
        choices = [
            (c, s)
            for (s, a) in one_attribute_variants(prompt.spec)
            for c in [caption_for_spec(s)]
            if a == attribute
        ]
        choices = [(c, s) for c, s in choices if c in {v for v, _ in variants}]
        negative, negative_spec = choices[rng.integers(len(choices))]
        false = [p for p in heldout if not check_spec(scene.objects, p.spec).correct]
        random_negative = false[rng.integers(len(false))].caption
        negative_scene = scene_for_spec(negative_spec, rng)
        while check_spec(negative_scene.objects, prompt.spec).correct:
            negative_scene = scene_for_spec(negative_spec, rng)
        image, negative_image = render_scenes([scene, negative_scene], 64)
        generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
        noisy = (gaussian_blur(image, 0.8) + 0.03 * torch.randn(image.shape, generator=generator)).clamp(0, 1)
        degradation = DEGRADATIONS[(index // 5) % len(DEGRADATIONS)]
        severity = index % 5
        degraded = degrade(image, degradation, severity, generator)
        items.append(
            EvalItem(
                index,
                prompt.category,
                prompt.caption,
                prompt.spec,
                scene,
                negative,
                attribute,
                negative_spec,
                random_negative,
                image,
                noisy,
                negative_image,
                degradation,
                severity,
                degraded,
            )
        )
    return items


# -- evaluation -------------------------------------------------------------------------------------------------


def _per_category(items: Sequence[EvalItem], correct: Sequence[bool]) -> dict[str, float]:
    out: dict[str, list[bool]] = {}
    for item, ok in zip(items, correct):
        out.setdefault(item.category, []).append(bool(ok))
    return {category: float(np.mean(values)) for category, values in out.items()}


def _mean(values: Sequence[bool] | torch.Tensor) -> float:
    return float(torch.as_tensor(values, dtype=torch.float32).mean())


def load_toy_reward(name: str, path: str | Path, **kwargs: Any):
    """The public reward of a shipped toy model: ``clip`` for toy-clip; for toy-vlm ``vlm_yes``
    (pointwise), or with ``kind="comparative"`` / ``kind="iqa"`` those rewards."""
    from genalign.rewards import load_reward

    path = str(path)
    if name == "toy-clip":
        return load_reward("clip", model=f"local-dir:{path}", pretrained=None, **kwargs)
    if name == "toy-vlm":
        kind = kwargs.pop("kind", "pointwise")
        if kind == "iqa":
            return load_reward("iqa", model=path, preset="qalign", **kwargs)
        return load_reward("vlm_yes", model=path, mode=kind, **kwargs)
    raise ValueError(f"unknown toy reward model {name!r}; choose one of {MODEL_NAMES}")


def evaluate_reward_model(
    name: str, path: str | Path, items: Sequence[EvalItem] | None = None
) -> dict[str, Any]:
    """Scores of a saved toy reward model on held-out cases (default: :func:`heldout_eval_set`),
    loaded through the public reward API only.

    toy-clip: ``pair_accuracy`` (cosine of the true caption above the one-attribute-changed one;
    ``_noisy`` on blurred noisy renders; per category and per attribute), ``retrieval_accuracy``
    (the best of all held-out captions is true of the scene) and the mean cosines.
    toy-vlm: ``yes_no_accuracy`` (P(yes)/(P(yes)+P(no)) on the right side of 0.5 for the true,
    the changed and a random caption), ``pair_accuracy``, ``comparative_accuracy`` (prompt match
    and degradation pairs, both orders), ``rating_accuracy`` (most likely level word = severity)
    and ``rating_spearman`` (Q-Align score against -severity).
    """
    items = list(items) if items is not None else heldout_eval_set()
    if name == "toy-clip":
        return _evaluate_clip(path, items)
    if name == "toy-vlm":
        return _evaluate_vlm(path, items)
    raise ValueError(f"unknown toy reward model {name!r}; choose one of {MODEL_NAMES}")


@torch.no_grad()
def _evaluate_clip(path: str | Path, items: Sequence[EvalItem]) -> dict[str, Any]:
    reward = load_toy_reward("toy-clip", path, convention="cosine")
    captions = [i.caption for i in items]
    negatives = [i.negative for i in items]
    out: dict[str, Any] = {}
    for key, images in (
        ("", torch.stack([i.image for i in items])),
        ("_noisy", torch.stack([i.noisy for i in items])),
    ):
        positive = reward(images, captions).scores
        negative = reward(images, negatives).scores
        correct = (positive > negative).tolist()
        out[f"pair_accuracy{key}"] = _mean(correct)
        out[f"pair_accuracy{key}_by_category"] = _per_category(items, correct)
        by_attribute: dict[str, list[bool]] = {}
        for item, ok in zip(items, correct):
            by_attribute.setdefault(item.attribute, []).append(ok)
        out[f"pair_accuracy{key}_by_attribute"] = {a: _mean(v) for a, v in by_attribute.items()}
        out[f"mean_cosine_true{key}"] = float(positive.mean())
        out[f"mean_cosine_changed{key}"] = float(negative.mean())
        candidates = heldout_prompts()
        embedder = reward.embedder
        image_features = F.normalize(embedder.encode_images(images), dim=-1)
        text_features = F.normalize(embedder.encode_texts([p.caption for p in candidates]), dim=-1)
        best = (image_features @ text_features.T).argmax(dim=-1).tolist()
        retrieved = [
            check_spec(item.scene.objects, candidates[b].spec).correct for item, b in zip(items, best)
        ]
        out[f"retrieval_accuracy{key}"] = _mean(retrieved)
        out[f"retrieval_accuracy{key}_by_category"] = _per_category(items, retrieved)
    out["retrieval_candidates"] = len(heldout_prompts())
    return out


@torch.no_grad()
def _evaluate_vlm(path: str | Path, items: Sequence[EvalItem]) -> dict[str, Any]:
    from scipy.stats import spearmanr

    from genalign.rewards.iqa import QALIGN_LEVELS

    out: dict[str, Any] = {}
    pointwise = load_toy_reward("toy-vlm", path, batch_size=32)
    images = torch.stack([i.noisy for i in items])
    p_true = pointwise(images, [i.caption for i in items]).scores
    p_changed = pointwise(images, [i.negative for i in items]).scores
    p_random = pointwise(images, [i.random_negative for i in items]).scores
    correct = [
        bool(t > 0.5) and bool(c < 0.5) and bool(r < 0.5) for t, c, r in zip(p_true, p_changed, p_random)
    ]
    decisions = torch.cat([p_true > 0.5, p_changed < 0.5, p_random < 0.5])
    out["yes_no_accuracy"] = _mean(decisions)
    out["yes_no_accuracy_true"] = _mean(p_true > 0.5)
    out["yes_no_accuracy_changed"] = _mean(p_changed < 0.5)
    out["yes_no_accuracy_random"] = _mean(p_random < 0.5)
    out["yes_no_all_three_by_category"] = _per_category(items, correct)
    pair = (p_true > p_changed).tolist()
    out["pair_accuracy"] = _mean(pair)
    out["pair_accuracy_by_category"] = _per_category(items, pair)
    out["mean_p_yes_true"] = float(p_true.mean())
    out["mean_p_yes_changed"] = float(p_changed.mean())

    comparative = load_toy_reward("toy-vlm", path, kind="comparative", batch_size=32)
    prompts = [i.caption for i in items]
    good_match, bad_match = images, torch.stack([i.negative_image for i in items])
    clean, worse = (
        torch.stack([i.image for i in items]),
        torch.stack([degrade(i.image, "blur", 3) for i in items]),
    )
    results = {}
    for key, good, bad in (("match", good_match, bad_match), ("quality", clean, worse)):
        first = comparative(good, prompts, reference_images=bad).scores  # label yes
        second = comparative(bad, prompts, reference_images=good).scores  # label no
        results[key] = torch.cat([first > 0.5, second < 0.5])
        out[f"comparative_accuracy_{key}"] = _mean(results[key])
    out["comparative_accuracy"] = _mean(torch.cat(list(results.values())))

    iqa = load_toy_reward("toy-vlm", path, kind="iqa", batch_size=32)
    degraded = torch.stack([i.degraded for i in items])
    severities = torch.tensor([i.severity for i in items])
    scores = iqa(degraded, prompts).scores
    (_, word_logits), *_ = iqa.member_word_logits(degraded)
    levels = list(QALIGN_LEVELS)
    predicted = word_logits.argmax(dim=-1)  # index into (excellent ... bad) = severity
    if levels != list(RATING_WORDS):
        raise RuntimeError(f"unexpected Q-Align levels {levels}")
    out["rating_accuracy"] = _mean(predicted == severities)
    out["rating_within_one"] = _mean((predicted - severities).abs() <= 1)
    out["rating_spearman"] = float(spearmanr(scores.numpy(), -severities.numpy()).statistic)
    by_kind: dict[str, list[bool]] = {}
    for item, ok in zip(items, (predicted == severities).tolist()):
        by_kind.setdefault(item.degradation, []).append(ok)
    out["rating_accuracy_by_degradation"] = {k: _mean(v) for k, v in by_kind.items()}
    return out


def subset_scores(name: str, path: str | Path) -> dict[str, float]:
    """Mean reward scores on the small fixed subset (:func:`subset_indices`), for the card and tests."""
    items = heldout_eval_set(indices=subset_indices())
    captions = [i.caption for i in items]
    with torch.no_grad():
        if name == "toy-clip":
            reward = load_toy_reward(name, path, convention="cosine")
            images = torch.stack([i.noisy for i in items])
            true, changed = (
                reward(images, captions).scores,
                reward(images, [i.negative for i in items]).scores,
            )
            return {
                "mean_cosine_true": float(true.mean()),
                "mean_cosine_changed": float(changed.mean()),
                "pair_accuracy": _mean(true > changed),
            }
        if name == "toy-vlm":
            reward = load_toy_reward(name, path, batch_size=32)
            images = torch.stack([i.noisy for i in items])
            true, changed = (
                reward(images, captions).scores,
                reward(images, [i.negative for i in items]).scores,
            )
            iqa = load_toy_reward(name, path, kind="iqa", batch_size=32)
            rating = iqa(torch.stack([i.degraded for i in items]), captions).scores
            return {
                "mean_p_yes_true": float(true.mean()),
                "mean_p_yes_changed": float(changed.mean()),
                "pair_accuracy": _mean(true > changed),
                "mean_qalign_score": float(rating.mean()),
            }
    raise ValueError(f"unknown toy reward model {name!r}; choose one of {MODEL_NAMES}")
