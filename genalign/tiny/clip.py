"""Tiny CLIP models of both libraries, built in code, saved in their libraries' own layouts.

* :func:`clip_model` — a transformers ``CLIPModel`` + ``CLIPProcessor`` (byte-level tokenizer,
  32-px images); ``save_to`` writes a ``from_pretrained`` folder, the layout of PickScore_v1 or
  ``openai/clip-vit-large-patch14``.
* :func:`open_clip_model` — an open_clip ``CLIP`` of a custom tiny architecture (the real CLIP BPE
  tokenizer, which open_clip ships); the architecture is registered with open_clip under
  :data:`TINY_OPEN_CLIP_NAME`, and ``save_to`` writes the config JSON, the weights in open_clip's
  layout (``open_clip_model.safetensors``) and the hub layout's ``open_clip_config.json``, so
  ``create_model_and_transforms(name, pretrained=<weights>)`` and ``"local-dir:<folder>"`` load it.

Both are random but deterministic in ``seed``, and take well under a second to build on a CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from genalign.tiny.tokenizers import byte_level_clip_tokenizer

TINY_OPEN_CLIP_NAME = "genalign-tiny-ViT-8"
OPEN_CLIP_WEIGHTS_NAME = "open_clip_model.safetensors"
OPEN_CLIP_HUB_CONFIG_NAME = "open_clip_config.json"


def clip_model(
    seed: int = 0,
    save_to: str | os.PathLike | None = None,
    projection_dim: int = 16,
    image_size: int = 32,
    patch_size: int = 8,
    hidden_size: int = 32,
    num_layers: int = 2,
):
    """A tiny transformers CLIP: ``(CLIPModel, CLIPProcessor)``.

    Vision: ViT with ``image_size``/``patch_size`` patches; text: 514-token byte-level vocabulary
    (:func:`~genalign.tiny.tokenizers.byte_level_clip_tokenizer`), 77 positions, eos id 513. The
    processor resizes the shortest edge to ``image_size`` and centre-crops, with OpenAI's
    mean/std, as CLIP's own processors do at 224 px.
    """
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    tokenizer = byte_level_clip_tokenizer()
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 2,
        "max_position_embeddings": 77,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision_config = {
        "image_size": image_size,
        "patch_size": patch_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 2,
    }
    config = CLIPConfig(text_config=text_config, vision_config=vision_config, projection_dim=projection_dim)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLIPModel(config).eval()
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor = CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)
    if save_to is not None:
        model.save_pretrained(save_to)
        processor.save_pretrained(save_to)
    return model, processor


def tiny_open_clip_config(image_size: int = 32, embed_dim: int = 16, width: int = 32) -> dict[str, Any]:
    """The architecture dict of the tiny open_clip model (open_clip's ``model_configs`` schema)."""
    return {
        "embed_dim": embed_dim,
        "vision_cfg": {
            "image_size": image_size,
            "layers": 2,
            "width": width,
            "head_width": 16,
            "patch_size": 8,
        },
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": width, "heads": 2, "layers": 2},
    }


def open_clip_model(
    seed: int = 0,
    save_to: str | os.PathLike | None = None,
    name: str = TINY_OPEN_CLIP_NAME,
    image_size: int = 32,
):
    """A tiny open_clip CLIP: ``(model, preprocess, tokenizer, config_dict)``.

    ``preprocess`` is open_clip's own PIL inference transform for the model (resize shortest edge,
    centre crop, OpenAI mean/std); ``tokenizer`` is open_clip's ``SimpleTokenizer``. With
    ``save_to``, the folder gets ``<name>.json`` (config, for ``open_clip.add_model_config``),
    ``open_clip_model.safetensors`` (weights, open_clip key layout) and ``open_clip_config.json``.
    """
    import open_clip

    from genalign.rewards.clip_models import register_open_clip_config

    config = tiny_open_clip_config(image_size=image_size)
    register_open_clip_config(name, config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, _, preprocess = open_clip.create_model_and_transforms(name)
    model.eval()
    tokenizer = open_clip.get_tokenizer(name)
    if save_to is not None:
        from safetensors.torch import save_file

        folder = Path(save_to)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        hub_config = {"model_cfg": config, "preprocess_cfg": dict(model.visual.preprocess_cfg)}
        (folder / OPEN_CLIP_HUB_CONFIG_NAME).write_text(json.dumps(hub_config, indent=2), encoding="utf-8")
        state = {key: value.detach().contiguous() for key, value in model.state_dict().items()}
        save_file(state, str(folder / OPEN_CLIP_WEIGHTS_NAME))
    return model, preprocess, tokenizer, config
