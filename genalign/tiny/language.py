"""Tiny, randomly initialised causal LM and VLM of real architectures, built offline.

* :func:`qwen2_lm` — a ``Qwen2ForCausalLM`` with a byte-level BPE tokenizer and a Qwen-style
  chat template: the stand-in for prompt rewriters and SVG writers.
* :func:`llava_vlm` — a ``LlavaForConditionalGeneration`` (CLIP vision tower, two-layer
  projector, Qwen2 language model) with a ``LlavaProcessor``: the stand-in for VLM judges.
* :func:`qwen25_vl` — a ``Qwen2_5_VLForConditionalGeneration`` (windowed vision tower, 2 x 2 patch
  merger, Qwen2.5 LM with 3-D multimodal rotary positions) with a ``Qwen2_5_VLProcessor``
  (packed ``pixel_values``, each image at its own size): the stand-in for Qwen2.5-VL recipes;
  :func:`qwen2_vl` the same for Qwen2-VL.

All tokenizers pad on the left, so batched ``generate`` works as is, and all models carry a
generation config whose end-of-sequence ids are ``<|im_end|>`` and ``<|endoftext|>``, so chat
generation stops at the end of the assistant's turn. Weights are random and seeded (the global
torch RNG is left as it was); ``save_to`` writes model and tokenizer/processor into one folder
that ``AutoModelForCausalLM`` / ``AutoModelForImageTextToText`` and ``AutoTokenizer`` /
``AutoProcessor`` reload.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2Tokenizer,
)

from genalign.tiny.tokenizers import QWEN_STYLE_CHAT_TEMPLATE, train_bpe_tokenizer

__all__ = ["chat_tokenizer", "llava_vlm", "qwen25_vl", "qwen2_config", "qwen2_lm", "qwen2_vl"]

IMAGE_TOKEN = "<image>"
VISION_PATCH_SIZE = 8
CLIP_IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]


def chat_tokenizer() -> Qwen2Tokenizer:
    """The byte-level BPE chat tokenizer of the tiny LM and VLM (400 ids), as a ``Qwen2Tokenizer``.

    The vocabulary and merges come from :func:`~genalign.tiny.tokenizers.train_bpe_tokenizer`
    (ids 0..4: ``<|endoftext|>`` (EOS), ``<|im_start|>``, ``<|im_end|>``, ``<image>``, ``<pad>``).
    They are wrapped in ``Qwen2Tokenizer`` rather than a generic fast tokenizer because
    ``AutoTokenizer`` rebuilds a folder whose model is ``qwen2`` as ``Qwen2Tokenizer`` (with
    Qwen's pre-tokenizer) whatever ``tokenizer_config.json`` says; wrapping it so from the start
    makes the built and the reloaded tokenizer split text identically. Pads on the left.
    """
    return qwen_chat_tokenizer(train_bpe_tokenizer(), model_max_length=2048)


def qwen_chat_tokenizer(bpe_tokenizer: Any, model_max_length: int) -> Qwen2Tokenizer:
    """A byte-level BPE trained by :func:`~genalign.tiny.tokenizers.train_bpe_tokenizer` as a
    ``Qwen2Tokenizer`` with the Qwen-style chat template and the chat special tokens, padding on the
    left (see :func:`chat_tokenizer` for why ``Qwen2Tokenizer``)."""
    bpe = json.loads(bpe_tokenizer.backend_tokenizer.to_str())["model"]
    return Qwen2Tokenizer(
        vocab=bpe["vocab"],
        merges=[tuple(merge) for merge in bpe["merges"]],
        unk_token=None,
        eos_token="<|endoftext|>",
        pad_token="<pad>",
        extra_special_tokens=["<|im_start|>", "<|im_end|>", IMAGE_TOKEN],
        padding_side="left",
        model_max_length=model_max_length,
        chat_template=QWEN_STYLE_CHAT_TEMPLATE,
    )


def qwen2_config(
    tokenizer: Qwen2Tokenizer,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    intermediate_size: int | None = None,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
) -> Qwen2Config:
    """A small Qwen2 for ``tokenizer``: 4 query / 2 key-value heads, MLP width ``2 * hidden_size``
    (``intermediate_size``: another), tied embeddings like Qwen2-0.5B; by default the tiny LM's
    (2 layers, hidden 32). The toy rewriter (:func:`genalign.toy.rewriter.build_rewriter`) and the
    toy VLM's LM (:func:`genalign.toy.reward_models.vlm_model.build_vlm`) are larger ones."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size if intermediate_size is None else intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=tokenizer.model_max_length,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def set_chat_generation_defaults(model: PreTrainedModel, tokenizer: Qwen2Tokenizer) -> None:
    """Stop at the end of a chat turn or of the text, and pad with the tokenizer's pad id."""
    model.generation_config.eos_token_id = [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.eos_token_id,
    ]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None


def llava_processor(
    tokenizer: Qwen2Tokenizer, image_size: int, patch_size: int, strategy: str
) -> LlavaProcessor:
    """LLaVA's processor: a CLIP image processor (resize the short side, centre crop, CLIP's
    normalisation) at ``image_size``, the chat tokenizer and template. ``strategy`` is the model's
    ``vision_feature_select_strategy``: ``"default"`` drops CLIP's CLS token, ``"full"`` keeps it."""
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        do_center_crop=True,
        image_mean=CLIP_IMAGE_MEAN,
        image_std=CLIP_IMAGE_STD,
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy=strategy,
        num_additional_image_tokens=1,  # CLIP's CLS token
        image_token=IMAGE_TOKEN,
        chat_template=QWEN_STYLE_CHAT_TEMPLATE,
    )


