"""toy-vlm's model: a LLaVA-1.5-style ``LlavaForConditionalGeneration`` (Liu et al. 2023; CLIP
vision tower, two-layer projector, Qwen2 language model) with a BPE tokenizer trained on the toy
grammar and a Qwen-style chat template, and its recipe."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from genalign.toy.conversion import open_clip_vision, open_clip_vision_to_transformers
from genalign.toy.prompts import train_prompts


@dataclass
class VLMRecipe:
    """Architecture and training of ``toy-vlm``. The shipped model is these defaults with the
    options of the commands in its card (``vision_init``, ``vision_lr_scale=0``,
    ``vision_feature_layer=-2``, ``task_mix``, ``question_weight=1``, a 60-minute budget), then
    continued twice (``init``, a lower ``lr``, new seeds and so fresh scene banks with
    ``scenes_per_prompt=32``; 60 and 33 minutes)."""

    seed: int = 0
    image_size: int = 48
    patch_size: int = 12
    vision_width: int = 64
    vision_layers: int = 2
    vision_heads: int = 4
    hidden_size: int = 96
    intermediate_size: int = 256
    layers: int = 3
    heads: int = 4
    kv_heads: int = 2
    vocab_size: int = 640
    render_size: int = 64
    scenes_per_prompt: int = 8
    steps: int = 3000
    batch_size: int = 24
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: int = 100
    task_mix: tuple[float, float, float] = (0.5, 0.25, 0.25)  # yes/no, comparative, rating
    render_48_probability: float = 0.4
    # a toy-clip folder whose image tower (converted to the transformers layout) starts the vision
    # tower; its architecture then replaces image_size/patch_size/vision_*
    vision_init: str | None = None
    # the vision tower's learning rate relative to ``lr``; 0 freezes it, as LLaVA keeps its CLIP
    # encoder frozen (Liu et al. 2023). Trained jointly from the first step, the tower collapsed to
    # image-independent features while the LM fitted the answer prior (measured: with a trainable
    # tower not even 20 fixed rating examples could be memorised in 100 steps; frozen, they were).
    vision_lr_scale: float = 1.0
    # which vision-tower layer the projector reads (LLaVA-1.5 reads the penultimate, -2)
    vision_feature_layer: int = -1
    # LLaVA's feature-alignment task (Liu et al. 2023, stage 1): "Describe this image." answered
    # with the scene's caption, a loss on every caption token: dense, word-level supervision of what
    # the image shows. Measured: it learns to caption (token loss 4.7 -> 0.15 in 2,900 steps), but
    # the one-token answers stayed at their priors in that run (see the issue #6 notes).
    caption_weight: float = 0.0
    caption_batch_size: int = 8
    # A next-token loss on the question of every yes/no chat whose answer is "yes" (the quoted
    # caption is then true of the image): the caption predicted from the image, in the very chat the
    # reward reads. Without it the answer token stayed at its prior (loss 0.67 after 1,400 steps on
    # every category; 0.69 after 1,350 on single-object colours alone): one answer token averages
    # over ~60 positions, so the image-word interaction it needs gets almost no gradient. With it
    # (weight 1) the yes/no loss fell to 0.41 in the same 1,400 steps (0.07 on colours alone).
    question_weight: float = 0.0
    # a toy-vlm folder whose weights start training: a run continued (new seed, new schedule,
    # fresh optimiser state); its architecture must be this recipe's
    init: str | None = None
    log_every: int = 25
    max_minutes: float | None = None  # wall-clock budget of the training loop (None: steps only)


RATING_WORDS = ("excellent", "good", "fair", "poor", "bad")  # severity 0..4, Q-Align's levels


def _vlm_templates() -> dict[str, Any]:
    """The reward modules' templates: training renders the chats they render."""
    from genalign.rewards.iqa import QALIGN_LEVELS, QALIGN_PROMPTS
    from genalign.rewards.vlm_yes import (
        COMPARATIVE_QUESTION,
        DEFAULT_CRITERIA,
        IMAGE_LABELS,
        VQASCORE_QUESTION,
    )

    if tuple(QALIGN_LEVELS) != RATING_WORDS:
        raise RuntimeError(f"Q-Align's levels changed to {tuple(QALIGN_LEVELS)}; update RATING_WORDS")
    return {
        "vqa": VQASCORE_QUESTION,
        "comparative": COMPARATIVE_QUESTION,
        "criteria": DEFAULT_CRITERIA,
        "labels": IMAGE_LABELS,
        "rating": QALIGN_PROMPTS[0],
    }


def vlm_tokenizer(vocab_size: int = 640):
    """Byte-level BPE trained on the toy grammar and the reward questions, as a ``Qwen2Tokenizer``
    with the Qwen-style chat template (so every caption word and answer word is one token)."""
    from genalign.tiny.language import qwen_chat_tokenizer
    from genalign.tiny.tokenizers import train_bpe_tokenizer

    templates = _vlm_templates()
    question, prefix = templates["rating"]
    corpus = [p.caption for p in train_prompts()]
    corpus += [templates["vqa"].format(prompt=c) for c in corpus[:50]]
    corpus += [templates["comparative"].format(prompt=c, criteria=templates["criteria"]) for c in corpus[:20]]
    corpus += [f"{question} {prefix} {word}." for word in RATING_WORDS] * 20
    corpus += ["yes", "no", "Yes", "No", "user", "assistant", "system", *templates["labels"]] * 20
    return qwen_chat_tokenizer(train_bpe_tokenizer(corpus, vocab_size=vocab_size), model_max_length=1024)


