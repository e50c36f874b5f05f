"""Tiny Qwen2-VL reward models (HPSv3, VideoReward) saved in their official checkpoint layouts.

* :func:`qwen2_vl_base` — the tiny Qwen2-VL of :func:`genalign.tiny.language.qwen2_vl` with a chat
  template that renders images and videos as the real Qwen2-VL-Instruct template does (default
  system turn, ``<|vision_start|><|image_pad|><|vision_end|>`` / ``...<|video_pad|>...``): the
  stand-in for ``Qwen/Qwen2-VL-7B-Instruct`` and ``-2B-Instruct``.
* :func:`hpsv3_checkpoint` — a random HPSv3 on that base, written as ``HPSv3.safetensors``
  (the whole model's state dict, transformers >= 4.52 keys, ``rm_head.*``).
* :func:`videoreward_checkpoint` — a random VideoReward written as the ``KwaiVGI/VideoReward``
  folder: ``model_config.json`` and ``checkpoint-<step>/`` with LoRA ``adapter_model.safetensors``
  + ``non_lora_state_dict.pth`` (transformers 4.45 keys under peft's ``base_model.model.``) or a
  full ``model.pth``.

Each returns the in-memory reward model the checkpoint stands for (weights merged by hand), so a
test can compare what a loader reads back with it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from genalign.rewards.qwen_rm import QwenRewardModel, add_reward_tokens, hpsv3_head
from genalign.tiny.language import qwen2_vl

__all__ = ["QWEN2_VL_CHAT_TEMPLATE", "hpsv3_checkpoint", "qwen2_vl_base", "videoreward_checkpoint"]

QWEN2_VL_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MODEL_MAX_LENGTH = 16384  # the reward instructions are long for a 400-id BPE


def qwen2_vl_base(seed: int = 0, save_to: str | Path | None = None) -> tuple[Any, Any]:
    """A tiny ``Qwen2VLForConditionalGeneration`` (hidden 32, patch 4, 2 x 2 merge: 8 px per
    visual token) and its processor with :data:`QWEN2_VL_CHAT_TEMPLATE`."""
    model, processor = qwen2_vl(seed=seed)
    processor.chat_template = QWEN2_VL_CHAT_TEMPLATE
    processor.tokenizer.chat_template = QWEN2_VL_CHAT_TEMPLATE
    processor.tokenizer.model_max_length = MODEL_MAX_LENGTH
    if save_to is not None:
        model.save_pretrained(save_to)
        processor.save_pretrained(save_to)
    return model, processor


def _reward_copy(base: nn.Module, processor: Any, tokens: list[str], generator: torch.Generator):
    """A copy of ``base`` and ``processor`` with ``tokens`` added and every weight perturbed, so
    a loader that kept any base tensor would give other scores."""
    model, processor = copy.deepcopy(base), copy.deepcopy(processor)
    add_reward_tokens(processor, tokens)
    model.resize_token_embeddings(len(processor.tokenizer), mean_resizing=False)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model, processor


def _untied_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone().contiguous() for key, value in model.state_dict().items()}


def hpsv3_checkpoint(base: nn.Module, processor: Any, path: str | Path, seed: int = 1) -> QwenRewardModel:
    """Write a random HPSv3 over ``base`` to ``path`` (``HPSv3.safetensors`` layout) and return it."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    model, processor = _reward_copy(base, processor, ["<|Reward|>"], generator)
    head = hpsv3_head(model.config.text_config.hidden_size)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[-1] ** 0.5)
    state = _untied_state(model)
    state.update({f"rm_head.{k}": v.clone() for k, v in head.state_dict().items()})
    save_file(state, str(path))
    return QwenRewardModel(model, head, processor, ["<|Reward|>"])


def _old_layout(key: str) -> str:
    """A transformers >= 4.52 key -> the 4.45 key the official VideoAlign training saved."""
    if key.startswith("model.visual."):
        return key[len("model.") :]
    if key.startswith("model.language_model."):
        return "model." + key[len("model.language_model.") :]
    return key


