"""Tests of the VLM rewards (``vlm_yes``, ``iqa``) and ``clip_iqa`` on tiny models built in code.

Shared helpers live here (fixtures are module-scoped in each test file). The independent
computations write the chat text out by hand (the tiny models' Qwen-style template), run the
processor on one chat at a time (no padding) and read ``model(...).logits[0, -1]``.
"""

from __future__ import annotations

import torch
from PIL import Image

QUESTION = 'Does this figure show "{}"? Please answer yes or no.'


def uint8_images(batch: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """Random images exactly representable in uint8 (the PIL round trip is lossless), [B, 3, H, W]."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, 3, height, width), generator=generator).float() / 255.0


def to_pil(image: torch.Tensor) -> Image.Image:
    """[3, H, W] in [0, 1] -> RGB PIL image."""
    return Image.fromarray((image * 255).round().byte().permute(1, 2, 0).numpy())


def chat_text(*turns: tuple[str, str], generation_prompt: str = "") -> str:
    """The tiny models' chat template written out: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per turn,
    then ``<|im_start|>assistant\\n`` and ``generation_prompt``."""
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return text + "<|im_start|>assistant\n" + generation_prompt


@torch.no_grad()
def last_logits(model, processor, text: str, images: list[torch.Tensor]) -> torch.Tensor:
    """Next-token logits ``[V]`` (float32) of one chat, computed on its own (no padding)."""
    inputs = processor(text=[text], images=[to_pil(image) for image in images], return_tensors="pt")
    return model(**inputs).logits[0, -1].float()


@torch.no_grad()
def greedy_continuation(model, processor, text: str, images: list[torch.Tensor], max_new_tokens: int) -> str:
    """Greedy ``generate`` of one chat, decoded without special tokens."""
    inputs = processor(text=[text], images=[to_pil(image) for image in images], return_tensors="pt")
    sequences = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return processor.tokenizer.decode(sequences[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def token_ids(tokenizer, pieces: list[str]) -> list[int]:
    """Ids of vocabulary pieces (byte-level spelling: ``"Ġyes"`` is " yes")."""
    ids = tokenizer.convert_tokens_to_ids(pieces)
    assert all(isinstance(i, int) and i != tokenizer.unk_token_id for i in ids), pieces
    return ids


def p_yes_formula(
    logits: torch.Tensor, yes_ids: list[int], no_ids: list[int], normalize: str
) -> torch.Tensor:
    """P(yes) from one position's logits ``[V]``: probabilities of the word's ids summed."""
    probs = torch.softmax(logits, dim=-1)
    p_yes, p_no = probs[yes_ids].sum(), probs[no_ids].sum()
    return p_yes if normalize == "raw" else p_yes / (p_yes + p_no)
