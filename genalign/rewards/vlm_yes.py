"""``vlm_yes``: the probability that a VLM answers "yes" — VQAScore and RewardDance.

**Pointwise (VQAScore).** Lin et al., "Evaluating Text-to-Visual Generation with Image-to-Text
Generation", ECCV 2024 (the VQAScore definition)::

    VQAScore(image, text) = P("Yes" | image, 'Does this figure show "{text}"? Please answer yes or no.')

read from the VLM's next-token distribution at the first answer position (t2v_metrics takes the
softmax over the whole vocabulary and the first token of "Yes").

**Comparative (RewardDance).** Wu et al., "RewardDance: Reward Scaling in Visual Generation", 2025
(the generative reward paradigm): the reward of a candidate image is the probability of "yes"
to the question whether it is better than a reference image under task criteria::

    r(x_candidate) = P("yes" | x_candidate, x_reference, prompt, criteria)

The reference comes from the caller (``reference_images`` in the metadata: a fixed image per
prompt, the base model's sample, ...) or from the candidate's own group (``group_ids``):

* ``reference="group_best"``: every member is compared with the best *other* member of its group,
  "best" by the pointwise score (one extra pass with VQAScore's question and no system prompt,
  examples or reasoning: a best-of-N reference drawn from the group itself);
* ``reference="group_mean"``: every member is compared with each other member of its group and
  the probabilities are averaged (G - 1 comparisons per member).

**Context scaling** (RewardDance): task instructions as a system prompt, in-context
examples (``(images, question, answer)`` turns put before the question), and chain of thought:
with ``cot_max_new_tokens > 0`` the model first writes up to that many tokens of reasoning
(greedy) after ``cot_instruction``; the reasoning becomes the assistant's turn, a user turn with
``judgement_prompt`` follows, and P("yes") is read at the position after it. The reasoning is
decoded to text (special and image tokens dropped) and rendered back into the chat, so where a
tokenizer does not round-trip its tokens can differ from the generated ones.

**Normalisation.** ``normalize="yes_no"``: P(yes) / (P(yes) + P(no)), i.e. the softmax over the
two word logits; ``"raw"``: P(yes) over the whole vocabulary (VQAScore's convention). P(word)
sums the probabilities of all token ids that begin the word's surface forms ("yes", " yes",
"Yes", " Yes", "YES", " YES"; see :func:`~genalign.rewards.vlm.resolve_word_ids`). With
``yes_words=("Yes",)``, ``answer_templates=("{w}",)``, ``normalize="raw"`` and the default question
this is VQAScore exactly.

Scores ``[B]`` in [0, 1]. Not differentiable: images reach the VLM through its processor as
8-bit PIL images.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from genalign.rewards.base import RewardOutput, register_reward, validate_images
from genalign.rewards.vlm import (
    YES_NO_TEMPLATES,
    VLMJudgeReward,
    aggregate_word_logits,
    as_image_list,
)

logger = logging.getLogger(__name__)

MODES = ("pointwise", "comparative")
NORMALIZATIONS = ("yes_no", "raw")
REFERENCES = ("metadata", "group_best", "group_mean")

VQASCORE_QUESTION = 'Does this figure show "{prompt}"? Please answer yes or no.'
COMPARATIVE_QUESTION = (
    'Both images were generated for the prompt "{prompt}". '
    "Is Image 1 better than Image 2 in terms of {criteria}? Please answer yes or no."
)
DEFAULT_CRITERIA = "alignment with the prompt and overall visual quality"
IMAGE_LABELS = ("Image 1:", "\nImage 2:")
COT_INSTRUCTION = "\nThink step by step before you answer."
JUDGEMENT_PROMPT = "Based on your reasoning, answer yes or no."


def group_members(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Indices of each group, in batch order."""
    members: dict[Hashable, list[int]] = {}
    for index, group in enumerate(group_ids):
        members.setdefault(group, []).append(index)
    return members


def _as_group_ids(group_ids: Any, batch: int) -> list[Hashable]:
    if torch.is_tensor(group_ids):
        group_ids = group_ids.tolist()
    group_ids = list(group_ids)
    if len(group_ids) != batch:
        raise ValueError(f"vlm_yes: group_ids has {len(group_ids)} entries for {batch} images")
    return group_ids


