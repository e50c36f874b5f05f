"""Q-Hawkeye's math: IQA rewards on a judge's text, uncertainty-aware advantages, the perception term.

Xie et al. 2026, "Q-Hawkeye" (arXiv 2601.22920; official code ``AMAP-ML/Q-Hawkeye`` @ 905262f,
``src/virft/src/open_r1/grpo_am.py`` and ``trainer/grpo_trainer.py``) trains an image-quality
judge (a VLM that reasons in ``<think>`` and answers a float in [1, 5] in ``<answer>``) with GRPO:

* **Rewards** (summed; ``grpo_am.py``): accuracy ``exp(-|s_hat - s| / tau)``, ``tau = 0.3``, both
  scores clamped to [1, 5] (:func:`accuracy_reward`); format 0.8 when the whole completion is
  ``<think>...</think><answer>x.xx</answer>`` (:func:`format_reward`); repetition ``-0.25`` per
  occurrence of a word or character that occurs more than 5 times in the answer, floored at -2
  (:func:`repetition_penalty`).
* **Uncertainty-aware advantages** (UA-GRPO, the paper's uncertainty-aware dynamic optimisation):
  ``A_i = (R_i - mean_g) / (std_g + 1e-4)`` with the unbiased group std, times
  ``w_g = exp(-alpha u_g)``, ``u_g = clip(Var_pop(parsed scores of group g) / (0.25 (5 - 1)^2), 0, 1)``,
  ``alpha = 0.2`` (:func:`uncertainty_aware_advantages`).
* **Perception loss**: the sampled completion re-scored with the degraded image (no gradient);
  per-token ``k3 = exp(d) - d - 1`` with ``d = log p_deg - log p_orig`` (clamped to [-20, 20] before
  the exponential), then clamped to [-10, 10] (:func:`perception_k3`); the loss gets
  ``-gamma * token-mean(k3)`` (:func:`perception_term`), which pushes the two output distributions
  apart; ``gamma`` (1e-4) is cosine-annealed to 0 (:func:`cosine_annealed`).

Pure functions on strings and tensors; the ``iqa_answer`` reward, the ``q_hawkeye`` strategy and
loss call them.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import torch

__all__ = [
    "QHAWKEYE_PROMPT",
    "SHORT_PROMPT",
    "accuracy_reward",
    "answer_digit_places",
    "cosine_annealed",
    "format_reward",
    "parse_answer_score",
    "perception_k3",
    "perception_row_scale",
    "perception_term",
    "repetition_penalty",
    "score_uncertainty_weights",
    "uncertainty_aware_advantages",
]

# the official question and format instructions (src/System_Prompt.txt), given as the user turn
QHAWKEYE_PROMPT = (
    "You are doing the image quality assessment task. Here is the question: What is your overall "
    "rating on the quality of this picture?\nPlease provide your response in the following format:\n"
    "<think>\n[Your detailed analysis of the image quality here]\n</think>\n"
    "<answer>[Only the numerical score here]\n</answer>\nRequirements:\n"
    "- The rating should be a float between 1 and 5, rounded to two decimal places\n"
    "- 1 represents very poor quality and 5 represents excellent quality\n"
    "- The <answer></answer> tags must contain ONLY the numerical score (e.g., 3.75), no other text"
)
# a short question for toy models with a small context
SHORT_PROMPT = "Rate the quality of this picture from 1 to 5: <think>...</think><answer>x.xx</answer>"
# the accuracy reward's parser (``grpo_am.py: _ANSWER_TAG_PATTERN``): unsigned digits and dots
_ACCURACY_ANSWER = re.compile(r"<answer>\s*([\d.]+)\s*</answer>", re.DOTALL | re.IGNORECASE)
# UA-GRPO's parser (``grpo_trainer.py: _extract_score_from_text``): a signed decimal number
_UNCERTAINTY_ANSWER = re.compile(r"<answer>\s*([-+]?\d+(\.\d+)?)\s*</answer>", re.DOTALL | re.IGNORECASE)
# the format reward's pattern (``grpo_am.py: format_reward``), matched against the whole completion
_FORMAT = re.compile(
    r"^\s*<think>\s*.+?</think>\s*<answer>\s*[\d\.]+?\s*</answer>\s*$", re.DOTALL | re.MULTILINE
)
_ANSWER_CONTENT = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def parse_answer_score(text: str, signed: bool = False) -> float | None:
    """The score in the first ``<answer>...</answer>`` of ``text``, or None (no tag, not a number).

    ``signed=False`` is the accuracy reward's parser (digits and dots: ``"3.4.5"`` and ``"-2"`` give
    None); ``signed=True`` is UA-GRPO's (``[-+]?\\d+(\\.\\d+)?``). Case-insensitive tags, spaces
    around the number allowed. Out-of-range values are returned as is (callers clamp)."""
    if not isinstance(text, str):
        return None
    match = (_UNCERTAINTY_ANSWER if signed else _ACCURACY_ANSWER).search(text)
    if match is None:
        return None
    try:
        value = float(match.group(1))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def answer_digit_places(text: str) -> list[tuple[int, float]] | None:
    """Where each digit of the first ``<answer>`` number of ``text`` stands, with its place value.

    ``[(character offset in text, 10**p), ...]`` in reading order: ``"<answer>2.51</answer>"`` gives
    the offsets of ``2``, ``5`` and ``1`` with 1, 0.1 and 0.01. None when :func:`parse_answer_score`
    finds no number (the same parser, so the two always agree). The ``expected`` readout of the
    ``iqa`` reward's answer preset replaces each digit by its expectation under the judge's
    next-token distribution at that offset.
    """
    if parse_answer_score(text) is None:
        return None
    match = _ACCURACY_ANSWER.search(text)
    number, start = match.group(1), match.start(1)
    point = number.find(".")
    point = len(number) if point < 0 else point
    places = []
    for index, character in enumerate(number):
        if character.isdigit():
            exponent = point - index - 1 if index < point else point - index
            places.append((start + index, 10.0**exponent))
    return places


def accuracy_reward(
    text: str, true_score: float, tau: float = 0.3, score_min: float = 1.0, score_max: float = 5.0
) -> float:
    """``exp(-|clamp(s_hat) - clamp(s)| / tau)`` in (0, 1], both clamped to ``[score_min, score_max]``;
    0 when no score parses (Q-Hawkeye's ``score_reward``)."""
    if tau <= 0:
        raise ValueError(f"tau must be positive, got {tau}")
    predicted = parse_answer_score(text)
    if predicted is None or not math.isfinite(float(true_score)):
        return 0.0
    predicted = min(max(predicted, score_min), score_max)
    true_score = min(max(float(true_score), score_min), score_max)
    return min(1.0, max(0.0, math.exp(-abs(predicted - true_score) / tau)))


def format_reward(text: str, value: float = 0.8) -> float:
    """``value`` when the whole completion is ``<think>...</think><answer>x.xx</answer>`` (spaces
    allowed around the tags, a non-empty think, digits and dots in the answer), else 0."""
    return value if isinstance(text, str) and _FORMAT.fullmatch(text) else 0.0


def repetition_penalty(text: str, threshold: int = 5, scale: float = 0.25, floor: float = -2.0) -> float:
    """Q-Hawkeye's ``repetition_reward``: on the answer (the content of ``<answer>...</answer>`` when
    present, else the whole completion) with punctuation removed, ``-scale`` times the occurrences of
    every word (split on single spaces) and every character that occurs more than ``threshold``
    times, summed over words and characters, floored at ``floor``."""
    match = _ANSWER_CONTENT.search(text)
    answer = (match.group(1) if match else text).strip()
    cleaned = re.sub(r"[^\w\s]", "", answer)
    words = Counter(cleaned.split(" "))
    characters = Counter(cleaned)
    repeated = sum(v for v in words.values() if v > threshold) + sum(
        v for v in characters.values() if v > threshold
    )
    return max(floor, -scale * repeated) if repeated else 0.0


def score_uncertainty_weights(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    alpha: float = 0.2,
    score_min: float = 1.0,
    score_max: float = 5.0,
) -> torch.Tensor:
    """UA-GRPO's per-sample weights ``[B]``: ``exp(-alpha u_g)`` of each sample's group ``g``.

    ``scores`` ``[B]`` are the parsed scores (NaN: unparsed), clamped to the range;
    ``u_g = clip(Var_pop / (0.25 (score_max - score_min)^2 + 1e-8), 0, 1)`` over the group's parsed
    scores (the population variance; 0 when fewer than two parsed), so ``w`` lies in
    ``[exp(-alpha), 1]``. ``group_ids`` ``[B]`` any integer labels."""
    if score_max <= score_min:
        raise ValueError(f"score_max must exceed score_min, got [{score_min}, {score_max}]")
    scores = scores.double().clamp(score_min, score_max)  # NaN stays NaN
    max_variance = 0.25 * (score_max - score_min) ** 2 + 1e-8
    weights = torch.ones(scores.shape, dtype=torch.float64)
    for group in torch.unique(group_ids):
        members = group_ids == group
        valid = scores[members][~torch.isnan(scores[members])]
        variance = valid.var(unbiased=False) if valid.numel() > 1 else valid.new_zeros(())
        weights[members] = torch.exp(-alpha * (variance / max_variance).clamp(0.0, 1.0))
    return weights.float()


def uncertainty_aware_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    scores: torch.Tensor | None = None,
    alpha: float = 0.2,
    score_min: float = 1.0,
    score_max: float = 5.0,
    eps: float = 1e-4,
) -> torch.Tensor:
    """``A_i = (R_i - mean_g) / (std_g + eps) * w_g`` (module docstring), ``[B]`` float.

    ``std_g`` is the unbiased std of the group's rewards (trl 0.18's GRPO and Q-Hawkeye's); ``w_g``
    :func:`score_uncertainty_weights` of ``scores`` (None: no weighting, plain GRPO advantages).
    A group of one sample has std NaN in torch; it gets advantage 0 here."""
    rewards = rewards.double()
    advantages = torch.zeros_like(rewards)
    for group in torch.unique(group_ids):
        members = group_ids == group
        values = rewards[members]
        std = values.std(unbiased=True) if values.numel() > 1 else values.new_zeros(())
        advantages[members] = (values - values.mean()) / (std + eps)
    if scores is not None:
        advantages = (
            advantages * score_uncertainty_weights(scores, group_ids, alpha, score_min, score_max).double()
        )
    return advantages.float()