def _add_lora(
    model: nn.Module, rank: int, alpha: float, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Random LoRA pairs on every Linear of the language model, folded into ``model`` by hand;
    returns them in peft's saved naming (``base_model.model.<4.45 key>.lora_A.weight``)."""
    adapter = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or not name.startswith("model.language_model."):
            continue
        lora_a = torch.randn(rank, module.in_features, generator=generator) / module.in_features**0.5
        lora_b = 0.1 * torch.randn(module.out_features, rank, generator=generator)
        with torch.no_grad():
            module.weight.add_(alpha / rank * lora_b @ lora_a)
        prefix = "base_model.model." + _old_layout(name)
        adapter[f"{prefix}.lora_A.weight"], adapter[f"{prefix}.lora_B.weight"] = lora_a, lora_b
    return adapter


def videoreward_checkpoint(
    base: nn.Module,
    processor: Any,
    folder: str | Path,
    base_model: str | Path,
    *,
    output_dim: int = 3,
    layout: str = "lora",
    seed: int = 2,
    step: int = 100,
    lora_rank: int = 4,
    lora_alpha: float = 8.0,
    data_config: dict | None = None,
    inference_config: dict | None = None,
) -> QwenRewardModel:
    """Write a random VideoReward over ``base`` as the official folder and return it.

    ``layout`` "lora": ``adapter_model.safetensors`` + ``non_lora_state_dict.pth`` (vision tower,
    embeddings and head in peft naming; the language model's other weights stay the base's);
    "full": ``model.pth`` with every tensor. ``base_model`` is written as ``model_name_or_path``.
    """
    from safetensors.torch import save_file

    tokens = ["<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>"]
    generator = torch.Generator().manual_seed(seed)
    if layout == "lora":  # only the trained parts move: vision tower, embeddings, LoRA, head
        model, processor = copy.deepcopy(base), copy.deepcopy(processor)
        add_reward_tokens(processor, tokens)
        model.resize_token_embeddings(len(processor.tokenizer), mean_resizing=False)
        with torch.no_grad():
            for parameter in [*model.model.visual.parameters(), model.get_input_embeddings().weight]:
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
        adapter = _add_lora(model, lora_rank, lora_alpha, generator)
    elif layout == "full":
        model, processor = _reward_copy(base, processor, tokens, generator)
    else:
        raise ValueError(f"layout must be 'lora' or 'full', got {layout!r}")
    head = nn.Linear(model.config.text_config.hidden_size, output_dim, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator) / head.in_features**0.5)
    checkpoint = Path(folder) / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True, exist_ok=True)
    state = {_old_layout(k): v for k, v in _untied_state(model).items()}
    state["rm_head.weight"] = head.weight.detach().clone()
    if layout == "full":
        torch.save(state, checkpoint / "model.pth")
    else:
        trained = ("visual.", "model.embed_tokens.", "rm_head.")
        non_lora = {f"base_model.model.{k}": v for k, v in state.items() if k.startswith(trained)}
        torch.save(non_lora, checkpoint / "non_lora_state_dict.pth")
        save_file(adapter, str(checkpoint / "adapter_model.safetensors"))
    config = {
        "data_config": {
            "fps": 2.0,
            "num_frames": None,
            "max_frame_pixels": 200704,
            "eval_dim": ["VQ", "MQ", "TA"],
            "prompt_template_type": "detailed_special",
            "sample_type": "uniform",
            **(data_config or {}),
        },
        "model_config": {
            "model_name_or_path": str(base_model),
            "output_dim": output_dim,
            "use_special_tokens": True,
            "reward_token": "special",
        },
        "peft_lora_config": {
            "lora_enable": layout == "lora",
            "lora_r": lora_rank,
            "lora_alpha": lora_alpha,
            "use_rslora": False,
            "lora_namespan_exclude": ["lm_head", "rm_head", "embed_tokens", "visual"],
        },
    }
    if inference_config is not None:
        config["inference_config"] = inference_config
    (Path(folder) / "model_config.json").write_text(json.dumps(config, indent=2))
    return QwenRewardModel(model, head, processor, tokens)
