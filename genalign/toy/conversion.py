"""open_clip weights in transformers' CLIP layouts: toy-clip's towers reused by toy-sd (its text
encoder) and toy-vlm (its vision tower), copied, not retrained."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


def open_clip_vision(folder: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A saved toy-clip folder's ``vision_cfg`` and its image tower's weights (``visual.*``)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config_file, weights_file = folder / "open_clip_config.json", folder / "open_clip_model.safetensors"
    for required in (config_file, weights_file):
        if not required.is_file():
            raise FileNotFoundError(
                f"vision_init {str(folder)!r} is not a toy-clip folder: {required.name} missing"
            )
    config = json.loads(config_file.read_text(encoding="utf-8"))["model_cfg"]
    weights = {
        k[len("visual.") :]: v for k, v in load_file(str(weights_file)).items() if k.startswith("visual.")
    }
    return config["vision_cfg"], weights


def open_clip_blocks_to_transformers(
    weights: dict[str, torch.Tensor], layers: int
) -> dict[str, torch.Tensor]:
    """open_clip's residual attention blocks (``transformer.resblocks.{i}.*``, of its image or text
    tower) renamed into transformers' CLIP ``encoder.layers.{i}.*``, the fused q/k/v split."""
    names = {
        "ln_1": "layer_norm1",
        "ln_2": "layer_norm2",
        "mlp.c_fc": "mlp.fc1",
        "mlp.c_proj": "mlp.fc2",
        "attn.out_proj": "self_attn.out_proj",
    }
    out = {}
    for i in range(layers):
        source, target = f"transformer.resblocks.{i}.", f"encoder.layers.{i}."
        for old, new in names.items():
            for kind in ("weight", "bias"):
                out[f"{target}{new}.{kind}"] = weights[f"{source}{old}.{kind}"]
        for kind in ("weight", "bias"):
            q, k, v = weights[f"{source}attn.in_proj_{kind}"].chunk(3)
            out[f"{target}self_attn.q_proj.{kind}"] = q
            out[f"{target}self_attn.k_proj.{kind}"] = k
            out[f"{target}self_attn.v_proj.{kind}"] = v
    return out


def open_clip_vision_to_transformers(
    weights: dict[str, torch.Tensor], layers: int
) -> dict[str, torch.Tensor]:
    """open_clip ``VisionTransformer`` weights renamed (and the fused q/k/v split) into the layout of
    transformers' ``CLIPVisionModel.vision_model``. The final ``proj`` is dropped: LLaVA reads the
    last layer's patch tokens, before ``ln_post`` and the projection."""
    out = {
        "embeddings.patch_embedding.weight": weights["conv1.weight"],
        "embeddings.class_embedding": weights["class_embedding"],
        "embeddings.position_embedding.weight": weights["positional_embedding"],
        "pre_layrnorm.weight": weights["ln_pre.weight"],
        "pre_layrnorm.bias": weights["ln_pre.bias"],
        "post_layernorm.weight": weights["ln_post.weight"],
        "post_layernorm.bias": weights["ln_post.bias"],
    }
    out.update(open_clip_blocks_to_transformers(weights, layers))
    return out