def build_vlm(recipe: VLMRecipe, tokenizer: Any = None):
    """A freshly initialised LLaVA model and its processor (tokenizer, image processor, chat template).

    With ``recipe.vision_init`` (a toy-clip folder) the vision tower takes toy-clip's image-tower
    architecture and weights, as LLaVA starts from a pretrained CLIP encoder (Liu et al. 2023).
    ``tokenizer``: a chat tokenizer with an ``<image>`` token (default: :func:`vlm_tokenizer`, the
    toy grammar's; the toy SVG writer passes its own)."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    from genalign.tiny.language import (
        IMAGE_TOKEN,
        llava_processor,
        qwen2_config,
        set_chat_generation_defaults,
    )

    recipe, vision_act, vision_weights = _vision_tower_start(recipe)
    if recipe.image_size % recipe.patch_size:
        raise ValueError(
            f"image_size {recipe.image_size} must be a multiple of patch_size {recipe.patch_size}"
        )
    # A contrastive tower trains only its CLS token's last layer (the patch tokens of that layer
    # never reach the loss), so a toy-clip tower hands the LM its CLS token too ("full").
    strategy = "full" if vision_weights is not None else "default"
    tokenizer = tokenizer if tokenizer is not None else vlm_tokenizer(recipe.vocab_size)
    text_config = qwen2_config(
        tokenizer,
        recipe.hidden_size,
        recipe.layers,
        intermediate_size=recipe.intermediate_size,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.kv_heads,
    )
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            image_size=recipe.image_size,
            patch_size=recipe.patch_size,
            hidden_size=recipe.vision_width,
            intermediate_size=4 * recipe.vision_width,
            num_hidden_layers=recipe.vision_layers,
            num_attention_heads=recipe.vision_heads,
            projection_dim=recipe.vision_width,
            hidden_act=vision_act,
        ),
        text_config=text_config,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=(recipe.image_size // recipe.patch_size) ** 2 + (strategy == "full"),
        projector_hidden_act="gelu",
        vision_feature_select_strategy=strategy,
        vision_feature_layer=recipe.vision_feature_layer,
        tie_word_embeddings=True,
    )
    torch.manual_seed(recipe.seed)
    model = LlavaForConditionalGeneration(config)
    if vision_weights is not None:
        tower = getattr(model, "model", model).vision_tower  # transformers 5 nests it under .model
        tower = getattr(tower, "vision_model", tower)  # a CLIPVisionModel wraps the transformer
        missing, unexpected = tower.load_state_dict(vision_weights, strict=False)
        if unexpected or [name for name in missing if "position_ids" not in name]:
            raise RuntimeError(
                f"toy-clip -> CLIPVisionModel mismatch: missing {missing}, unexpected {unexpected}"
            )
    set_chat_generation_defaults(model, tokenizer)
    processor = llava_processor(tokenizer, recipe.image_size, recipe.patch_size, strategy)
    return model, processor


def _vision_tower_start(recipe: VLMRecipe) -> tuple[VLMRecipe, str, dict[str, torch.Tensor] | None]:
    """``(recipe, activation, weights)`` of the vision tower: with ``recipe.vision_init`` (a toy-clip
    folder) toy-clip's image-tower architecture (written into the recipe) and converted weights,
    else the recipe's architecture, QuickGELU and no weights."""
    vision_weights = None
    if recipe.vision_init is not None:
        vision_cfg, clip_weights = open_clip_vision(recipe.vision_init)
        if vision_cfg.get("width", 0) % vision_cfg.get("head_width", 64):
            raise ValueError(f"toy-clip vision width is not a multiple of its head width: {vision_cfg}")
        recipe = replace(
            recipe,
            image_size=int(vision_cfg["image_size"]),
            patch_size=int(vision_cfg["patch_size"]),
            vision_width=int(vision_cfg["width"]),
            vision_layers=int(vision_cfg["layers"]),
            vision_heads=int(vision_cfg["width"]) // int(vision_cfg.get("head_width", 64)),
        )
        vision_act = "quick_gelu" if vision_cfg.get("quick_gelu") else "gelu"
        vision_weights = open_clip_vision_to_transformers(clip_weights, recipe.vision_layers)
    else:
        vision_act = "quick_gelu"
    return recipe, vision_act, vision_weights


def answer_token(tokenizer: Any, word: str) -> int:
    """The single token id of an answer word (an error when the tokenizer splits it)."""
    ids = tokenizer.encode(word, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(
            f"answer {word!r} is {len(ids)} tokens {tokenizer.convert_ids_to_tokens(ids)}; must be one"
        )
    return int(ids[0])
