"""Helpers shared by the reward tests (imported relatively: ``from .helpers import ...``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from PIL import Image

PROMPTS = ["a red circle", "two blue squares", "a red circle", "a green triangle left of a star"]


def uint8_images(batch: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """Random images exactly representable in uint8 (so PIL round trips are lossless), [B, 3, H, W]."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, 3, height, width), generator=generator).float() / 255.0


def smooth_images(batch: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """Low-frequency images (as photos and generations are), uint8-exact, [B, 3, H, W]."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(batch, 3, 5, 5, generator=generator)
    return (F.interpolate(coarse, size=(height, width), mode="bilinear") * 255).round() / 255


def to_pil(image: torch.Tensor) -> Image.Image:
    """[3, H, W] in [0, 1] -> RGB PIL image."""
    return Image.fromarray((image * 255).round().byte().permute(1, 2, 0).numpy())


def open_clip_cosine(tiny, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """Cosine of image and text features computed the open_clip way: its PIL ``preprocess``, its
    tokenizer, ``encode_image``/``encode_text``, L2 normalisation. ``[B]``."""
    pixels = torch.stack([tiny.preprocess(to_pil(image)) for image in images])
    with torch.no_grad():
        image_features = F.normalize(tiny.model.encode_image(pixels), dim=-1)
        text_features = F.normalize(tiny.model.encode_text(tiny.tokenizer(prompts)), dim=-1)
    return (image_features * text_features).sum(-1)


def transformers_features(tiny, images: torch.Tensor, prompts: list[str] | None = None):
    """Projected image (and text) features the transformers way: ``CLIPProcessor`` on PIL images,
    ``get_image_features`` / ``get_text_features``."""
    processor, model = tiny.processor, tiny.model
    with torch.no_grad():
        pixels = processor(images=[to_pil(image) for image in images], return_tensors="pt")["pixel_values"]
        image_features = model.get_image_features(pixel_values=pixels)
        image_features = image_features if torch.is_tensor(image_features) else image_features.pooler_output
        if prompts is None:
            return image_features, None
        tokens = processor.tokenizer(prompts, padding=True, return_tensors="pt")
        text_features = model.get_text_features(**tokens)
        text_features = text_features if torch.is_tensor(text_features) else text_features.pooler_output
    return image_features, text_features


def transformers_cosine(tiny, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    image_features, text_features = transformers_features(tiny, images, prompts)
    return (F.normalize(image_features, dim=-1) * F.normalize(text_features, dim=-1)).sum(-1)


def qwen_hidden_by_hand(reference, message: dict, **processor_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [L], last hidden states [L, D])`` of one Qwen2-VL chat computed without the reward
    code: the chat template, the processor, and the backbone with plain positions 0..L-1 on all
    three rotary axes (what the official HPSv3 / VideoReward forwards give every token)."""
    text = reference.processor.apply_chat_template([message], add_generation_prompt=True, tokenize=False)
    inputs = reference.processor(text=[text], return_tensors="pt", **processor_kwargs)
    length = inputs["input_ids"].shape[1]
    visual = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    with torch.no_grad():
        hidden = reference.backbone(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            position_ids=torch.arange(length).view(1, 1, -1).expand(3, 1, -1),
            **visual,
        ).last_hidden_state[0]
    return inputs["input_ids"][0], hidden