def perception_k3(
    log_probs: torch.Tensor, degraded_log_probs: torch.Tensor, clamp: float = 10.0
) -> torch.Tensor:
    """Per-token ``k3 = exp(d) - d - 1``, ``d = clamp(log p_deg - log p_orig, -20, 20)``, clamped to
    ``[-clamp, clamp]`` (``_low_var_kl`` of the official trainer); ``[B, L]``. Gradients reach
    ``log_probs`` only: the degraded re-scoring is a constant."""
    difference = (degraded_log_probs.detach().float() - log_probs.float()).clamp(-20.0, 20.0)
    return (torch.expm1(difference) - difference).clamp(-clamp, clamp)


def perception_term(
    log_probs: torch.Tensor,
    degraded_log_probs: torch.Tensor,
    completion_mask: torch.Tensor,
    gamma: float,
    clamp: float = 10.0,
    row_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(-gamma * k3_bar, k3_bar)``: the term added to the loss and the mean of
    :func:`perception_k3` (``completion_mask`` ``[B, L]``; padding adds nothing).

    Without ``row_scale``, ``k3_bar`` is the token mean over every completion token of the rows.
    With ``row_scale`` ``[B]`` (:func:`perception_row_scale`: ``G_g / N_g``, the size of row
    ``i``'s group over the completion tokens of that group in the whole batch), ``k3_bar =
    mean_i(row_scale_i * sum_t k3_it)``: the official weighting (each image's G completions
    token-averaged on their own, then averaged over images), for minibatches that mix groups. On a
    minibatch of exactly one whole group the two are equal."""
    if log_probs.shape != degraded_log_probs.shape or log_probs.shape != completion_mask.shape:
        raise ValueError(
            "log_probs, degraded_log_probs and completion_mask must share one [B, L] shape, got "
            f"{tuple(log_probs.shape)}, {tuple(degraded_log_probs.shape)} and {tuple(completion_mask.shape)}"
        )
    mask = completion_mask.to(torch.float32)
    k3 = perception_k3(log_probs, degraded_log_probs, clamp)
    if row_scale is None:
        mean = (k3 * mask).sum() / mask.sum().clamp(min=1.0)
    else:
        if row_scale.shape != log_probs.shape[:1]:
            raise ValueError(
                f"row_scale must have shape [{log_probs.shape[0]}], got {tuple(row_scale.shape)}"
            )
        mean = ((k3 * mask).sum(dim=1) * row_scale.to(k3)).mean()
    return -gamma * mean, mean.detach()


def perception_row_scale(token_counts: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``[B]`` ``G_g / N_g`` for each row's group ``g``: ``G_g`` rows holding ``N_g`` completion
    tokens in all (``token_counts`` ``[B]``: each row's, ``completion_mask.sum(1)``; ``group_ids``
    ``[B]``; both over the whole batch). The ``row_scale`` of :func:`perception_term` that makes any
    split of the batch into minibatches average the perception k3 per image, as the official
    trainer does on one image's completions."""
    group_ids = group_ids.long().flatten().cpu()
    size = int(group_ids.max()) + 1 if group_ids.numel() else 0
    group_tokens = torch.zeros(size).index_add_(0, group_ids, token_counts.float().flatten().cpu())
    group_rows = torch.zeros(size).index_add_(0, group_ids, torch.ones(len(group_ids)))
    return (group_rows / group_tokens.clamp(min=1.0))[group_ids]


def cosine_annealed(base: float, progress: float, horizon: float) -> float:
    """``base * (1 + cos(pi * min(progress / horizon, 1))) / 2``: ``base`` at 0, 0 from ``horizon`` on
    (the official trainer anneals ``gamma`` over epochs, to 0 at ``perception_loss_kl_zero_epoch``).
    ``horizon <= 0``: ``base`` throughout (no annealing)."""
    if horizon <= 0:
        return base
    t = min(max(progress, 0.0) / horizon, 1.0)
    return base * 0.5 * (1.0 + math.cos(math.pi * t))