def qwen2_lm(seed: int = 0, save_to: str | Path | None = None) -> tuple[Qwen2ForCausalLM, Qwen2Tokenizer]:
    """A tiny ``Qwen2ForCausalLM`` (31.5k parameters, 130 kB saved) and its chat tokenizer.

    The tokenizer is :func:`chat_tokenizer` (byte-level BPE, so any text tokenizes, with
    ``<|im_start|>``/``<|im_end|>`` chat turns); the model's embedding rows match
    ``len(tokenizer)`` (400) exactly. Returned in eval mode.
    """
    tokenizer = chat_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(qwen2_config(tokenizer))
    set_chat_generation_defaults(model, tokenizer)
    model.eval()
    if save_to is not None:
        model.save_pretrained(save_to)
        tokenizer.save_pretrained(save_to)
    return model, tokenizer


def llava_vlm(
    seed: int = 0, save_to: str | Path | None = None, image_size: int = 32
) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """A tiny LLaVA-1.5-style VLM (57.6k parameters, 240 kB saved) and its processor.

    The CLIP vision tower (2 layers, hidden 32, patch 8) sees ``image_size`` px images;
    LLaVA's ``"default"`` feature selection drops the CLS token and reads the penultimate
    layer, so each image becomes ``(image_size // 8) ** 2`` tokens (16 at 32 px) that the
    processor expands ``<image>`` into. The processor resizes the shortest edge to
    ``image_size``, centre-crops to a square and normalises with CLIP's mean and std; it
    carries the same Qwen-style chat template as the tokenizer, rendering image parts as
    ``<image>``. ``AutoProcessor`` reloads its tokenizer as a generic ``TokenizersBackend``
    (transformers maps ``llava`` folders so), which reads the saved ``tokenizer.json`` as is and
    tokenizes identically.
    """
    if image_size % VISION_PATCH_SIZE:
        raise ValueError(f"image_size={image_size} must be a multiple of the patch size {VISION_PATCH_SIZE}")
    tokenizer = chat_tokenizer()
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    num_image_tokens = (image_size // VISION_PATCH_SIZE) ** 2
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            image_size=image_size,
            patch_size=VISION_PATCH_SIZE,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            projection_dim=32,
            hidden_act="quick_gelu",
        ),
        text_config=qwen2_config(tokenizer),
        image_token_id=image_token_id,
        image_seq_length=num_image_tokens,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
    set_chat_generation_defaults(model, tokenizer)
    model.eval()
    processor = llava_processor(tokenizer, image_size, VISION_PATCH_SIZE, "default")
    if save_to is not None:
        model.save_pretrained(save_to)
        processor.save_pretrained(save_to)
    return model, processor


QWEN_VL_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_VL_PATCH_SIZE = 4  # Qwen2.5-VL's is 14
QWEN_VL_MERGE_SIZE = 2
QWEN_VL_CHAT_TEMPLATE = QWEN_STYLE_CHAT_TEMPLATE.replace(
    "{{ '<image>' }}", "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
)


