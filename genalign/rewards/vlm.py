"""Shared plumbing for rewards read off a vision-language model's next-token distribution.

VQAScore (Lin et al. 2024), RewardDance (Wu et al. 2025), Q-Align (Wu et al. 2023) and Q-Boost
(Zhang et al. 2023) all score an image the same way: render a chat with the image(s) and a
question, run the VLM once, and read the logits of a few answer words ("yes"/"no", or rating words
such as "excellent" ... "bad") at the position where the answer would start. This module does
that for any transformers VLM that has a processor and a chat template::

    judge = VLMJudge("Qwen/Qwen2-VL-2B-Instruct")          # hub id, folder, or (model, processor)
    chat = [judge.message("user", images=1, text="Is this a cat? Answer yes or no.")]
    text = judge.render(chat)                               # chat template + generation prompt
    logits = judge.next_token_logits([text], [[pil_image]]) # (B, V) float32, the answer position
    ids = resolve_word_ids(judge.tokenizer, ["yes", "no"], YES_NO_TEMPLATES)
    word_logits = aggregate_word_logits(logits, ids)        # (B, 2): logsumexp over each word's ids

Conventions:

* Images arrive as float tensors ``[B, 3, H, W]`` in [0, 1] and are handed to the processor as
  uint8 PIL images (:func:`to_pil_images`), the form every VLM's processor was written for. That
  conversion rounds to 8 bits and leaves the autograd graph, so these rewards are **not
  differentiable**.
* Batches are padded on the left (the tokenizer's ``padding_side`` is set to ``"left"``), so the
  last position of every row is its answer position. Rotary-position models (LLaMA, Qwen2, and the
  LLaVA / Qwen2-VL / Idefics3 families built on them) are invariant to the shift left padding
  causes; models with their own position handling (Qwen2-VL's 3-D RoPE) compute it from the
  attention mask. Tests check that a batch equals its rows scored one at a time.
* Word lookup is robust to tokenizer variants (:func:`resolve_word_ids`): a word is the set of
  token ids of its surface forms ("yes", " yes", "Yes", " Yes", "YES", ...) that are single
  tokens; a form that splits into several tokens contributes its *first* token (policy
  ``multi_token``), since that is the token the model must emit first to say it. A word's logit is
  the log-sum-exp of its ids' logits, i.e. its probability is the sum of theirs.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from PIL import Image

from genalign.rewards.base import Reward
from genalign.rewards.checkpoints import pretrained_source

logger = logging.getLogger(__name__)

ImageLike = torch.Tensor | Image.Image
MULTI_TOKEN_POLICIES = ("fallback", "first", "skip")
# Surface forms of a word: {w} as given (lower case), {W} capitalised, {U} upper case.
YES_NO_TEMPLATES = ("{w}", " {w}", "{W}", " {W}", "{U}", " {U}")
RATING_TEMPLATES = ("{w}", " {w}")


# -- images ----------------------------------------------------------------------------------------


def pad_to_square(image: torch.Tensor, fill: Sequence[float]) -> torch.Tensor:
    """Pad ``[3, H, W]`` to a centred square with colour ``fill`` (LLaVA-1.5's ``expand2square``)."""
    _, height, width = image.shape
    if height == width:
        return image
    side = max(height, width)
    canvas = torch.as_tensor(fill, dtype=image.dtype, device=image.device).view(3, 1, 1)
    canvas = canvas.expand(3, side, side).clone()
    top, left = (side - height) // 2, (side - width) // 2
    canvas[:, top : top + height, left : left + width] = image
    return canvas


def to_pil_images(images: torch.Tensor | Iterable[ImageLike], square_fill: Sequence[float] | None = None):
    """``[B, 3, H, W]`` (or ``[3, H, W]``, or a list of tensors / PIL images) in [0, 1] -> RGB PIL list.

    Values are rounded to uint8 (``round(255 * x)``), as saving an image would. With
    ``square_fill`` (an RGB triple in [0, 1]) each image is first padded to a square of that colour,
    as LLaVA-1.5 and Q-Align do with the image mean.
    """
    if torch.is_tensor(images):
        images = images.unsqueeze(0) if images.ndim == 3 else images
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images of shape [B, 3, H, W], got {tuple(images.shape)}")
    out = []
    for image in images:
        if isinstance(image, Image.Image):
            image = image.convert("RGB")
            if square_fill is not None and image.width != image.height:
                side = max(image.size)
                canvas = Image.new("RGB", (side, side), tuple(int(round(255 * c)) for c in square_fill))
                canvas.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
                image = canvas
            out.append(image)
            continue
        image = image.detach().float().cpu().clamp(0.0, 1.0)
        if square_fill is not None:
            image = pad_to_square(image, square_fill)
        pixels = (image * 255.0).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
        out.append(Image.fromarray(pixels))
    return out


def as_image_list(value: Any, what: str) -> list[ImageLike]:
    """One image or several (``[3, H, W]``, ``[N, 3, H, W]``, PIL, or a list of those) -> a list."""
    if isinstance(value, Image.Image):
        return [value]
    if torch.is_tensor(value):
        if value.ndim == 3:
            return [value]
        if value.ndim == 4:
            return list(value)
        raise ValueError(
            f"{what}: expected an image [3, H, W] or images [N, 3, H, W], got {tuple(value.shape)}"
        )
    if isinstance(value, (list, tuple)):
        return [image for item in value for image in as_image_list(item, what)]
    raise ValueError(f"{what}: expected a tensor or PIL image, got {type(value).__name__}")


# -- token ids of answer words ---------------------------------------------------------------------


def surface_forms(word: str, templates: Sequence[str]) -> list[str]:
    """The distinct strings ``templates`` make of ``word`` ({w} as given, {W} capitalised, {U} upper)."""
    forms = [t.format(w=word, W=word[:1].upper() + word[1:], U=word.upper()) for t in templates]
    return list(dict.fromkeys(forms))


def word_token_ids(
    tokenizer: Any, word: str, templates: Sequence[str] = ("{w}",), multi_token: str = "fallback"
) -> list[int]:
    """Token ids that begin ``word`` in any of its surface forms.

    Each form is encoded without special tokens. A form that is one token contributes that id. A
    form that splits into several tokens contributes its first token, according to
    ``multi_token``: ``"first"`` always, ``"fallback"`` only when no form of the word is a single
    token (the default: on real vocabularies "Yes" and "yes" are single tokens, and the first
    piece of a split form, such as "Y", begins many other words), ``"skip"`` never.
    """
    if multi_token not in MULTI_TOKEN_POLICIES:
        raise ValueError(f"multi_token must be one of {MULTI_TOKEN_POLICIES}, got {multi_token!r}")
    single, first = [], []
    for form in surface_forms(word, templates):
        ids = tokenizer.encode(form, add_special_tokens=False)
        if len(ids) == 1:
            single.append(int(ids[0]))
        elif ids:
            first.append(int(ids[0]))
    if multi_token == "first" or (multi_token == "fallback" and not single):
        single += first
    return list(dict.fromkeys(single))


def resolve_word_ids(
    tokenizer: Any,
    words: Sequence[str | Sequence[str]],
    templates: Sequence[str] = ("{w}",),
    multi_token: str = "fallback",
) -> list[list[int]]:
    """Token ids of each answer (see :func:`word_token_ids`), with ids shared between answers removed.

    An answer is a word or a tuple of synonyms (``("yes", "yeah")``) whose ids are pooled. A
    token that begins two different answers (the bare-space piece of " Yes" and " No" in a small
    BPE, say) cannot vote for either, so it is dropped from both with a warning. An answer left
    with no id is an error naming it and how its forms tokenize.
    """
    answers = [(word,) if isinstance(word, str) else tuple(word) for word in words]
    per_answer = [
        list(
            dict.fromkeys(
                t for word in answer for t in word_token_ids(tokenizer, word, templates, multi_token)
            )
        )
        for answer in answers
    ]
    owners: dict[int, set[int]] = {}
    for index, ids in enumerate(per_answer):
        for token in ids:
            owners.setdefault(token, set()).add(index)
    shared = {token for token, who in owners.items() if len(who) > 1}
    if shared:
        pieces = {
            tokenizer.convert_ids_to_tokens(token): sorted("/".join(answers[i]) for i in owners[token])
            for token in shared
        }
        logger.warning("answer-word tokens shared between answers are ignored: %s", pieces)
    resolved = [[token for token in ids if token not in shared] for ids in per_answer]
    for answer, ids in zip(answers, resolved):
        if not ids:
            forms = {
                form: tokenizer.convert_ids_to_tokens(tokenizer.encode(form, add_special_tokens=False))
                for word in answer
                for form in surface_forms(word, templates)
            }
            raise ValueError(
                f"answer word {'/'.join(answer)!r} has no usable token id (multi_token={multi_token!r}); "
                f"its forms tokenize as {forms}"
            )
    return resolved


def aggregate_word_logits(logits: torch.Tensor, word_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """``[B, V]`` logits -> ``[B, K]``: each word's log-sum-exp over its token ids.

    ``softmax`` of the result over K words is P(word) / sum_k P(word_k) with P(word) the summed
    probability of its tokens; ``result - logsumexp(logits)`` is log P(word) over the vocabulary.
    """
    return torch.stack([torch.logsumexp(logits[:, list(ids)], dim=-1) for ids in word_ids], dim=-1)


# -- loading ---------------------------------------------------------------------------------------


def _as_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    return names.get(dtype) or getattr(torch, str(dtype))


def load_vlm(
    model: str | os.PathLike | torch.nn.Module,
    processor: str | os.PathLike | Any = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    trust_remote_code: bool = False,
    **model_kwargs: Any,
) -> tuple[torch.nn.Module, Any]:
    """A frozen VLM and its processor.

    ``model`` is a hub id or folder loaded with ``AutoModelForImageTextToText`` (LLaVA, Qwen2-VL,
    Idefics3, ...), or a built model (then ``processor`` is required). ``processor`` is a hub id
    or folder for ``AutoProcessor`` (default: ``model``) or a built processor. The model is put in
    eval mode with gradients off; its tokenizer pads on the left.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    if isinstance(model, torch.nn.Module):
        if processor is None:
            raise ValueError("load_vlm: pass processor= together with a built model")
        vlm = model
    else:
        source = pretrained_source(model, "VLM")
        if dtype is not None:
            model_kwargs.setdefault("dtype", _as_dtype(dtype))
        vlm = AutoModelForImageTextToText.from_pretrained(
            source, trust_remote_code=trust_remote_code, **model_kwargs
        )
        processor = source if processor is None else processor
        logger.info("VLM %s loaded from %s", type(vlm).__name__, source)
    if isinstance(processor, (str, os.PathLike)):
        processor = AutoProcessor.from_pretrained(
            pretrained_source(processor, "VLM processor"), trust_remote_code=trust_remote_code
        )
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(
            f"the processor {type(processor).__name__} has no tokenizer; a VLM processor is needed"
        )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    vlm = vlm.eval().requires_grad_(False)
    if device is not None or (dtype is not None and isinstance(model, torch.nn.Module)):
        vlm.to(device=device, dtype=_as_dtype(dtype))
    return vlm, processor


# -- the judge -------------------------------------------------------------------------------------


class VLMJudge(torch.nn.Module):
    """A frozen VLM + processor that renders chats, batches them and reads next-token logits.

    Args:
        model: hub id / folder (``AutoModelForImageTextToText``) or a built model.
        processor: hub id / folder (``AutoProcessor``) or a built processor; default ``model``.
        batch_size: chats per forward pass.
        pad_to_square: pad images to squares of the processor's mean colour before processing
            (LLaVA-1.5 ``image_aspect_ratio="pad"``, Q-Align); otherwise the processor resizes and
            crops as it was configured.
        device, dtype, trust_remote_code, **model_kwargs: passed to :func:`load_vlm`.
    """

    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module,
        processor: str | os.PathLike | Any = None,
        *,
        batch_size: int = 8,
        pad_to_square: bool = False,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        trust_remote_code: bool = False,
        **model_kwargs: Any,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.model, self.processor = load_vlm(
            model, processor, device=device, dtype=dtype, trust_remote_code=trust_remote_code, **model_kwargs
        )
        self.batch_size = int(batch_size)
        self.square_fill = None
        if pad_to_square:
            image_processor = getattr(self.processor, "image_processor", None)
            mean = getattr(image_processor, "image_mean", None) or (0.5, 0.5, 0.5)
            self.square_fill = tuple(float(m) for m in mean)
        forward = inspect.signature(self.model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in forward

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- chats -------------------------------------------------------------------------------------
    @staticmethod
    def message(role: str, text: str = "", images: int = 0, parts: Sequence[Any] | None = None) -> dict:
        """One chat message in transformers' format.

        ``images`` image placeholders come first, then ``text`` (the LLaVA-1.5 order
        "<image>\\nquestion"); or give ``parts`` explicitly, a sequence of strings (text) and
        ``None`` (an image placeholder), e.g. ``["Image 1:", None, "Image 2:", None, question]``.
        The images themselves travel separately, in placeholder order.
        """
        if parts is None:
            parts = [None] * images + ([text] if text else [])
        content = [{"type": "image"} if part is None else {"type": "text", "text": part} for part in parts]
        return {"role": role, "content": content}

    def render(self, messages: Sequence[Mapping[str, Any]], assistant_prefix: str = "") -> str:
        """The chat template applied to ``messages`` with the generation prompt, then ``assistant_prefix``.

        The prefix starts the assistant's answer (Q-Align's "The quality of the image is"), so the
        next token is the answer word. Templates that end the generation prompt on a word
        (LLaVA-1.5's ``ASSISTANT:``, Idefics' ``Assistant:``) get a space before the prefix, as the
        model's own answers start with one (Q-Align's prompt: ``ASSISTANT: The quality of the image
        is``); one that ends on whitespace (ChatML's ``assistant\n``) is followed directly.
        """
        text = self.processor.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        if assistant_prefix and text and not text[-1].isspace() and not assistant_prefix[0].isspace():
            text += " "
        return text + assistant_prefix

    def strip_image_tokens(self, text: str) -> str:
        """Remove the processor's image placeholder strings (generated text must not add images)."""
        for name in ("image_token", "boi_token", "eoi_token"):
            token = getattr(self.processor, name, None)
            if isinstance(token, str) and token:
                text = text.replace(token, "")
        return text

    # -- model calls -------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], images: Sequence[Sequence[ImageLike]]) -> Any:
        """Processor outputs (left padded, on the model's device) for rendered ``texts`` and their images.

        ``images[i]`` are the images of ``texts[i]`` in placeholder order (tensors ``[3, H, W]`` in
        [0, 1] or PIL).
        """
        if len(texts) != len(images):
            raise ValueError(f"got {len(texts)} texts but {len(images)} image lists")
        pil = [to_pil_images(list(sample), self.square_fill) for sample in images]
        if all(len(sample) == 0 for sample in pil):
            inputs = self.processor(text=list(texts), return_tensors="pt", padding=True)
        else:
            inputs = self.processor(text=list(texts), images=pil, return_tensors="pt", padding=True)
        inputs = inputs.to(self.device)
        dtype = next(self.model.parameters()).dtype
        for key, value in inputs.items():
            if torch.is_tensor(value) and value.is_floating_point():
                inputs[key] = value.to(dtype)
        return inputs

    def _chunks(self, count: int) -> Iterable[slice]:
        for start in range(0, count, self.batch_size):
            yield slice(start, min(start + self.batch_size, count))

    @torch.no_grad()
    def next_token_logits(self, texts: Sequence[str], images: Sequence[Sequence[ImageLike]]) -> torch.Tensor:
        """``[B, V]`` float32 logits of the token after each rendered text (the answer position)."""
        rows = []
        for chunk in self._chunks(len(texts)):
            inputs = self.encode(texts[chunk], images[chunk])
            extra = {"logits_to_keep": 1} if self._logits_to_keep else {}
            logits = self.model(**inputs, use_cache=False, **extra).logits  # (b, L or 1, V)
            rows.append(logits[:, -1].float())
        return torch.cat(rows, dim=0)

    @torch.no_grad()
    def logits_from_end(
        self, texts: Sequence[str], images: Sequence[Sequence[ImageLike]], offsets: Sequence[Sequence[int]]
    ) -> list[torch.Tensor]:
        """For each rendered text, the float32 logits ``[len(offsets[i]), V]`` at the positions
        ``offsets[i]`` counted back from its last token (0: the last token's, which predict the token
        after the text; 1: the one before). One teacher-forced forward per text, batched: what
        :meth:`next_token_logits` gives for each prefix of a text, without a forward per prefix."""
        if len(offsets) != len(texts):
            raise ValueError(f"got {len(texts)} texts but {len(offsets)} offset lists")
        rows: list[torch.Tensor] = []
        for chunk in self._chunks(len(texts)):
            inputs = self.encode(texts[chunk], images[chunk])
            wanted = offsets[chunk]
            keep = 1 + max((max(o) for o in wanted if len(o)), default=0)
            extra = {"logits_to_keep": keep} if self._logits_to_keep else {}
            logits = self.model(**inputs, use_cache=False, **extra).logits  # (b, L or keep, V)
            for row, row_offsets in zip(logits, wanted):  # left padded: every text ends at the last column
                rows.append(row[[row.shape[0] - 1 - o for o in row_offsets]].float())
        return rows

    @torch.no_grad()
    def generate(
        self,
        texts: Sequence[str],
        images: Sequence[Sequence[ImageLike]],
        max_new_tokens: int,
        temperature: float | None = None,
        seed: int | None = None,
    ) -> list[str]:
        """Greedy continuations of the rendered ``texts`` (up to ``max_new_tokens`` tokens each), or
        with ``temperature`` samples of ``softmax(logits / temperature)`` (no top-k / top-p), drawn
        from the global RNG reseeded with ``seed`` when given (then restored).

        Decoded without special tokens; generation stops at the model's end-of-sequence ids.
        """
        sampling = {"do_sample": False}
        if temperature is not None:
            sampling = {"do_sample": True, "temperature": float(temperature), "top_k": 0, "top_p": 1.0}
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            return self._generate(texts, images, max_new_tokens, sampling)

    def _generate(
        self, texts: Sequence[str], images: Sequence[Sequence[ImageLike]], max_new_tokens: int, sampling: dict
    ) -> list[str]:
        outputs: list[str] = []
        for chunk in self._chunks(len(texts)):
            inputs = self.encode(texts[chunk], images[chunk])
            sequences = self.model.generate(
                **inputs, max_new_tokens=int(max_new_tokens), num_beams=1, **sampling
            )
            new_tokens = sequences[:, inputs["input_ids"].shape[1] :]
            decoded = self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
            outputs.extend(self.strip_image_tokens(text) for text in decoded)
        return outputs


class VLMJudgeReward(Reward):
    """Base of the rewards read off a :class:`VLMJudge`'s next-token logits (``vlm_yes``, ``iqa``):
    it holds the judge and the one multi-token policy by which answer words become token ids.

    Args:
        model: VLM hub id / folder (``AutoModelForImageTextToText``) or a built model.
        processor: hub id / folder (``AutoProcessor``) or a built processor (default: ``model``).
        multi_token: how a surface form that is several tokens counts ("fallback", "first",
            "skip"; see :func:`word_token_ids`).
        strict: raise on NaN scores.
        **judge_options: ``batch_size``, ``pad_to_square``, ``device``, ``dtype``,
            ``trust_remote_code`` and model keyword arguments of :class:`VLMJudge`.

    A subclass checks its own arguments first, then calls this ``__init__``, which checks
    ``multi_token`` before it loads the VLM.
    """

    differentiable = False  # images reach the processor as 8-bit PIL images

    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module,
        processor: str | os.PathLike | Any = None,
        multi_token: str = "fallback",
        strict: bool = False,
        **judge_options: Any,
    ) -> None:
        super().__init__(strict=strict)
        if multi_token not in MULTI_TOKEN_POLICIES:
            raise ValueError(f"multi_token must be one of {MULTI_TOKEN_POLICIES}, got {multi_token!r}")
        self.multi_token = multi_token
        self.judge = VLMJudge(model, processor, **judge_options)

    def answer_word_ids(
        self, words: Sequence[str | Sequence[str]], templates: Sequence[str]
    ) -> list[list[int]]:
        """:func:`resolve_word_ids` of ``words`` with the judge's tokenizer and this reward's policy."""
        return resolve_word_ids(self.judge.tokenizer, words, templates, self.multi_token)
