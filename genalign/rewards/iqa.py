"""Image-quality rewards: rating-word expectations from a VLM (Q-Align, Q-Boost) and CLIP-IQA.

**``iqa``: the expected rating of a VLM.** Q-Align (Wu et al., "Q-Align: Teaching LMMs for Visual
Scoring via Discrete Text-Defined Levels", 2023; inference, from levels to a score): ask "How
would you rate the quality of this image?", start the answer with "The quality of the image is",
take the logits x_i of the rating words at the next position and return the expected level::

    score = sum_i softmax(x)_i * v_i,   words (excellent, good, fair, poor, bad), v = (5, 4, 3, 2, 1)

so the score is in [1, 5] (``rescale=True`` maps it to [0, 1]: (score - 1) / 4).

Q-Boost (Zhang et al., "Q-Boost: On Visual Quality Assessment Ability of Low-level Multi-Modality
Foundation Models", 2023) adds two things, both expressed here as an ensemble:

* *Triadic-tone integration*: instead of the binary positive/negative softmax of Q-Bench (good vs
  poor), a neutral middle word is added, and the score is the expectation over the three tones,
  ``softmax(x_good, x_average, x_poor) . (1, 0.5, 0)`` (our reading of the paper; the level words
  and values are configurable, and a list of level sets is averaged).
* *Multi-prompt ensemble*: several quality-centric (question, answer prefix) pairs are scored and
  their expectations averaged.

The reward is the mean over all (prompt, level set) members of their expectations: one forward
pass per prompt, every level set read from the same logits. Prompts with positive, neutral and
negative phrasings can be ensembled the same way (pass them as ``prompts``).

Word ids are robust to tokenizer variants (:func:`~genalign.rewards.vlm.resolve_word_ids`): a
word's probability sums its surface forms' ids ("good", " good"); a word that is never a single
token is represented by the first token of its forms (Q-Align itself reads the first token of
each word).

**Uncertainty (Q-Hawkeye).** With ``num_samples = N > 0``, N ratings per image are sampled from
the rating-word distribution at temperature T (what generating the rating token with sampling
would give) — one word per ensemble member, averaged like the score — and ``details`` reports
their mean ``score_mean`` and population variance ``score_var``, plus ``uncertainty_weight``,
Q-Hawkeye's per-sample scale of the GRPO advantages (:func:`uncertainty_weights`).

**A trained judge's answer (``preset="answer"``).** A Q-Hawkeye judge (``train.method:
q_hawkeye``) answers in text: the reward asks it ``question`` about each image (the user turn
image-then-text, as the ``language`` policy renders it), decodes greedily up to ``max_new_tokens``
and returns the number in the first ``<answer>...</answer>`` clamped to ``answer_range``
(default [1, 5]); a completion without one scores the range's floor (counted in
``details["answer_parsed"]``). With ``num_samples`` N > 0 the score is the mean of the numbers
parsed from N completions sampled at ``sample_temperature`` (seeded by ``seed``): the expected
answer of the distribution the judge learnt, where greedy decoding picks each digit alone.
``readout="expected"`` (ours, not Q-Hawkeye's) reads that expectation without sampling: each digit
of the answer's number is replaced by its expected value under the judge's next-token distribution
(temperature 1) over the ten digit tokens at that position, given the completion up to it, and
weighted by its place, ``score = sum_k 10^(p_k) sum_d d P(d | completion before digit k)``; one
more forward per answer (with ``num_samples``, per sampled completion), teacher-forced through its
last digit, whose logits before each digit are read at once (one forward per digit where the
tokenizer merges characters across a digit's cut). As Q-Align's expectation over rating words, it
turns ties between written numbers (2.00 against 2.00) into an order, and makes the reward a
smooth function of the image for a generator's RL; it needs a tokenizer that writes one digit per
token (Qwen2's does). ``preset=None`` (the default) reads ``iqa_judge.json`` in the
model folder, which a ``q_hawkeye`` run writes into its ``final/`` with the question and token
budget it trained with, so ``load_reward("iqa", model="runs/RUN/final")`` asks the judge what it
learnt to answer; a folder without that file gets ``qalign``.

**``clip_iqa``.** Wang et al., "Exploring CLIP for Assessing the Look and Feel of Images",
AAAI 2023 (antonym prompt pairing): with antonym prompts ("Good photo.", "Bad photo."), the
score is the softmax probability of the positive prompt over the pair, ``s = softmax(t * cos(x,
p_pos), t * cos(x, p_neg))_0`` with t the CLIP logit scale; several pairs are averaged (as
IQA-PyTorch's re-implementation does). Differentiable.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from genalign.algorithms.q_hawkeye import QHAWKEYE_PROMPT, answer_digit_places, parse_answer_score
from genalign.rewards.base import RewardOutput, register_reward
from genalign.rewards.clip_models import CLIPBackendReward
from genalign.rewards.vlm import (
    RATING_TEMPLATES,
    VLMJudgeReward,
    aggregate_word_logits,
)

logger = logging.getLogger(__name__)

QALIGN_LEVELS = {"excellent": 5.0, "good": 4.0, "fair": 3.0, "poor": 2.0, "bad": 1.0}
QALIGN_PROMPTS = (("How would you rate the quality of this image?", "The quality of the image is"),)
QBOOST_LEVELS = {"good": 1.0, "average": 0.5, "poor": 0.0}
QBOOST_PROMPTS = (
    ("Rate the quality of the image.", "The quality of the image is"),
    ("How would you rate the quality of this image?", "The quality of the image is"),
    ("Evaluate the visual quality of this image.", "The visual quality of the image is"),
    ("Judge the clarity and the distortions of this image.", "The clarity of the image is"),
)
PRESETS: dict[str, tuple[tuple[tuple[str, str], ...], tuple[Mapping[str, float], ...]]] = {
    "qalign": (QALIGN_PROMPTS, (QALIGN_LEVELS,)),
    "qboost": (QBOOST_PROMPTS, (QBOOST_LEVELS,)),
}
ANSWER_PRESET = "answer"  # a trained judge's <answer> (module docstring)
READOUTS = ("text", "expected")  # how the answer preset reads the number (module docstring)
JUDGE_FILE = "iqa_judge.json"  # a q_hawkeye run's final/ holds its question and token budget
JUDGE_KEYS = ("preset", "question", "max_new_tokens", "answer_range", "system_prompt")


def judge_settings(model: Any) -> dict[str, Any]:
    """The ``iqa_judge.json`` of a model folder (empty when ``model`` is not a folder holding one);
    unknown keys fail naming the file."""
    if not isinstance(model, (str, os.PathLike)) or not (Path(model) / JUDGE_FILE).is_file():
        return {}
    path = Path(model) / JUDGE_FILE
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from error
    unknown = sorted(set(settings) - set(JUDGE_KEYS)) if isinstance(settings, dict) else ["<not an object>"]
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; known: {list(JUDGE_KEYS)}")
    return settings


# -- Q-Hawkeye -------------------------------------------------------------------------------------


def rollout_variance(scores: torch.Tensor) -> torch.Tensor:
    """Population variance over the last dim, ignoring NaNs (unparsable rollouts); 0 with < 2 valid.

    ``scores``: ``[..., N]`` rollout scores -> ``[...]``.
    """
    valid = ~torch.isnan(scores)
    count = valid.sum(-1)
    filled = torch.where(valid, scores, torch.zeros_like(scores))
    mean = filled.sum(-1) / count.clamp(min=1)
    squares = torch.where(valid, (scores - mean.unsqueeze(-1)) ** 2, torch.zeros_like(scores))
    variance = squares.sum(-1) / count.clamp(min=1)
    return torch.where(count > 1, variance, torch.zeros_like(variance))


def uncertainty_weights(
    variance: torch.Tensor, score_min: float = 1.0, score_max: float = 5.0, alpha: float = 0.2
) -> torch.Tensor:
    """Q-Hawkeye's uncertainty-aware advantage scale (Xie et al. 2026, uncertainty-aware dynamic
    optimisation; ``use_ua_grpo`` in the official trainer)::

        u = clip(Var / (0.25 * (score_max - score_min)^2 + 1e-8), 0, 1)
        w = exp(-alpha * u)                          # in [exp(-alpha), 1]
        advantages_i <- w_i * advantages_i

    ``Var`` is the population variance of the scores predicted across one image's rollouts
    (:func:`rollout_variance`), normalised by the largest variance a score in
    [score_min, score_max] can have; ``alpha`` = 0.2 and the range [1, 5] are the official
    defaults. Same shape as ``variance``.
    """
    if score_max <= score_min:
        raise ValueError(f"score_max must exceed score_min, got [{score_min}, {score_max}]")
    max_variance = 0.25 * (score_max - score_min) ** 2 + 1e-8
    uncertainty = (variance / max_variance).clamp(0.0, 1.0)
    return torch.exp(-alpha * uncertainty)


def _answer_settings(
    settings: Mapping[str, Any], question: str | None, max_new_tokens: int | None, answer_range: Any
) -> dict[str, Any]:
    """The "answer" preset's question, token budget and range: the arguments, else the folder's
    ``iqa_judge.json``, else the defaults; bad values fail naming the argument."""
    question = question if question is not None else settings.get("question", QHAWKEYE_PROMPT)
    tokens = max_new_tokens if max_new_tokens is not None else settings.get("max_new_tokens", 64)
    bounds = answer_range if answer_range is not None else settings.get("answer_range", (1.0, 5.0))
    if not isinstance(question, str) or not question:
        raise ValueError(f"question must be a non-empty string, got {question!r}")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {tokens!r}")
    try:
        low, high = (float(b) for b in bounds)
    except (TypeError, ValueError) as error:
        raise ValueError(f"answer_range must be two numbers (low, high), got {bounds!r}") from error
    if not low < high:
        raise ValueError(f"answer_range must have low < high, got {bounds!r}")
    return {"question": question, "max_new_tokens": tokens, "answer_range": (low, high)}


# -- the VLM rating reward -------------------------------------------------------------------------


def rating_expectation(word_logits: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Q-Align's levels-to-score conversion: ``softmax(word_logits) @ values``; ``[B, K]`` x ``[K]`` -> ``[B]``."""
    return torch.softmax(word_logits, dim=-1) @ values