def qwen_vl_processor(
    tokenizer: Qwen2Tokenizer, min_pixels: int, max_pixels: int, version: str = "2.5"
) -> Any:
    """Qwen2.5-VL's (``version`` "2": Qwen2-VL's) processor built offline: ``Qwen2VLImageProcessor``
    (resize to multiples of ``patch * merge`` px within ``[min_pixels, max_pixels]``, CLIP's
    normalisation, packed ``pixel_values`` ``[sum of patches, 3 * 2 * patch**2]`` with
    ``image_grid_thw``), the chat tokenizer with Qwen's vision tokens, and a template rendering an
    image as ``<|vision_start|><|image_pad|><|vision_end|>``."""
    from transformers import (
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    sizes = {
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "patch_size": QWEN_VL_PATCH_SIZE,
        "temporal_patch_size": 2,
        "merge_size": QWEN_VL_MERGE_SIZE,
        "image_mean": CLIP_IMAGE_MEAN,
        "image_std": CLIP_IMAGE_STD,
    }
    processor = Qwen2_5_VLProcessor if version == "2.5" else Qwen2VLProcessor
    return processor(
        image_processor=Qwen2VLImageProcessor(**sizes),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(**sizes),  # required by the processor, unused here
        chat_template=QWEN_VL_CHAT_TEMPLATE,
    )


def _qwen_vl_vision_config(version: str) -> dict[str, Any]:
    """A 2-block, 32-wide vision tower with patch 4 and a 2 x 2 merge, in each version's keys."""
    shared = {
        "depth": 2,
        "num_heads": 4,
        "patch_size": QWEN_VL_PATCH_SIZE,
        "spatial_merge_size": QWEN_VL_MERGE_SIZE,
        "temporal_patch_size": 2,
    }
    if version == "2":  # Qwen2-VL: full attention, hidden_size is the merger's output (the LM's)
        return shared | {"embed_dim": 32, "hidden_size": 32, "mlp_ratio": 2}
    return shared | {  # Qwen2.5-VL: window attention in block 0, full attention in block 1
        "hidden_size": 32,
        "intermediate_size": 64,
        "window_size": 4 * QWEN_VL_PATCH_SIZE * QWEN_VL_MERGE_SIZE,
        "out_hidden_size": 32,
        "fullatt_block_indexes": [1],
    }


def qwen25_vl(
    seed: int = 0, save_to: str | Path | None = None, version: str = "2.5"
) -> tuple[PreTrainedModel, Any]:
    """A tiny ``Qwen2_5_VLForConditionalGeneration`` and its ``Qwen2_5_VLProcessor`` (``version``
    "2": a ``Qwen2VLForConditionalGeneration`` and ``Qwen2VLProcessor``, see :func:`qwen2_vl`).

    The vision tower (2 blocks, hidden 32, patch 4, 2 x 2 merge; Qwen2.5-VL's with window
    attention in block 0) feeds a 2-layer, 32-wide Qwen2 LM with multimodal rotary positions
    (``mrope_section`` [2, 1, 1] of the head's 8 dimensions), so position ids are 3-D (temporal,
    height, width) and an image of ``H x W`` px (resized to multiples of 8 within 64 to 4096 px)
    becomes ``(H / 8) * (W / 8)`` tokens: images of different sizes give different
    ``image_grid_thw``. The tokenizer is :func:`chat_tokenizer` plus Qwen's vision tokens.
    """
    if version not in ("2", "2.5"):
        raise ValueError(f"version must be '2' or '2.5', got {version!r}")
    import transformers

    prefix = "Qwen2_5_VL" if version == "2.5" else "Qwen2VL"
    tokenizer = chat_tokenizer()
    tokenizer.add_tokens(list(QWEN_VL_VISION_TOKENS), special_tokens=True)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_VL_VISION_TOKENS}
    text = qwen2_config(tokenizer).to_dict()
    text.update(rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]}, rope_theta=10000.0)
    for key in ("model_type", "architectures", "transformers_version", "rope_parameters"):
        text.pop(key, None)
    config = getattr(transformers, f"{prefix}Config")(
        text_config=text,
        vision_config=_qwen_vl_vision_config(version),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, f"{prefix}ForConditionalGeneration")(config)
    set_chat_generation_defaults(model, tokenizer)
    model.eval()
    processor = qwen_vl_processor(tokenizer, min_pixels=64, max_pixels=64 * 64, version=version)
    if save_to is not None:
        model.save_pretrained(save_to)
        processor.save_pretrained(save_to)
    return model, processor


def qwen2_vl(seed: int = 0, save_to: str | Path | None = None) -> tuple[PreTrainedModel, Any]:
    """A tiny ``Qwen2VLForConditionalGeneration`` (Qwen2-VL: the same 3-D positions and packed
    images as :func:`qwen25_vl`, a vision tower without window attention) and its processor."""
    return qwen25_vl(seed=seed, save_to=save_to, version="2")
