"""Qwen2-VL reward models: a VLM backbone with a small regression head read at reward tokens.

HPSv3 (Ma et al. 2025, arXiv 2508.03789, Sec. 4.1) and VideoReward / VideoAlign (Liu et al. 2025,
arXiv 2501.13918, Sec. 4.1) share one design. A chat holds the visual input and an instruction
that ends in one or more special *reward tokens* (``<|Reward|>``; ``<|VQ_reward|>``,
``<|MQ_reward|>``, ``<|TA_reward|>``) added to the tokenizer. Qwen2-VL runs once; the final hidden
state at each reward token goes through a head (``rm_head``) computed in fp32::

    h_k = Qwen2VL(chat)[position of reward token k]      # (B, K, D)
    r_k = rm_head(h_k)                                   # (B, K, out)

:class:`QwenRewardModel` does this for any such checkpoint; ``hpsv3.py`` and ``videoalign.py``
supply the instruction, the visual preprocessing and the head.

Conventions shared with :mod:`genalign.rewards.vlm`:

* batches are padded on the left (:func:`~genalign.rewards.vlm.load_vlm`); the reward tokens are
  found by id, so padding never moves them; tests check that a batch equals its rows one at a time;
* **positions are sequential** (0, 1, 2, ... over the unpadded tokens, the same on Qwen2-VL's three
  rotary axes). Both official reward models call the language model with ``input_ids=None`` and no
  grid sizes, so transformers never builds the 3-D (temporal, height, width) positions of visual
  tokens; the checkpoints were trained and evaluated that way, and so they are run here
  (:func:`sequential_positions`).

Checkpoints (``from_checkpoint_state``): the base model (``Qwen/Qwen2-VL-7B-Instruct``,
``Qwen/Qwen2-VL-2B-Instruct`` or a local folder) is loaded with ``from_pretrained``, its embedding
table is resized to the checkpoint's, and the checkpoint's tensors replace the base ones. Keys
may be in any of the official layouts: transformers < 4.52 (``model.layers...``, ``visual...``),
>= 4.52 (``model.language_model...``, ``model.visual...``), wrapped by peft
(``base_model.model.`` prefixes, ``.base_layer.``) and with LoRA pairs, which are merged
(``W += alpha / r * B @ A``, :func:`merge_lora`).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from genalign.rewards.checkpoints import pretrained_source
from genalign.rewards.vlm import VLMJudge, _as_dtype

logger = logging.getLogger(__name__)

__all__ = [
    "QwenRewardModel",
    "hpsv3_head",
    "merge_lora",
    "normalize_state_dict",
    "sequential_positions",
    "smart_resize",
]

MAX_ASPECT_RATIO = 200  # Qwen2-VL's preprocessing refuses more elongated images


def hpsv3_head(hidden_size: int, output_dim: int = 2) -> nn.Sequential:
    """HPSv3's ``rm_head`` ("ranknet" without keyword arguments): D -> 1024 -> ReLU -> dropout(0.05)
    -> 16 -> ReLU -> ``output_dim`` (mu, log sigma). Indices match the official state-dict keys
    (``rm_head.0``, ``rm_head.3``, ``rm_head.5``)."""
    return nn.Sequential(
        nn.Linear(hidden_size, 1024),
        nn.ReLU(),
        nn.Dropout(0.05),
        nn.Linear(1024, 16),
        nn.ReLU(),
        nn.Linear(16, output_dim),
    )


def sequential_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[3, B, L]`` rotary positions 0, 1, ... over each row's real tokens (padding gets 1, unused).

    What the official reward models compute (module docstring): the running count of real tokens,
    so a left-padded row has the positions it has alone.
    """
    positions = attention_mask.long().cumsum(-1) - 1  # (B, L)
    positions = positions.masked_fill(attention_mask == 0, 1)
    return positions.unsqueeze(0).expand(3, -1, -1)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize rule (``qwen_vl_utils.smart_resize``): sides rounded to multiples of
    ``factor`` (patch size x merge size, 28 for the real models), the area brought into
    ``[min_pixels, max_pixels]`` keeping the aspect ratio; returns ``(height, width)``."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"aspect ratio must be below {MAX_ASPECT_RATIO}, got an image of {height}x{width} px"
        )
    new_height = max(factor, round(height / factor) * factor)
    new_width = max(factor, round(width / factor) * factor)
    if new_height * new_width > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        new_height = max(factor, math.floor(height / beta / factor) * factor)
        new_width = max(factor, math.floor(width / beta / factor) * factor)
    elif new_height * new_width < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        new_height = math.ceil(height * beta / factor) * factor
        new_width = math.ceil(width * beta / factor) * factor
    return new_height, new_width