def _as_level_sets(levels: Any) -> list[dict[str, float]]:
    sets = [levels] if isinstance(levels, Mapping) else list(levels)
    out = []
    for level_set in sets:
        if not isinstance(level_set, Mapping) or len(level_set) < 2:
            raise ValueError(f"each level set must map at least two words to values, got {level_set!r}")
        out.append({str(word): float(value) for word, value in level_set.items()})
    return out


@register_reward("iqa")
class VLMQualityReward(VLMJudgeReward):
    """Expected quality rating of a VLM: Q-Align, Q-Boost (see the module docstring).

    Args:
        model, processor: the VLM (see :class:`~genalign.rewards.vlm.VLMJudgeReward`).
        preset: "qalign" (one prompt, 5 levels, score in [1, 5]), "qboost" (4 prompts, the
            good/average/poor triad, score in [0, 1]); ``prompts`` / ``levels`` override it; or
            "answer" (a trained judge's ``<answer>``, module docstring). None: the model folder's
            ``iqa_judge.json`` if it has one, else "qalign".
        question, max_new_tokens, answer_range: the "answer" preset's question (default the
            folder's ``iqa_judge.json``, else Q-Hawkeye's official prompt), token budget (64) and
            score range ((1, 5)); its ``num_samples`` N > 0 averages the answers of N completions
            sampled at ``sample_temperature`` from ``seed`` (0: one greedy completion).
        readout: how the "answer" preset reads a completion: "text" (the number written) or
            "expected" (each digit replaced by its expectation, module docstring).
        prompts: ``(question, answer_prefix)`` pairs, averaged (multi-prompt ensemble).
        levels: a mapping rating word -> value, or a list of such mappings (averaged).
        rescale: map each expectation to [0, 1] with its level set's min and max. Needed when
            level sets of different ranges are ensembled.
        system_prompt: optional system message.
        num_samples: N > 0 samples N ratings per image for ``score_mean`` / ``score_var``.
        sample_temperature: temperature of the rating-word distribution they are drawn from.
        seed: seed of the sampling generator (None: the global RNG).
        uncertainty_alpha: Q-Hawkeye's alpha for ``details["uncertainty_weight"]``.
        rating_templates: surface forms of the rating words.
        multi_token, strict, **judge_options: the multi-token policy (see
            :func:`~genalign.rewards.vlm.word_token_ids`), raising on NaN scores, and the VLM's
            ``batch_size``, ``pad_to_square``, ``device``, ``dtype``, ``trust_remote_code`` and
            model keyword arguments (see :class:`~genalign.rewards.vlm.VLMJudgeReward`).

    Scores ``[B]`` in [min value, max value] of the levels ([0, 1] with ``rescale``), or the
    answer range. Details: ``answer_parsed`` ``[B]`` (the fraction of completions whose answer held a
    number) and ``answer_var`` (their population variance; "answer"),
    ``member_scores`` ``[B, M]`` (each prompt x level set), and with sampling
    ``score_mean``, ``score_var``, ``uncertainty_weight`` ``[B]`` and ``samples`` ``[B, N]``.
    Not differentiable (images go through the processor as 8-bit PIL images).
    """

    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module,
        processor: str | os.PathLike | Any = None,
        preset: str | None = None,
        prompts: Sequence[tuple[str, str]] | None = None,
        levels: Mapping[str, float] | Sequence[Mapping[str, float]] | None = None,
        rescale: bool = False,
        system_prompt: str | None = None,
        num_samples: int = 0,
        sample_temperature: float = 1.0,
        seed: int | None = None,
        uncertainty_alpha: float = 0.2,
        rating_templates: Sequence[str] = RATING_TEMPLATES,
        question: str | None = None,
        max_new_tokens: int | None = None,
        answer_range: Sequence[float] | None = None,
        readout: str = "text",
        **judge_options: Any,
    ) -> None:
        settings = judge_settings(model) if preset is None else {}
        preset = preset or settings.get("preset", "qalign")
        self.answer: dict[str, Any] | None = None
        if preset == ANSWER_PRESET:
            if prompts is not None or levels is not None:
                raise ValueError("preset 'answer' reads the judge's <answer>: drop prompts and levels")
            if num_samples < 0 or sample_temperature <= 0:
                raise ValueError(
                    f"need num_samples >= 0 and sample_temperature > 0, got {num_samples}, {sample_temperature}"
                )
            super().__init__(model, processor, **judge_options)
            self.answer = _answer_settings(settings, question, max_new_tokens, answer_range)
            self.answer.update(num_samples=int(num_samples), temperature=float(sample_temperature), seed=seed)
            self.answer["digit_ids"] = self._readout_digit_ids(readout)
            self.score_range = self.answer["answer_range"]
            self.system_prompt = system_prompt if system_prompt is not None else settings.get("system_prompt")
            return
        if readout != "text":
            raise ValueError(f"readout {readout!r} reads an answer judge's number: it needs preset 'answer'")
        if preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted([*PRESETS, ANSWER_PRESET])}, got {preset!r}")
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if sample_temperature <= 0:
            raise ValueError(f"sample_temperature must be > 0, got {sample_temperature}")
        preset_prompts, preset_levels = PRESETS[preset]
        chat_prompts = [(str(q), str(a)) for q, a in (prompts if prompts is not None else preset_prompts)]
        if not chat_prompts:
            raise ValueError("prompts must hold at least one (question, answer_prefix) pair")
        level_sets = _as_level_sets(levels if levels is not None else preset_levels)
        ranges = {(min(s.values()), max(s.values())) for s in level_sets}
        if any(lo == hi for lo, hi in ranges):
            raise ValueError(f"a level set has all values equal: {level_sets}")
        if len(ranges) > 1 and not rescale:
            raise ValueError(
                f"level sets span different ranges {sorted(ranges)}; pass rescale=True to average them on [0, 1]"
            )
        super().__init__(model, processor, **judge_options)
        self.prompts = chat_prompts
        self.level_sets = level_sets
        self.rescale = bool(rescale)
        self.score_range = (0.0, 1.0) if rescale else next(iter(ranges))
        self.system_prompt = system_prompt
        self.num_samples = int(num_samples)
        self.sample_temperature = float(sample_temperature)
        self.seed = seed
        self.uncertainty_alpha = float(uncertainty_alpha)
        self.word_ids = [self.answer_word_ids(list(s), rating_templates) for s in self.level_sets]
        self._values = [torch.tensor(list(s.values()), dtype=torch.float32) for s in self.level_sets]

    def chats(self) -> list[tuple[list[dict], str]]:
        """One ``(messages, assistant_prefix)`` per prompt (the same for every image)."""
        out = []
        for question, prefix in self.prompts:
            messages = [self.judge.message("system", self.system_prompt)] if self.system_prompt else []
            messages.append(self.judge.message("user", question, images=1))
            out.append((messages, prefix))
        return out

    def _scaled(self, values: torch.Tensor, level_index: int) -> torch.Tensor:
        if not self.rescale:
            return values
        level_values = self._values[level_index]
        lo, hi = float(level_values.min()), float(level_values.max())
        return (values - lo) / (hi - lo)

    def member_word_logits(self, images: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """``(level set index, [B, K] word logits)`` for every (prompt, level set) member."""
        members = []
        image_lists = [[image] for image in images]
        for messages, prefix in self.chats():
            text = self.judge.render(messages, prefix)
            logits = self.judge.next_token_logits([text] * len(image_lists), image_lists)  # (B, V)
            for index, ids in enumerate(self.word_ids):
                members.append((index, aggregate_word_logits(logits, ids)))
        return members

    def _readout_digit_ids(self, readout: str) -> list[list[int]] | None:
        """None for the "text" readout; the ten digits' token ids for "expected", after checking
        that the tokenizer writes a number one digit per token (else one digit's position could
        not be read)."""
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {list(READOUTS)}, got {readout!r}")
        if readout == "text":
            return None
        pieces = self.judge.tokenizer.tokenize("<answer>2.51</answer>")
        digits_per_piece = [sum(c.isdigit() for c in str(piece)) for piece in pieces]
        if [n for n in digits_per_piece if n] != [1, 1, 1]:
            raise ValueError(
                f"readout 'expected' needs one digit per token, but the tokenizer writes '2.51' as {pieces}"
            )
        return self.answer_word_ids([str(d) for d in range(10)], ("{w}",))

    def expected_answers(
        self, text: str, completions: Sequence[str], images: Sequence[Any]
    ) -> list[float | None]:
        """The "expected" readout of each completion of ``text`` about ``images[i]`` (None where no
        number parses): one teacher-forced forward per completion, through its answer's last digit,
        whose logits before each digit give that digit's distribution (:meth:`_digit_offsets`).
        Where the tokens of a prefix are not a prefix of the whole's, that completion falls back to
        one next-token forward per digit; the two agree where both apply (tests)."""
        forced: list[tuple[int, str, list[int]]] = []  # (completion, text through its last digit, offsets)
        prefixes: list[tuple[int, str]] = []  # (completion, text before one digit)
        owners: list[tuple[int, float]] = []  # (completion, place value), in logit-row order
        fallback: list[tuple[int, float]] = []
        for index, completion in enumerate(completions):
            places = answer_digit_places(completion) or []
            if not places:
                continue
            through = text + completion[: places[-1][0] + 1]
            offsets = self._digit_offsets(through, [text + completion[:offset] for offset, _ in places])
            if offsets is None:
                prefixes.extend((index, text + completion[:offset]) for offset, _ in places)
                fallback.extend((index, place) for _, place in places)
            else:
                forced.append((index, through, offsets))
                owners.extend((index, place) for _, place in places)
        logits = []
        if forced:
            texts, offsets = [t for _, t, _ in forced], [o for _, _, o in forced]
            logits += self.judge.logits_from_end(texts, [[images[i]] for i, _, _ in forced], offsets)
        if prefixes:
            texts = [t for _, t in prefixes]
            logits.append(self.judge.next_token_logits(texts, [[images[i]] for i, _ in prefixes]))
        values: list[float | None] = [None] * len(completions)
        if not logits:
            return values
        probs = aggregate_word_logits(torch.cat(logits), self.answer["digit_ids"]).softmax(dim=-1)  # (Q, 10)
        digits = (probs @ torch.arange(10, dtype=probs.dtype, device=probs.device)).cpu().tolist()
        for (index, place), digit in zip(owners + fallback, digits):
            values[index] = (values[index] or 0.0) + place * digit
        return values

    def _digit_offsets(self, whole: str, prefixes: Sequence[str]) -> list[int] | None:
        """Where the logits predicting the token after each of ``prefixes`` stand in ``whole``,
        counted back from its last token (:meth:`VLMJudge.logits_from_end`): the whole's token count
        minus the prefix's. None when a prefix's tokens are not the whole's first tokens (a merge
        across the cut), where that count would point elsewhere. An image placeholder expands alike
        in the whole and its prefixes, so counting the text's tokens suffices."""
        tokenize = self.judge.tokenizer
        tokens = list(tokenize(whole)["input_ids"])
        out = []
        for prefix in prefixes:
            head = list(tokenize(prefix)["input_ids"])
            if tokens[: len(head)] != head:
                return None
            out.append(len(tokens) - len(head))
        return out

    def answer_scores(self, images: torch.Tensor) -> RewardOutput:
        """The "answer" preset (module docstring): each image's greedy ``<answer>`` number, clamped;
        with ``num_samples`` N, the mean of the numbers parsed from N sampled completions; each
        number read as ``readout`` says."""
        settings = self.answer
        messages = [self.judge.message("system", self.system_prompt)] if self.system_prompt else []
        messages.append(self.judge.message("user", settings["question"], images=1))
        text = self.judge.render(messages)
        copies = max(settings["num_samples"], 1)
        temperature = settings["temperature"] if settings["num_samples"] else None
        completions = self.judge.generate(
            [text] * (len(images) * copies),
            [[image] for image in images for _ in range(copies)],
            settings["max_new_tokens"],
            temperature,
            settings["seed"],
        )
        low, high = settings["answer_range"]
        if settings["digit_ids"] is None:
            parsed = [parse_answer_score(completion) for completion in completions]
        else:
            owners = [image for image in images for _ in range(copies)]
            parsed = self.expected_answers(text, completions, owners)
        values = torch.tensor([float("nan") if v is None else min(max(v, low), high) for v in parsed])
        values = values.view(len(images), copies)
        found = ~torch.isnan(values)
        mean = torch.where(found, values, torch.zeros_like(values)).sum(-1) / found.sum(-1).clamp(min=1)
        scores = torch.where(found.any(-1), mean, torch.full_like(mean, low))
        details = {"answer_parsed": found.float().mean(-1), "answer_var": rollout_variance(values)}
        return RewardOutput(scores.float(), details)

    def score(self, images: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        if self.answer is not None:
            return self.answer_scores(images)
        members = self.member_word_logits(images)
        expectations = []
        for index, word_logits in members:
            values = self._values[index].to(word_logits.device)
            expectations.append(self._scaled(rating_expectation(word_logits, values), index))  # (B,)
        member_scores = torch.stack(expectations, dim=-1)  # (B, M)
        details: dict[str, Any] = {"member_scores": member_scores}
        if self.num_samples:
            samples = self.sample_ratings(members)  # (B, N)
            variance = samples.var(dim=-1, unbiased=False)
            details.update(
                score_mean=samples.mean(dim=-1),
                score_var=variance,
                uncertainty_weight=uncertainty_weights(
                    variance, *self.score_range, alpha=self.uncertainty_alpha
                ),
                samples=samples,
            )
        return RewardOutput(member_scores.mean(dim=-1), details)

    def sample_ratings(self, members: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
        """``[B, N]`` sampled scores: per sample, one rating word drawn from each member's
        ``softmax(word_logits / T)``, its value (rescaled if asked), averaged over members — so
        the expectation of a sample is the score at T = 1."""
        generator = None
        if self.seed is not None:
            generator = torch.Generator().manual_seed(self.seed)
        draws = []
        for index, word_logits in members:
            probs = torch.softmax(word_logits.float().cpu() / self.sample_temperature, dim=-1)  # (B, K)
            picks = torch.multinomial(
                probs, self.num_samples, replacement=True, generator=generator
            )  # (B, N)
            draws.append(self._scaled(self._values[index][picks], index))
        return torch.stack(draws, dim=0).mean(dim=0).to(members[0][1].device)

    def extra_repr(self) -> str:
        if self.answer is not None:
            return f"preset=answer, max_new_tokens={self.answer['max_new_tokens']}, range={self.answer['answer_range']}"
        words = [list(s) for s in self.level_sets]
        return f"prompts={len(self.prompts)}, levels={words}, rescale={self.rescale}, num_samples={self.num_samples}"


# -- CLIP-IQA --------------------------------------------------------------------------------------

CLIP_IQA_PAIRS = (("Good photo.", "Bad photo."),)
# IQA-PyTorch's ensemble for its re-implementation of CLIP-IQA
CLIP_IQA_ENSEMBLE_PAIRS = (
    ("Good photo.", "Bad photo."),
    ("High quality.", "Low quality."),
    ("Sharp photo.", "Blurry photo."),
)
CLIP_IQA_DEFAULT_MODELS = {"open_clip": "RN50", "transformers": "openai/clip-vit-base-patch32"}


@register_reward("clip_iqa")
class CLIPIQAReward(CLIPBackendReward):
    """CLIP-IQA (Wang et al., AAAI 2023): P(positive prompt) over antonym prompt pairs.

    Args:
        backend: "open_clip" or "transformers".
        model: CLIP model (open_clip name or transformers hub id / folder); default the paper's
            RN50 (open_clip) or ``openai/clip-vit-base-patch32`` (transformers).
        prompt_pairs: ``(positive, negative)`` prompts, averaged; default ("Good photo.", "Bad photo.").
        logit_scale: temperature t multiplying the cosines; default the model's own (100 for
            OpenAI CLIP).
        pretrained, model_config, processor, device, dtype, strict, **backend_kwargs: as
            :class:`~genalign.rewards.clip_models.CLIPBackendReward` takes them.

    Scores ``[B]`` in [0, 1]; ``details["pair_probs"]`` ``[B, P]``. Differentiable w.r.t. the
    images. Images are resized and cropped to the model's input size by the shared tensor
    preprocessing (the official RN50 variant instead drops the attention-pool positional
    embedding to take images at any size).
    """

    default_models = CLIP_IQA_DEFAULT_MODELS

    def __init__(
        self,
        backend: str = "open_clip",
        model: str | os.PathLike | torch.nn.Module | None = None,
        prompt_pairs: Sequence[tuple[str, str]] = CLIP_IQA_PAIRS,
        logit_scale: float | None = None,
        **embedder_options: Any,
    ) -> None:
        pairs = [tuple(pair) for pair in prompt_pairs]
        if not pairs or any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"prompt_pairs must be (positive, negative) pairs, got {prompt_pairs!r}")
        super().__init__(backend, model, **embedder_options)
        self.prompt_pairs = pairs
        self.fixed_logit_scale = logit_scale

    def score(self, images: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        texts = [text for pair in self.prompt_pairs for text in pair]  # (2P,) positive, negative, ...
        image_features = F.normalize(self.embedder.encode_images(images), dim=-1)  # (B, D)
        text_features = F.normalize(self.embedder.encode_texts(texts), dim=-1)  # (2P, D)
        scale = self.fixed_logit_scale
        scale = self.embedder.logit_scale() if scale is None else torch.tensor(float(scale))
        logits = scale.to(image_features.device) * image_features @ text_features.T  # (B, 2P)
        # Wang et al. 2023: softmax over each antonym pair, probability of the positive prompt
        pair_probs = logits.view(logits.shape[0], -1, 2).softmax(dim=-1)[..., 0]  # (B, P)
        return RewardOutput(pair_probs.mean(dim=-1), {"pair_probs": pair_probs.detach()})

    def extra_repr(self) -> str:
        return f"prompt_pairs={self.prompt_pairs}, logit_scale={self.fixed_logit_scale}"


# Deprecated aliases: class names spell acronyms in upper case (#22); the old names keep working.
ClipIQAReward = CLIPIQAReward