@register_reward("vlm_yes")
class VLMYesReward(VLMJudgeReward):
    """P("yes") from a VLM: VQAScore (pointwise) or RewardDance (comparative).

    Args:
        model, processor: the VLM (see :class:`~genalign.rewards.vlm.VLMJudgeReward`).
        mode: "pointwise" (one image) or "comparative" (candidate and reference).
        question_template: the question; ``{prompt}`` is the generation prompt and, in
            comparative mode, ``{criteria}`` the task criteria. Default: VQAScore's question
            (pointwise) or :data:`COMPARATIVE_QUESTION`.
        criteria: comparative criteria put in the question.
        image_labels: texts before the candidate and the reference image (comparative); None to
            put the two images one after the other.
        reference: where the comparative reference comes from: "metadata" (``reference_images``),
            "group_best" or "group_mean" (from ``group_ids``; see the module docstring).
        system_prompt: task instructions, sent as the system message.
        examples: in-context examples, each ``(images, question, answer)``: images a tensor
            ``[3, H, W]`` / ``[N, 3, H, W]`` in [0, 1], a PIL image, or a list of them; sent as
            user/assistant turns before the question.
        cot_max_new_tokens: 0 for no chain of thought; otherwise the reasoning budget in tokens.
        cot_instruction: appended to the question when reasoning is asked for.
        judgement_prompt: the user turn after the reasoning; P("yes") is read after it.
        answer_prefix: text that starts the assistant's answer before the yes/no position.
        normalize: "yes_no" (P(yes) / (P(yes) + P(no))) or "raw" (P(yes) over the vocabulary).
        yes_words, no_words: the answer words (lower case; several words are synonyms whose
            probabilities add up); their surface forms come from ``answer_templates`` ({w} as
            given, {W} capitalised, {U} upper case).
        multi_token, strict, **judge_options: how a multi-token surface form counts, raising on
            NaN scores, and the VLM's ``batch_size``, ``pad_to_square``, ``device``, ``dtype``,
            ``trust_remote_code`` and model keyword arguments
            (see :class:`~genalign.rewards.vlm.VLMJudgeReward`).

    Metadata: ``reference_images`` ``[B, 3, H, W]`` (or one ``[3, H, W]`` for all) in [0, 1] for
    ``reference="metadata"``; ``group_ids`` (length B) for the group references.

    Details: ``p_yes``, ``p_no`` (``[B]``, over the whole vocabulary, averaged over comparisons),
    ``reference_index`` (group_best), ``reasoning`` (chain of thought: one string per chat, a list
    per image for group_mean).
    """

    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module,
        processor: str | os.PathLike | Any = None,
        mode: str = "pointwise",
        question_template: str | None = None,
        criteria: str = DEFAULT_CRITERIA,
        image_labels: Sequence[str] | None = IMAGE_LABELS,
        reference: str = "metadata",
        system_prompt: str | None = None,
        examples: Sequence[tuple[Any, str, str]] | None = None,
        cot_max_new_tokens: int = 0,
        cot_instruction: str = COT_INSTRUCTION,
        judgement_prompt: str = JUDGEMENT_PROMPT,
        answer_prefix: str = "",
        normalize: str = "yes_no",
        yes_words: Sequence[str] = ("yes",),
        no_words: Sequence[str] = ("no",),
        answer_templates: Sequence[str] = YES_NO_TEMPLATES,
        **judge_options: Any,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
        if reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
        if cot_max_new_tokens < 0:
            raise ValueError(f"cot_max_new_tokens must be >= 0, got {cot_max_new_tokens}")
        if image_labels is not None and len(image_labels) != 2:
            raise ValueError(f"image_labels needs two labels (candidate, reference), got {image_labels!r}")
        if not yes_words or not no_words:
            raise ValueError("yes_words and no_words must each name at least one word")
        super().__init__(model, processor, **judge_options)
        self.mode = mode
        default_question = VQASCORE_QUESTION if mode == "pointwise" else COMPARATIVE_QUESTION
        self.question_template = question_template or default_question
        self.criteria = criteria
        self.image_labels = tuple(image_labels) if image_labels is not None else None
        self.reference = reference
        self.system_prompt = system_prompt
        self.examples = [
            (as_image_list(images, f"example {i}"), str(question), str(answer))
            for i, (images, question, answer) in enumerate(examples or ())
        ]
        self.cot_max_new_tokens = int(cot_max_new_tokens)
        self.cot_instruction = cot_instruction
        self.judgement_prompt = judgement_prompt
        self.answer_prefix = answer_prefix
        self.normalize = normalize
        yes_ids, no_ids = self.answer_word_ids([tuple(yes_words), tuple(no_words)], answer_templates)
        self.yes_ids, self.no_ids = sorted(yes_ids), sorted(no_ids)
        logger.info(
            "vlm_yes: yes tokens %s, no tokens %s",
            self.judge.tokenizer.convert_ids_to_tokens(self.yes_ids),
            self.judge.tokenizer.convert_ids_to_tokens(self.no_ids),
        )

    # -- chats -------------------------------------------------------------------------------------
    def question(self, prompt: str, comparative: bool) -> str:
        if comparative:
            return self.question_template.format(prompt=prompt, criteria=self.criteria)
        return self.question_template.format(prompt=prompt)

    def _context(self) -> tuple[list[dict], list[Any]]:
        """System message and in-context examples: (messages, their images in order)."""
        messages, images = [], []
        if self.system_prompt:
            messages.append(self.judge.message("system", self.system_prompt))
        for example_images, question, answer in self.examples:
            messages.append(self.judge.message("user", question, images=len(example_images)))
            messages.append(self.judge.message("assistant", answer))
            images.extend(example_images)
        return messages, images

    def _question_message(self, question: str, comparative: bool) -> dict:
        if not comparative:
            return self.judge.message("user", question, images=1)
        if self.image_labels is None:
            return self.judge.message("user", question, images=2)
        first, second = self.image_labels
        return self.judge.message("user", parts=[first, None, second, None, "\n" + question])

    def p_yes_no(
        self,
        images: Sequence[Sequence[Any]],
        questions: Sequence[str],
        comparative: bool,
        use_context: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, list[str] | None, torch.Tensor]:
        """Score chats: ``images[i]`` (1 or 2 images) with ``questions[i]``.

        Returns ``(p_yes, p_no, reasoning, yes_share)``: ``[N]`` probabilities over the whole
        vocabulary (float32), the chain-of-thought texts (None without CoT) and ``P(yes) / (P(yes) +
        P(no))`` computed as the softmax over the two word logits (the ratio of the probabilities is
        0/0 when both lie below float32's range, e.g. a judge that expects another token after a
        chain of thought; the softmax stays defined).
        """
        context, context_images = self._context() if use_context else ([], [])
        chats, chat_images = [], []
        cot = use_context and self.cot_max_new_tokens > 0
        for sample_images, question in zip(images, questions):
            if cot:
                question = question + self.cot_instruction
            chats.append(context + [self._question_message(question, comparative)])
            chat_images.append(list(context_images) + list(sample_images))
        reasoning = None
        if cot:
            texts = [self.judge.render(chat) for chat in chats]
            reasoning = self.judge.generate(texts, chat_images, self.cot_max_new_tokens)
            chats = [
                chat
                + [
                    self.judge.message("assistant", thought),
                    self.judge.message("user", self.judgement_prompt),
                ]
                for chat, thought in zip(chats, reasoning)
            ]
        texts = [self.judge.render(chat, self.answer_prefix) for chat in chats]
        logits = self.judge.next_token_logits(texts, chat_images)  # (N, V)
        log_z = torch.logsumexp(logits, dim=-1)  # (N,)
        word_logits = aggregate_word_logits(logits, [self.yes_ids, self.no_ids])  # (N, 2)
        p_yes, p_no = (word_logits - log_z[:, None]).exp().unbind(-1)
        return p_yes, p_no, reasoning, torch.softmax(word_logits, dim=-1)[:, 0]

    def _reward(self, p_yes: torch.Tensor, yes_share: torch.Tensor) -> torch.Tensor:
        return p_yes if self.normalize == "raw" else yes_share

    # -- the reward --------------------------------------------------------------------------------
    def score(self, images: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        batch = images.shape[0]
        if self.mode == "pointwise":
            questions = [self.question(prompt, comparative=False) for prompt in prompts]
            p_yes, p_no, reasoning, share = self.p_yes_no(
                [[image] for image in images], questions, comparative=False
            )
            details: dict[str, Any] = {"p_yes": p_yes, "p_no": p_no}
            if reasoning is not None:
                details["reasoning"] = reasoning
            return RewardOutput(self._reward(p_yes, share), details)

        # comparative: (candidate, reference) index pairs or reference images
        candidates, references, reference_index = self._pairs(images, prompts, metadata)
        questions = [self.question(prompts[i], comparative=True) for i in candidates]
        p_yes, p_no, reasoning, share = self.p_yes_no(
            [[images[i], reference] for i, reference in zip(candidates, references)],
            questions,
            comparative=True,
        )
        rewards = self._reward(p_yes, share)
        index = torch.as_tensor(candidates, device=rewards.device)
        counts = torch.zeros(batch, device=rewards.device).index_add_(0, index, torch.ones_like(rewards))

        def per_image(values: torch.Tensor) -> torch.Tensor:  # mean over each image's comparisons
            return torch.zeros(batch, device=values.device).index_add_(0, index, values) / counts

        details = {"p_yes": per_image(p_yes), "p_no": per_image(p_no)}
        if reference_index is not None:
            details["reference_index"] = reference_index
        if reasoning is not None:
            if len(candidates) == batch:
                details["reasoning"] = reasoning
            else:
                grouped: list[list[str]] = [[] for _ in range(batch)]
                for i, thought in zip(candidates, reasoning):
                    grouped[i].append(thought)
                details["reasoning"] = grouped
        return RewardOutput(per_image(rewards), details)

    def _pairs(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: dict[str, Any]
    ) -> tuple[list[int], list[Any], list[int] | None]:
        """Comparisons to run: candidate indices, their reference images, and (group_best) the
        reference index of each image."""
        batch = images.shape[0]
        if self.reference == "metadata":
            references = metadata.get("reference_images")
            if references is None:
                raise ValueError(
                    "vlm_yes (comparative, reference='metadata') needs metadata 'reference_images' "
                    "([B, 3, H, W] in [0, 1]); or use reference='group_best'/'group_mean' with 'group_ids'"
                )
            if not torch.is_tensor(references):
                raise ValueError(
                    f"reference_images must be a tensor [B, 3, H, W], got {type(references).__name__}"
                )
            if references.ndim == 3:
                references = references.unsqueeze(0)
            validate_images(references)
            if references.shape[0] == 1 and batch > 1:
                references = references.expand(batch, -1, -1, -1)
            if references.shape[0] != batch:
                raise ValueError(
                    f"reference_images has {references.shape[0]} images (shape {tuple(references.shape)}) "
                    f"for {batch} candidates"
                )
            return list(range(batch)), list(references), None

        group_ids = metadata.get("group_ids")
        if group_ids is None:
            raise ValueError(
                f"vlm_yes (comparative, reference={self.reference!r}) needs metadata 'group_ids'"
            )
        group_ids = _as_group_ids(group_ids, batch)
        members = group_members(group_ids)
        lonely = [group for group, indices in members.items() if len(indices) < 2]
        if lonely:
            raise ValueError(
                f"vlm_yes (reference={self.reference!r}): groups {lonely} have a single member, "
                "so there is no other member to compare with"
            )
        if self.reference == "group_mean":
            pairs = [(i, j) for indices in members.values() for i in indices for j in indices if j != i]
            pairs.sort()
            return [i for i, _ in pairs], [images[j] for _, j in pairs], None
        # group_best: pointwise pass (VQAScore question, no extra context), best other member
        questions = [VQASCORE_QUESTION.format(prompt=prompt) for prompt in prompts]
        p_yes, _, _, share = self.p_yes_no([[image] for image in images], questions, False, use_context=False)
        pointwise = self._reward(p_yes, share).tolist()
        reference_index = []
        for i in range(batch):
            others = [j for j in members[group_ids[i]] if j != i]
            reference_index.append(max(others, key=lambda j: (pointwise[j], -j)))
        return list(range(batch)), [images[j] for j in reference_index], reference_index

    def extra_repr(self) -> str:
        return (
            f"mode={self.mode!r}, reference={self.reference!r}, normalize={self.normalize!r}, "
            f"cot_max_new_tokens={self.cot_max_new_tokens}, examples={len(self.examples)}"
        )