# -- checkpoints -----------------------------------------------------------------------------------

_PEFT_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")


def merge_lora(state: Mapping[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """Fold LoRA pairs into their base weights: ``W <- W + scale * B @ A`` (Hu et al. 2021, Eq. 3;
    ``scale = lora_alpha / r``). Keys ``<module>.lora_A[.<adapter>].weight`` pair with
    ``<module>.lora_B...``; the base weight is ``<module>.weight`` (or peft's
    ``<module>.base_layer.weight``). Returns the merged state without LoRA keys; a base weight
    that is absent from ``state`` is reported by a key ``<module>.weight`` holding only the delta
    under ``"lora_delta::"`` (merged later onto the loaded base model)."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    merged: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        match = _LORA_KEY.match(key)
        if match:
            pairs.setdefault(match["module"], {})[match["which"]] = value
        elif "lora_embedding" in key or "lora_magnitude" in key:
            raise ValueError(f"unsupported LoRA tensor in the checkpoint: {key}")
        else:
            merged[key.replace(".base_layer.", ".")] = value
    for module, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise ValueError(f"LoRA module {module} has only lora_{''.join(pair)} in the checkpoint")
        delta = scale * (pair["B"].float() @ pair["A"].float())  # (out, in)
        name = f"{module}.weight"
        if name in merged:
            merged[name] = (merged[name].float() + delta).to(merged[name].dtype)
        else:
            merged[f"lora_delta::{name}"] = delta
    return merged


def _backbone_key(key: str) -> str | None:
    """A Qwen2VLForConditionalGeneration key (any transformers version) -> the ``Qwen2VLModel`` key,
    ``rm_head...`` unchanged, None for ``lm_head`` (not used by a reward model)."""
    if key.startswith(_PEFT_PREFIX):
        key = key[len(_PEFT_PREFIX) :]
    if key.startswith("module."):
        key = key[len("module.") :]
    if key.startswith("lm_head."):
        return None
    if key.startswith("rm_head."):
        return key
    if key.startswith("visual."):  # transformers < 4.52
        return key
    if key.startswith("model.visual.") or key.startswith("model.language_model."):  # >= 4.52
        return key[len("model.") :]
    if key.startswith("model."):  # transformers < 4.52: the language model was `model`
        return "language_model." + key[len("model.") :]
    return key


def normalize_state_dict(state: Mapping[str, torch.Tensor], lora_scale: float | None = None):
    """Split a reward checkpoint into ``(backbone_state, head_state)`` in ``Qwen2VLModel`` / head keys.

    LoRA pairs are merged first when present (``lora_scale`` = alpha / r is then required).
    Delta-only entries (LoRA on a weight the checkpoint does not hold) keep the
    ``lora_delta::`` marker in the backbone state.
    """
    if any(_LORA_KEY.match(key) for key in state):
        if lora_scale is None:
            raise ValueError("the checkpoint holds LoRA weights but no LoRA scale (lora_alpha / r) was given")
        state = merge_lora(state, lora_scale)
    backbone, head = {}, {}
    for key, value in state.items():
        delta = key.startswith("lora_delta::")
        name = _backbone_key(key[len("lora_delta::") :] if delta else key)
        if name is None:
            continue
        if name.startswith("rm_head."):
            head[name[len("rm_head.") :]] = value
        else:
            backbone[("lora_delta::" if delta else "") + name] = value
    return backbone, head


def load_backbone_weights(backbone: nn.Module, state: Mapping[str, torch.Tensor], what: str) -> None:
    """Overwrite ``backbone``'s parameters with ``state`` (after resizing the embedding table to the
    checkpoint's), adding ``lora_delta::`` entries onto the loaded weights. Unknown keys are errors."""
    embed = state.get("language_model.embed_tokens.weight")
    if embed is not None and embed.shape[0] != backbone.get_input_embeddings().weight.shape[0]:
        backbone.resize_token_embeddings(embed.shape[0], mean_resizing=False)  # rows overwritten below
    params = dict(backbone.named_parameters())
    unknown = [k for k in state if k.removeprefix("lora_delta::") not in params]
    if unknown:
        raise ValueError(
            f"{what}: {len(unknown)} checkpoint tensors match no backbone parameter, e.g. {unknown[:3]}"
        )
    with torch.no_grad():
        for key, value in state.items():
            if key.startswith("lora_delta::"):
                target = params[key[len("lora_delta::") :]]
                target.add_(value.to(target.dtype))
            else:
                target = params[key]
                if target.shape != value.shape:
                    raise ValueError(
                        f"{what}: {key} has shape {tuple(value.shape)}, the model {tuple(target.shape)}"
                    )
                target.copy_(value.to(target.dtype))


def load_base_backbone(base_model: str | os.PathLike, dtype: Any = None) -> tuple[nn.Module, Any]:
    """The Qwen2-VL backbone (``Qwen2VLModel``: vision tower + language model, no LM head) and
    processor of a hub id or folder."""
    from transformers import AutoProcessor, Qwen2VLModel

    source = pretrained_source(base_model, "base model")
    kwargs = {"dtype": _as_dtype(dtype)} if dtype is not None else {}
    backbone = Qwen2VLModel.from_pretrained(source, **kwargs)
    processor = AutoProcessor.from_pretrained(source)
    logger.info("Qwen2-VL backbone loaded from %s", source)
    return backbone, processor


# -- the model -------------------------------------------------------------------------------------


class QwenRewardModel(nn.Module):
    """A frozen Qwen2-VL backbone whose head is read at reward tokens (module docstring).

    Args:
        backbone: a ``Qwen2VLModel`` (or a ``Qwen2VLForConditionalGeneration``, whose ``.model`` is
            used): the vision tower and the language model.
        head: the regression head applied, in fp32, to each reward token's final hidden state.
        processor: the Qwen2-VL processor; its tokenizer must already hold ``reward_tokens``.
        reward_tokens: the special tokens whose hidden states are read, in the order they appear.
        batch_size: chats per forward pass.
        device, dtype: where and in which precision the backbone runs (the head stays fp32).
    """

    def __init__(
        self,
        backbone: nn.Module,
        head: nn.Module,
        processor: Any,
        reward_tokens: Sequence[str],
        *,
        batch_size: int = 8,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
    ) -> None:
        super().__init__()
        backbone = getattr(backbone, "model", backbone) if hasattr(backbone, "lm_head") else backbone
        self.judge = VLMJudge(backbone, processor, batch_size=batch_size, device=device, dtype=dtype)
        self.head = head.float().eval().requires_grad_(False)
        if device is not None:
            self.head.to(device)
        tokenizer = self.judge.tokenizer
        ids = []
        for token in reward_tokens:
            pieces = tokenizer.encode(token, add_special_tokens=False)
            if len(pieces) != 1:
                raise ValueError(
                    f"reward token {token!r} is not one token of the tokenizer (it splits into {pieces})"
                )
            ids.append(pieces[0])
        rows = self.backbone.get_input_embeddings().weight.shape[0]
        if max(ids) >= rows:
            raise ValueError(f"reward token ids {ids} exceed the embedding table ({rows} rows)")
        self.reward_tokens = tuple(reward_tokens)
        self.register_buffer("reward_token_ids", torch.tensor(ids), persistent=False)

    @property
    def backbone(self) -> nn.Module:
        return self.judge.model

    @property
    def processor(self) -> Any:
        return self.judge.processor

    @property
    def device(self) -> torch.device:
        return self.judge.device

    def patch_factor(self) -> int:
        """Pixels per side of one merged visual token (patch size x merge size; 28 for Qwen2-VL)."""
        image_processor = self.processor.image_processor
        return int(image_processor.patch_size) * int(image_processor.merge_size)

    def render(self, text: str, visual: str) -> str:
        """The chat template of one user turn: a ``visual`` ("image" or "video") then ``text``."""
        message = {"role": "user", "content": [{"type": visual}, {"type": "text", "text": text}]}
        return self.judge.render([message])

    def encode(
        self, texts: Sequence[str], images: Sequence[Any] | None = None, videos: Sequence[Any] | None = None
    ):
        """Processor outputs (left padded, on the model's device) for rendered texts with one image
        (PIL) or one video (uint8 tensor ``[T, 3, h, w]``, already sampled and resized) each."""
        kwargs: dict[str, Any] = {"text": list(texts), "return_tensors": "pt", "padding": True}
        if images is not None:
            kwargs["images"] = list(images)
        if videos is not None:  # sampled and resized by the caller, as the official code does
            kwargs.update(videos=list(videos), do_resize=False, do_sample_frames=False)
            if hasattr(getattr(self.processor, "video_processor", None), "cap_pixels_per_frame"):
                kwargs["cap_pixels_per_frame"] = True  # no effect without resizing; silences a notice
        inputs = self.processor(**kwargs).to(self.device)
        dtype = next(self.backbone.parameters()).dtype
        for key, value in inputs.items():
            if torch.is_tensor(value) and value.is_floating_point():
                inputs[key] = value.to(dtype)
        return inputs

    @torch.no_grad()
    def head_outputs(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``[B, K, out]`` fp32 head outputs at the K reward tokens of each row of ``inputs``."""
        input_ids, mask = inputs["input_ids"], inputs["attention_mask"]
        visual = {
            k: inputs[k]
            for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
            if k in inputs
        }
        hidden = self.backbone(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=sequential_positions(mask),
            use_cache=False,
            **visual,
        ).last_hidden_state  # (B, L, D)
        found = torch.isin(input_ids, self.reward_token_ids) & mask.bool()  # (B, L)
        count = len(self.reward_tokens)
        per_row = found.sum(dim=1)
        if (per_row != count).any():
            raise ValueError(
                f"each chat must hold the {count} reward token(s) {self.reward_tokens} once; "
                f"found {per_row.tolist()} per row"
            )
        picked = hidden[found].view(input_ids.shape[0], count, -1)  # (B, K, D), in sequence order
        return self.head(picked.float())

    def score_chats(self, texts: Sequence[str], **visuals: Sequence[Any]) -> torch.Tensor:
        """``[B, K, out]`` for rendered ``texts`` and their ``images=`` or ``videos=``, in batches."""
        rows = []
        for chunk in self.judge._chunks(len(texts)):
            parts = {name: values[chunk] for name, values in visuals.items()}
            rows.append(self.head_outputs(self.encode(texts[chunk], **parts)))
        return torch.cat(rows, dim=0)


def add_reward_tokens(processor: Any, tokens: Sequence[str]) -> list[int]:
    """Add ``tokens`` as special tokens (never split) to the processor's tokenizer, as the official
    ``create_model_and_processor`` does before resizing the embeddings; returns their ids."""
    tokenizer = processor.tokenizer
    missing = [t for t in tokens if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_tokens(list(missing), special_tokens=True)
    return [tokenizer.convert_tokens_to_ids(t) for t in tokens]
