"""toy-clip: an open_clip CLIP trained with CLIP's symmetric InfoNCE over every caption true of a
scene plus NegCLIP's hard negatives (the package docstring states the loss)."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from genalign.toy.prompts import train_prompts
from genalign.toy.reward_models.data import SceneBank, augment_batch, build_bank, sample_scenes
from genalign.toy.training import parameter_count, training_progress, warmup_cosine

logger = logging.getLogger(__name__)


@dataclass
class CLIPRecipe:
    """Architecture and training of ``toy-clip`` (defaults: the shipped model)."""

    seed: int = 0
    image_size: int = 48
    patch_size: int = 8
    vision_width: int = 64
    vision_layers: int = 3
    vision_head_width: int = 32
    text_width: int = 64
    text_heads: int = 4
    text_layers: int = 2
    context_length: int = 20
    embed_dim: int = 64
    scenes_per_prompt: int = 8
    steps: int = 3000
    batch_size: int = 48
    extra_captions: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: int = 100
    hard_negative_weight: float = 1.0
    render_48_probability: float = 0.4
    log_every: int = 25
    max_minutes: float | None = None  # wall-clock budget of the training loop (None: steps only)

    def open_clip_config(self) -> dict[str, Any]:
        return {
            "embed_dim": self.embed_dim,
            "vision_cfg": {
                "image_size": self.image_size,
                "layers": self.vision_layers,
                "width": self.vision_width,
                "head_width": self.vision_head_width,
                "patch_size": self.patch_size,
            },
            "text_cfg": {
                "context_length": self.context_length,
                "vocab_size": 49408,
                "width": self.text_width,
                "heads": self.text_heads,
                "layers": self.text_layers,
            },
        }


def multi_positive_info_nce(logits: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """``-mean_rows log sum_{j positive} softmax(logits_row)_j`` over rows with a positive.

    With exactly one positive per row this is ``F.cross_entropy(logits, target)`` (CLIP's loss).
    """
    if logits.shape != positives.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and positives {tuple(positives.shape)} differ in shape"
        )
    log_probs = logits.log_softmax(dim=-1)
    per_row = -torch.logsumexp(log_probs.masked_fill(~positives, float("-inf")), dim=-1)
    valid = positives.any(dim=-1)
    if not bool(valid.any()):
        raise ValueError("no row has a positive")
    return per_row[valid].mean()


def clip_loss(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    logit_scale: torch.Tensor,
    positives: torch.Tensor,
    own_text: torch.Tensor,
    negative_text: torch.Tensor,
    hard_negative_weight: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The toy-clip loss (module docstring): symmetric multi-positive InfoNCE + hard negatives.

    ``image_features`` ``[B, D]``, ``text_features`` ``[T, D]`` (unnormalised), ``positives`` bool
    ``[B, T]`` (caption t true of image i), ``own_text`` / ``negative_text`` ``[B]`` indices of
    each image's own caption and its one-attribute-changed caption.
    """
    v = F.normalize(image_features, dim=-1)
    u = F.normalize(text_features, dim=-1)
    logits = logit_scale * v @ u.T  # (B, T)
    image_to_text = multi_positive_info_nce(logits, positives)
    columns = torch.unique(own_text)  # captions of the batch: their images are the text-side targets
    text_to_image = multi_positive_info_nce(logits[:, columns].T, positives[:, columns].T)
    rows = torch.arange(logits.shape[0])
    pair = torch.stack([logits[rows, own_text], logits[rows, negative_text]], dim=-1)  # (B, 2)
    hard = F.cross_entropy(pair, torch.zeros(len(rows), dtype=torch.long))
    loss = (image_to_text + text_to_image) / 2 + hard_negative_weight * hard
    parts = {
        "i2t": float(image_to_text.detach()),
        "t2i": float(text_to_image.detach()),
        "hard": float(hard.detach()),
    }
    return loss, parts


def _clip_batch(
    bank: SceneBank, recipe: CLIPRecipe, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Augmented images ``[B, 3, H, W]``, the captions to encode ``[T]`` (prompt indices: the
    batch's own, their hard negatives and ``extra_captions`` random others), positives ``[B, T]``,
    and each image's own and negative caption as positions in that caption list."""
    rows = [s for s in sample_scenes(bank, 4 * recipe.batch_size, rng) if bank.negatives[s]][
        : recipe.batch_size
    ]
    own = [int(bank.prompt_index[s]) for s in rows]
    negative = [bank.negatives[s][rng.integers(len(bank.negatives[s]))] for s in rows]
    extra = rng.choice(len(bank.prompts), size=recipe.extra_captions, replace=False).tolist()
    captions = list(dict.fromkeys(own + negative + extra))
    where = {p: i for i, p in enumerate(captions)}
    images = bank.images[rows].float() / 255.0
    small = rng.random(len(rows)) < recipe.render_48_probability
    if small.any():  # 48 px renders, back at the bank's size (the preprocessing resizes anyway)
        images[small] = F.interpolate(
            F.interpolate(images[small], size=(48, 48), mode="bilinear", antialias=True),
            size=images.shape[-2:],
            mode="bilinear",
        ).clamp(0, 1)
    images = augment_batch(images, rng)
    positives = torch.from_numpy(bank.satisfies[np.ix_(rows, captions)])
    return (
        images,
        torch.tensor(captions),
        positives,
        torch.tensor([where[p] for p in own]),
        torch.tensor([where[p] for p in negative]),
    )


def build_clip(recipe: CLIPRecipe) -> tuple[torch.nn.Module, Any, Any]:
    """A freshly initialised open_clip model of the recipe's architecture: (model, tokenizer, preprocess)."""
    import open_clip

    from genalign.rewards.clip_models import register_open_clip_config
    from genalign.rewards.preprocess import ImagePreprocessor, PreprocessConfig

    name = register_open_clip_config(f"genalign-toy-clip-{recipe.seed}", recipe.open_clip_config())
    torch.manual_seed(recipe.seed)
    model = open_clip.create_model(name)
    tokenizer = open_clip.get_tokenizer(name)
    preprocess = ImagePreprocessor(PreprocessConfig.from_open_clip(model.visual.preprocess_cfg))
    return model, tokenizer, preprocess


def train_clip(
    recipe: CLIPRecipe, bank: SceneBank | None = None, log: Callable[[str], None] = logger.info
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Train toy-clip; returns the model and a log (``losses`` per step, ``seconds``, ``parameters``)."""
    start = time.time()
    rng = np.random.default_rng(recipe.seed)
    if bank is None:
        bank = build_bank(train_prompts(), recipe.scenes_per_prompt, recipe.image_size, recipe.seed)
    model, tokenizer, preprocess = build_clip(recipe)
    tokens = tokenizer([p.caption for p in bank.prompts])
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embedding" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=recipe.lr,
        betas=(0.9, 0.98),
        eps=1e-6,
    )
    losses: list[float] = []
    model.train()
    for step in range(recipe.steps):
        progress = training_progress(step, recipe.steps, start, recipe.max_minutes)
        if progress >= 1:
            break
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr * warmup_cosine(step, progress, recipe.warmup)
        images, captions, positives, own, negatives = _clip_batch(bank, recipe, rng)
        image_features = model.encode_image(preprocess(images))
        text_features = model.encode_text(tokens[captions])
        loss, parts = clip_loss(
            image_features,
            text_features,
            model.logit_scale.exp(),
            positives,
            own,
            negatives,
            recipe.hard_negative_weight,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))  # CLIP's cap on the temperature
        losses.append(float(loss.detach()))
        if recipe.log_every and step % recipe.log_every == 0:
            log(
                f"toy-clip step {step} loss {loss:.4f} {parts} scale {float(model.logit_scale.exp()):.1f} ({time.time() - start:.0f}s)"
            )
    model.eval()
    parameters = parameter_count(model)
    return model, {
        "losses": losses,
        "seconds": time.time() - start,
        "parameters": parameters,
        "steps": len(losses),
    }


@torch.no_grad()
def clip_batch_loss(model: torch.nn.Module, recipe: CLIPRecipe, bank: SceneBank, seed: int) -> float:
    """The toy-clip loss of ``model`` on one batch drawn with ``seed`` (a fixed yardstick for training)."""
    _, tokenizer, preprocess = build_clip(recipe)
    images, captions, positives, own, negatives = _clip_batch(bank, recipe, np.random.default_rng(seed))
    tokens = tokenizer([p.caption for p in bank.prompts])[captions]
    loss, _ = clip_loss(
        model.encode_image(preprocess(images)),
        model.encode_text(tokens),
        model.logit_scale.exp(),
        positives,
        own,
        negatives,
        recipe.hard_negative_weight,
    )
    return float(loss)


def save_clip(model: torch.nn.Module, recipe: CLIPRecipe, folder: str | Path) -> Path:
    """open_clip's hub layout (``open_clip_config.json`` + ``open_clip_model.safetensors``, fp16)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_cfg": recipe.open_clip_config(), "preprocess_cfg": dict(model.visual.preprocess_cfg)}
    (folder / "open_clip_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    state = {key: value.detach().to(torch.float16).contiguous() for key, value in model.state_dict().items()}
    save_file(state, str(folder / "open_clip_model.safetensors"))
    return folder


# Deprecated aliases: class names spell acronyms in upper case (#22); the old names keep working.
ClipRecipe = CLIPRecipe
