"""Toy generators: small real diffusers pipelines trained on the toy world (issue #6).

Three generators that genuinely follow prompts imperfectly, so RL and inference-time methods have
room to improve them and :func:`genalign.toy.evaluate` (ShapesEval) can measure by how much:

- ``toy-sd``: a ``StableDiffusionPipeline`` (UNet2DConditionModel, AutoencoderKL, CLIPTextModel,
  a word-level ``CLIPTokenizer`` of the toy vocabulary, DDIM scheduler). The VAE is trained on
  renders first (:func:`train_vae`, 48 px -> 12 x 12 x 4 latents); the text encoder and UNet are
  then trained jointly from scratch with the epsilon-prediction loss of DDPM (Ho et al. 2020,
  eq. 14, "L_simple") and caption dropout for classifier-free guidance (Ho & Salimans 2022,
  Sec. 3.2): :func:`train_sd`.
- ``toy-lcm``: Latent Consistency Distillation of toy-sd (Luo et al. 2023, "Latent Consistency
  Models", Algorithm 1): :func:`train_lcm`. Saved as a ``LatentConsistencyModelPipeline`` with
  an ``LCMScheduler``.
- ``toy-flow``: a ``StableDiffusion3Pipeline`` (SD3Transformer2DModel, two
  ``CLIPTextModelWithProjection`` encoders, no T5, toy-sd's VAE with a latent shift) trained with
  the rectified-flow loss and SD3's logit-normal timestep density (Esser et al. 2024, eqs. 1-3
  and Sec. 3.1): :func:`train_flow`.

Training data come from the **train** prompt set only (``sample_scene_for_prompt(..., "train")``,
categories drawn uniformly) plus random layouts captioned with the empty prompt, rendered at
48 px; held-out prompts are combinations never seen in training. :func:`evaluate_generator`
samples held-out prompts with fixed seeds and scores them with ShapesEval.

Run ``python -m genalign.toy.generators {vae,toy-sd,toy-lcm,toy-flow,eval} --help``; the exact
commands used for the shipped models are in ``assets/models/<name>/README.md``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from genalign.toy.captions import CATEGORIES
from genalign.toy.prompts import PromptSpec, all_prompts, prompts_for, sample_scene_for_prompt
from genalign.toy.scenes import render_scenes, sample_scene
from genalign.toy.shapes_eval import evaluate

IMAGE_SIZE = 48
TOKEN_LENGTH = 16  # the longest toy caption is 10 words + BOS + EOS
SD_BETAS = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear"}
# the KL weight of the Stable Diffusion autoencoder objective (Rombach et al. 2022); VAE folders
# written before the recipe recorded its KL weight were trained with it
SD_KL_WEIGHT = 1e-6
FAMILIES = ("sd", "consistency", "flow")
# Sampling settings the cards are measured with (and the RL recipes use).
DEFAULT_EVAL = {
    "sd": {"steps": 10, "guidance": 4.5},
    "consistency": {"steps": 4, "guidance": 4.5},
    "flow": {"steps": 10, "guidance": 4.5},
}

__all__ = [
    "DEFAULT_EVAL",
    "IMAGE_SIZE",
    "build_sd3_transformer",
    "build_text_encoder",
    "add_text_pooling",
    "build_unet",
    "build_vae",
    "eval_prompts",
    "evaluate_generator",
    "guidance_scale_embedding",
    "lcm_boundary_scalings",
    "toy_dataset",
    "toy_tokenizer",
    "train_flow",
    "train_lcm",
    "train_sd",
    "train_vae",
]


# -- tokenizer ------------------------------------------------------------------------------------


def toy_words() -> list[str]:
    """Every word of the toy grammar's captions, sorted."""
    return sorted({word for prompt in all_prompts() for word in prompt.caption.split()})


def _byte_symbols() -> list[str]:
    from genalign.tiny.tokenizers import _bytes_to_unicode

    table = _bytes_to_unicode()
    return [table[b] for b in range(256)]


def toy_tokenizer(model_max_length: int = TOKEN_LENGTH):
    """A real ``CLIPTokenizer`` whose BPE merges spell every toy word as one token.

    The vocabulary holds the 256 byte symbols (plain and end-of-word), so any text tokenizes; the
    merges are chosen word by word so that, applied in rank order as BPE does, each toy word ends
    as a single ``word</w>`` token (a new word only appends merges, which rank after all earlier
    ones, so earlier words keep their single-token spelling). Ids: bytes 0-511, merged symbols,
    then ``<|startoftext|>`` and ``<|endoftext|>`` (also padding, as in CLIP).
    """
    from transformers import CLIPTokenizer

    symbols = _byte_symbols()
    vocab = {s: i for i, s in enumerate(symbols)}
    vocab.update({s + "</w>": 256 + i for i, s in enumerate(symbols)})
    ranks: dict[tuple[str, str], int] = {}

    def apply_merges(parts: list[str]) -> list[str]:
        while len(parts) > 1:
            rank, index = min((ranks.get(pair, math.inf), i) for i, pair in enumerate(zip(parts, parts[1:])))
            if rank == math.inf:
                break
            parts[index : index + 2] = [parts[index] + parts[index + 1]]
        return parts

    for word in toy_words():
        parts = apply_merges([*word[:-1], word[-1] + "</w>"])
        while len(parts) > 1:
            ranks[(parts[0], parts[1])] = len(ranks)
            vocab.setdefault(parts[0] + parts[1], len(vocab))
            parts = [parts[0] + parts[1], *parts[2:]]
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    merges = sorted(ranks, key=ranks.__getitem__)
    with tempfile.TemporaryDirectory() as folder:
        vocab_file, merges_file = Path(folder) / "vocab.json", Path(folder) / "merges.txt"
        vocab_file.write_text(json.dumps(vocab), encoding="utf-8")
        merges_file.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
        return CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=model_max_length)


def _tokenize(tokenizer, captions: Sequence[str]) -> torch.Tensor:
    return tokenizer(
        list(captions),
        padding="max_length",
        max_length=tokenizer.model_max_length,
        truncation=True,
        return_tensors="pt",
    ).input_ids


# -- builders -------------------------------------------------------------------------------------


def build_text_encoder(
    tokenizer, hidden_size: int = 64, num_layers: int = 2, projection_dim: int | None = None
) -> torch.nn.Module:
    """A small CLIP text tower over ``tokenizer``'s vocabulary; with ``projection_dim`` a
    ``CLIPTextModelWithProjection`` (SD3's encoders), else a ``CLIPTextModel`` (SD 1.x)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        max_position_embeddings=tokenizer.model_max_length,
        projection_dim=projection_dim or hidden_size,
        hidden_act="quick_gelu",
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,  # pooling reads the first EOS
        pad_token_id=tokenizer.pad_token_id,
    )
    return CLIPTextModelWithProjection(config) if projection_dim else CLIPTextModel(config)


def clip_text_encoder(clip_model: str | Path | torch.nn.Module, tokenizer) -> torch.nn.Module:
    """An open_clip CLIP's text tower (toy-clip's) as a transformers ``CLIPTextModel`` over
    ``tokenizer``'s vocabulary (the toy tokenizer): what Stable Diffusion conditions on, a pretrained
    CLIP text encoder (Rombach et al. 2022, Sec. 4.3), with weights copied, not retrained.

    ``clip_model`` is an open_clip model or a folder with ``open_clip_config.json`` (loaded as
    ``local-dir:``). Both towers are pre-LayerNorm causal transformers with exact GELU; the fused
    ``in_proj`` is split into query, key and value, and the last hidden state (after ``ln_final``,
    before ``text_projection``) is what the UNet attends to. Token rows: each toy token takes the row
    of the same symbol in open_clip's vocabulary (start and end of text map to open_clip's); a
    symbol open_clip splits (``triangles</w>``: ``tri`` + ``angles</w>``) takes its lemma's row
    (``triangle</w>``), and a symbol it lacks that no toy caption produces (an intermediate merge)
    takes the mean row. Padding stays the end-of-text token, after which the causal mask keeps every
    position up to and including it identical to open_clip's.
    """
    import open_clip
    from transformers import CLIPTextConfig, CLIPTextModel

    from genalign.toy.reward_models import open_clip_blocks_to_transformers

    if not isinstance(clip_model, torch.nn.Module):
        folder = Path(clip_model)
        if not (folder / "open_clip_config.json").is_file():
            raise FileNotFoundError(f"{folder} has no open_clip_config.json: not an open_clip model folder")
        clip_model = open_clip.create_model(f"local-dir:{folder}")
    clip_tokenizer = open_clip.tokenizer.SimpleTokenizer()
    blocks = clip_model.transformer.resblocks
    width = clip_model.token_embedding.embedding_dim
    if clip_model.positional_embedding.shape[0] < tokenizer.model_max_length:
        raise ValueError(
            f"the CLIP text tower has {clip_model.positional_embedding.shape[0]} positions, fewer than the "
            f"tokenizer's {tokenizer.model_max_length}"
        )
    if any(not isinstance(block.mlp.gelu, torch.nn.GELU) for block in blocks):
        raise ValueError("only open_clip text towers with exact GELU convert (this one uses QuickGELU)")
    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=blocks[0].mlp.c_fc.out_features,
        num_hidden_layers=len(blocks),
        num_attention_heads=blocks[0].attn.num_heads,
        max_position_embeddings=tokenizer.model_max_length,
        hidden_act="gelu",
        layer_norm_eps=clip_model.ln_final.eps,
        projection_dim=width,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    encoder = CLIPTextModel(config).eval()
    source = clip_model.token_embedding.weight.detach()
    special = {
        tokenizer.bos_token: clip_tokenizer.sot_token_id,
        tokenizer.eos_token: clip_tokenizer.eot_token_id,
    }
    rows = torch.empty(len(tokenizer), width)
    for symbol, index in tokenizer.get_vocab().items():
        if symbol in special:
            rows[index] = source[special[symbol]]
        elif symbol in clip_tokenizer.encoder:
            rows[index] = source[clip_tokenizer.encoder[symbol]]
        elif symbol.endswith("s</w>") and symbol[:-5] + "</w>" in clip_tokenizer.encoder:
            rows[index] = source[clip_tokenizer.encoder[symbol[:-5] + "</w>"]]
        else:
            rows[index] = source.mean(0)
    weights = clip_model.state_dict()  # load_state_dict below copies these into the new encoder
    state = {
        "embeddings.token_embedding.weight": rows,
        "embeddings.position_embedding.weight": weights["positional_embedding"][: tokenizer.model_max_length],
        "final_layer_norm.weight": weights["ln_final.weight"],
        "final_layer_norm.bias": weights["ln_final.bias"],
        **open_clip_blocks_to_transformers(weights, len(blocks)),
    }
    missing, unexpected = getattr(encoder, "text_model", encoder).load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise RuntimeError(f"CLIP text tower conversion: missing {missing}, unexpected {unexpected}")
    return encoder


def build_vae(block_out_channels: Sequence[int] = (16, 32, 32), image_size: int = IMAGE_SIZE):
    """An ``AutoencoderKL`` that downsamples 4x into 4 latent channels (48 px -> 12 x 12 x 4).

    No attention in the middle blocks: the autoencoder is fully convolutional, so it can be
    trained on crops and used on whole images."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * len(block_out_channels),
        up_block_types=("UpDecoderBlock2D",) * len(block_out_channels),
        block_out_channels=tuple(block_out_channels),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=image_size,
        mid_block_add_attention=False,
    )


def build_unet(
    sample_size: int = IMAGE_SIZE // 4,
    block_out_channels: Sequence[int] = (32, 64),
    cross_attention_dim: int = 64,
    time_cond_proj_dim: int | None = None,
    text_pooling: bool = True,
):
    """A two-level ``UNet2DConditionModel`` (12 x 12 and 6 x 6) with self- and cross-attention
    (2 heads) at the lower level and in the middle block; ``time_cond_proj_dim`` adds LCM's
    guidance-scale input.

    ``text_pooling`` adds diffusers' ``addition_embed_type="text"``: an attention-pooled summary
    of the prompt embedding is added to the timestep embedding (the global text conditioning of
    unCLIP/DeepFloyd IF's UNets), so every ResNet block, not only the 6 x 6 cross-attention, sees
    the prompt. It needs no extra pipeline input, so the stock ``StableDiffusionPipeline`` runs
    it; on this tiny UNet it is what makes colour and shape follow the prompt."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=sample_size,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        block_out_channels=tuple(block_out_channels),
        layers_per_block=1,
        norm_num_groups=16,
        attention_head_dim=2,  # diffusers' legacy name: the number of heads
        cross_attention_dim=cross_attention_dim,
        time_cond_proj_dim=time_cond_proj_dim,
        **({"addition_embed_type": "text", "addition_embed_type_num_heads": 4} if text_pooling else {}),
    )


def add_text_pooling(unet):
    """``unet`` with :func:`build_unet`'s ``text_pooling`` added, as a function-preserving
    extension: every existing weight is copied and the pooled embedding's output LayerNorm starts
    with zero gain, so the new branch adds exactly zero until training moves that gain (a zero
    gain, unlike a zero projection before the LayerNorm, keeps the gradients well scaled)."""
    from diffusers import UNet2DConditionModel

    if unet.config.addition_embed_type == "text":
        return unet
    if unet.config.addition_embed_type is not None:
        raise ValueError(f"the UNet already has addition_embed_type={unet.config.addition_embed_type!r}")
    extended = UNet2DConditionModel.from_config(
        dict(unet.config), addition_embed_type="text", addition_embed_type_num_heads=4
    )
    missing, unexpected = extended.load_state_dict(unet.state_dict(), strict=False)
    if unexpected or any(not name.startswith("add_embedding.") for name in missing):
        raise RuntimeError(f"UNet extension mismatch: missing {missing}, unexpected {unexpected}")
    torch.nn.init.zeros_(extended.add_embedding.norm2.weight)
    return extended.to(unet.device, unet.dtype)


def build_sd3_transformer(
    sample_size: int = IMAGE_SIZE // 4,
    num_layers: int = 3,
    heads: int = 4,
    head_dim: int = 24,
    joint_attention_dim: int = 128,
    pooled_projection_dim: int = 64,
):
    """An ``SD3Transformer2DModel`` (MMDiT, patch 2: 36 image tokens at 12 x 12 latents)."""
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(
        sample_size=sample_size,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=num_layers,
        attention_head_dim=head_dim,
        num_attention_heads=heads,
        joint_attention_dim=joint_attention_dim,
        caption_projection_dim=heads * head_dim,
        pooled_projection_dim=pooled_projection_dim,
        pos_embed_max_size=sample_size,
    )


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# -- data -----------------------------------------------------------------------------------------


def toy_dataset(
    num_images: int,
    seed: int = 0,
    size: int = IMAGE_SIZE,
    unconditional_fraction: float = 0.15,
    backend: str = "skia",
) -> tuple[torch.Tensor, list[str]]:
    """Renders and captions for training: ``(uint8 [N, 3, size, size], captions)``.

    Each image is, with probability ``unconditional_fraction``, a random layout of 1-4 random
    objects captioned ``""`` (it teaches the unconditional branch and the VAE more layouts without
    revealing any held-out combination); otherwise a category is drawn uniformly and a **train**
    prompt of it with a scene that satisfies it (:func:`sample_scene_for_prompt`).
    """
    if not 0 <= unconditional_fraction <= 1:
        raise ValueError(f"unconditional_fraction must be in [0, 1], got {unconditional_fraction}")
    rng = np.random.default_rng(seed)
    scenes, captions = [], []
    for _ in range(num_images):
        if rng.random() < unconditional_fraction:
            scenes.append(sample_scene(rng))
            captions.append("")
        else:
            category = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
            scene, caption, _ = sample_scene_for_prompt(category, rng, split="train")
            scenes.append(scene)
            captions.append(caption)
    chunks = [
        (render_scenes(scenes[i : i + 512], size, backend=backend) * 255).round().to(torch.uint8)
        for i in range(0, len(scenes), 512)
    ]
    return torch.cat(chunks), captions


def _to_model_range(images: torch.Tensor) -> torch.Tensor:
    return images.float() / 127.5 - 1.0


@torch.no_grad()
def _encode_latents(vae, images: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Posterior means of uint8 images (unscaled latents)."""
    return torch.cat(
        [
            vae.encode(_to_model_range(images[i : i + batch_size])).latent_dist.mean
            for i in range(0, len(images), batch_size)
        ]
    )


# -- training utilities -----------------------------------------------------------------------------


class EMA:
    """Exponential moving average of parameters, ``theta_ema <- mu theta_ema + (1 - mu) theta``."""

    def __init__(self, modules: Sequence[torch.nn.Module], decay: float) -> None:
        self.decay = decay
        self.modules = [copy.deepcopy(m).requires_grad_(False).eval() for m in modules]
        self._pairs = [
            (e, p) for ema, m in zip(self.modules, modules) for e, p in zip(ema.parameters(), m.parameters())
        ]

    @torch.no_grad()
    def update(self, decay: float | None = None) -> None:
        mu = self.decay if decay is None else decay
        for ema_param, param in self._pairs:
            ema_param.lerp_(param.detach(), 1 - mu)


def _lr_lambda(warmup: int, total: int):
    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return schedule


@contextmanager
def _threads(num_threads: int | None) -> Iterator[None]:
    previous = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class _Log:
    def __init__(self, every: int, total: int, name: str) -> None:
        self.every, self.total, self.name = every, total, name
        self.start = time.time()
        self.losses: list[float] = []
        self.history: list[float] = []

    def __call__(self, step: int, loss: float) -> None:
        self.losses.append(loss)
        if (step + 1) % self.every == 0 or step + 1 == self.total:
            mean = float(np.mean(self.losses))
            self.history.append(mean)
            self.losses.clear()
            if self.every < self.total:
                elapsed = time.time() - self.start
                print(
                    f"[{self.name}] step {step + 1}/{self.total} loss {mean:.4f} ({elapsed:.0f}s)", flush=True
                )


# -- VAE --------------------------------------------------------------------------------------------


def train_vae(
    out: str | Path | None = None,
    steps: int = 600,
    batch_size: int = 16,
    lr: float = 2e-3,
    num_images: int = 4000,
    seed: int = 0,
    kl_weight: float = SD_KL_WEIGHT,
    crop: int = 24,
    block_out_channels: Sequence[int] = (16, 32, 32),
    log_every: int = 100,
) -> tuple[Any, dict[str, Any]]:
    """Train the KL autoencoder on renders (reconstruction L1 + L2 and a small KL term, the
    Stable Diffusion autoencoder objective of Rombach et al. 2022, Sec. 3.1, without the
    perceptual and adversarial terms, which flat shapes on white do not need). Each step trains
    on random ``crop`` x ``crop`` windows (at multiples of 4 px, the latent grid) of the renders:
    the autoencoder is convolutional, and crops cost a quarter of a 48 px image.

    The latent ``scaling_factor`` is then set to one over the standard deviation of the training
    latents (Rombach et al. 2022, Appendix G), so scaled latents have unit variance. Returns
    ``(vae, info)``; ``info`` has the loss history and reconstruction error.
    """
    torch.manual_seed(seed)
    images, _ = toy_dataset(num_images, seed=seed, unconditional_fraction=0.3)
    vae = build_vae(block_out_channels)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(min(100, steps // 10 + 1), steps))
    generator = torch.Generator().manual_seed(seed)
    log = _Log(log_every, steps, "vae")
    vae.train()
    for step in range(steps):
        index = torch.randint(len(images), (batch_size,), generator=generator)
        x = _to_model_range(images[index])
        if crop < x.shape[-1]:
            top, left = (
                4 * torch.randint(0, (x.shape[-1] - crop) // 4 + 1, (2,), generator=generator)
            ).tolist()
            x = x[..., top : top + crop, left : left + crop]
        posterior = vae.encode(x).latent_dist
        reconstruction = vae.decode(posterior.sample(generator)).sample
        loss = (
            F.l1_loss(reconstruction, x) + F.mse_loss(reconstruction, x) + kl_weight * posterior.kl().mean()
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        log(step, loss.item())
    vae.eval()
    latents = _encode_latents(vae, images[:2000])
    vae.register_to_config(scaling_factor=round(float(1.0 / latents.std()), 5))
    with torch.no_grad():
        held = _to_model_range(toy_dataset(64, seed=seed + 1)[0])
        error = float((vae.decode(vae.encode(held).latent_dist.mean).sample - held).abs().mean() / 2)
    info = {
        "loss_history": log.history,
        "reconstruction_mae": error,
        "parameters": parameter_count(vae),
        "scaling_factor": vae.config.scaling_factor,
        "kl_weight": kl_weight,
    }
    if out is not None:
        vae.save_pretrained(str(out))
    return vae, info


# -- toy-sd -----------------------------------------------------------------------------------------


def _finish_training(
    pipe, parameters: dict[str, Any], done: int, log: _Log, start: float, out
) -> tuple[Any, dict[str, Any]]:
    """Describe a finished training run of ``pipe`` (steps, losses, seconds, parameter counts of
    the named modules or lists of modules) and save the pipeline if ``out`` is given."""
    pipe.set_progress_bar_config(disable=True)
    info = {
        "steps": done,
        "loss_history": log.history,
        "train_seconds": round(time.time() - start, 1),
        "parameters": {
            name: sum(parameter_count(m) for m in (modules if isinstance(modules, list) else [modules]))
            for name, modules in parameters.items()
        },
    }
    if out is not None:
        pipe.save_pretrained(str(out))
    return pipe, info


def _finish_sd_layout(
    pipeline_class, vae, text_encoder, tokenizer, unet, scheduler, done: int, log: _Log, start: float, out
) -> tuple[Any, dict[str, Any]]:
    """Assemble an SD-layout pipeline (toy-sd, toy-lcm), describe its training, save it if asked."""
    pipe = pipeline_class(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    parameters = {"unet": unet, "text_encoder": text_encoder, "vae": vae}
    return _finish_training(pipe, parameters, done, log, start, out)


def train_sd(
    vae,
    out: str | Path | None = None,
    steps: int = 6000,
    batch_size: int = 64,
    lr: float = 5e-4,
    num_images: int = 30000,
    seed: int = 0,
    caption_dropout: float = 0.1,
    ema_decay: float = 0.99,
    unet_channels: Sequence[int] = (32, 64),
    text_hidden: int = 64,
    text_layers: int = 2,
    log_every: int = 200,
    max_minutes: float | None = None,
    init: str | Path | None = None,
    text_pooling: bool = True,
    snapshot_every: int | None = None,
    v_weight_cap: float | None = None,
    clip_text: str | Path | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Train the text encoder and UNet jointly from scratch on VAE latents of renders
    (or, with ``init``, continue from a saved toy-sd folder's text encoder and UNet; with
    ``text_pooling`` a UNet without it is extended by :func:`add_text_pooling`).

    Loss: DDPM's L_simple, ``|| eps - eps_theta(sqrt(a_t) z_0 + sqrt(1 - a_t) eps, t, c) ||^2``
    with ``t`` uniform over the 1000 training steps of SD's scaled-linear schedule (Ho et al.
    2020, eq. 14). With probability ``caption_dropout`` the caption is replaced by the empty
    prompt, which is what the pipeline encodes as the unconditional branch of classifier-free
    guidance (Ho & Salimans 2022, Algorithm 1). The saved weights are the EMA of both modules.
    With ``v_weight_cap`` the timesteps are drawn with probability proportional to
    ``min(1 / a_t, v_weight_cap)`` instead (:func:`v_loss_timestep_weights`): in expectation that is
    the v-prediction loss (Salimans & Ho 2022, Sec. 4) of the same epsilon-parameterised model,
    which weights the noisy timesteps where a small model decides global attributes (colour, count)
    far more than L_simple does. With ``clip_text`` (an open_clip folder, toy-clip) the text encoder
    is that CLIP's text tower (:func:`clip_text_encoder`), frozen as in Stable Diffusion, and only
    the UNet trains (also when continuing from ``init``, whose text encoder it replaces).
    ``max_minutes`` stops early (the schedule still assumes ``steps``); ``snapshot_every`` saves
    the EMA weights as a pipeline under ``out/snapshot`` every that many steps, so a long run can be
    evaluated while it trains. Returns ``(pipeline, info)``.
    """
    from diffusers import DDIMScheduler, DDPMScheduler, StableDiffusionPipeline

    def sampler():
        return DDIMScheduler(**SD_BETAS, clip_sample=False, set_alpha_to_one=False, steps_offset=1)

    torch.manual_seed(seed)
    tokenizer = toy_tokenizer()
    images, captions = toy_dataset(num_images, seed=seed + 1000)
    latents = _encode_latents(vae, images) * vae.config.scaling_factor
    ids = _tokenize(tokenizer, captions)
    empty_ids = _tokenize(tokenizer, [""])[0]
    if init is None:
        text_encoder = build_text_encoder(tokenizer, text_hidden, text_layers)
        unet = build_unet(
            latents.shape[-1], unet_channels, cross_attention_dim=text_hidden, text_pooling=text_pooling
        )
    else:
        start_from = StableDiffusionPipeline.from_pretrained(
            str(init), safety_checker=None, feature_extractor=None
        )
        text_encoder, unet = start_from.text_encoder, start_from.unet
        if text_pooling:
            unet = add_text_pooling(unet)
    if clip_text is not None:
        text_encoder = clip_text_encoder(clip_text, tokenizer).requires_grad_(False)
        if unet.config.cross_attention_dim != text_encoder.config.hidden_size:
            raise ValueError(
                f"the UNet attends to {unet.config.cross_attention_dim}-d text states but the CLIP text tower "
                f"{clip_text} gives {text_encoder.config.hidden_size}-d ones"
            )
    noise_scheduler = DDPMScheduler(**SD_BETAS, clip_sample=False)
    alphas_cumprod = noise_scheduler.alphas_cumprod
    timestep_weights = None if v_weight_cap is None else v_loss_timestep_weights(alphas_cumprod, v_weight_cap)
    params = [p for p in (*text_encoder.parameters(), *unet.parameters()) if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(min(200, steps // 10 + 1), steps))
    ema = EMA([text_encoder, unet], ema_decay)
    generator = torch.Generator().manual_seed(seed)
    log = _Log(log_every, steps, "toy-sd")
    start = time.time()
    text_encoder.train(clip_text is None)
    unet.train()
    done = 0
    for step in range(steps):
        index = torch.randint(len(latents), (batch_size,), generator=generator)
        z0, tokens = latents[index], ids[index].clone()
        drop = torch.rand(batch_size, generator=generator) < caption_dropout
        tokens[drop] = empty_ids
        if timestep_weights is None:
            t = torch.randint(0, len(alphas_cumprod), (batch_size,), generator=generator)
        else:
            t = torch.multinomial(timestep_weights, batch_size, replacement=True, generator=generator)
        noise = torch.randn(z0.shape, generator=generator)
        a = alphas_cumprod[t].view(-1, 1, 1, 1)
        zt = a.sqrt() * z0 + (1 - a).sqrt() * noise
        embeds = text_encoder(tokens)[0]
        prediction = unet(zt, t, encoder_hidden_states=embeds).sample
        loss = F.mse_loss(prediction, noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        ema.update(min(ema_decay, (1 + step) / (10 + step)))
        log(step, loss.item())
        done = step + 1
        if snapshot_every and out is not None and done % snapshot_every == 0:
            _finish_sd_layout(
                StableDiffusionPipeline,
                vae,
                ema.modules[0],
                tokenizer,
                ema.modules[1],
                sampler(),
                done,
                log,
                start,
                Path(out) / "snapshot",
            )
        if max_minutes is not None and time.time() - start > 60 * max_minutes:
            print(f"[toy-sd] stopping at step {done}: {max_minutes} minutes", flush=True)
            break
    text_encoder, unet = ema.modules
    return _finish_sd_layout(
        StableDiffusionPipeline, vae, text_encoder, tokenizer, unet, sampler(), done, log, start, out
    )


def v_loss_timestep_weights(alphas_cumprod: torch.Tensor, cap: float) -> torch.Tensor:
    """Timestep probabilities that turn epsilon MSE into (clipped) v-prediction MSE in expectation.

    With ``v = sqrt(a_t) eps - sqrt(1 - a_t) z_0`` (Salimans & Ho 2022) and an epsilon-parameterised
    model, ``z_0_hat = (z_t - sqrt(1 - a_t) eps_hat) / sqrt(a_t)``, so
    ``v_hat - v = (eps_hat - eps) / sqrt(a_t)`` and ``||v_hat - v||^2 = ||eps_hat - eps||^2 / a_t``.
    Drawing ``t`` with probability ``min(1 / a_t, cap) / Z`` and averaging plain epsilon MSE is an
    unbiased estimate of ``E_t[min(1 / a_t, cap) ||eps_hat - eps||^2] / Z`` (the cap keeps the last
    few timesteps, where ``1 / a_t`` reaches 200, from taking most of the batch).
    """
    if not cap >= 1:
        raise ValueError(f"v_weight_cap must be at least 1 (1 gives uniform timesteps), got {cap}")
    weights = (1.0 / alphas_cumprod.double()).clamp(max=cap)
    return (weights / weights.sum()).float()


# -- toy-lcm ----------------------------------------------------------------------------------------


def guidance_scale_embedding(w: torch.Tensor, dim: int) -> torch.Tensor:
    """LCM's sinusoidal embedding of the guidance weight ``w`` (Luo et al. 2023, Sec. 4.2; the
    transformer-style timestep embedding of ``1000 w``, as diffusers' LCM pipeline computes it)."""
    half = dim // 2
    frequencies = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / (half - 1)))
    angles = (1000.0 * w.float())[:, None] * frequencies[None, :]
    embedding = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    return F.pad(embedding, (0, 1)) if dim % 2 else embedding


def lcm_boundary_scalings(
    timesteps: torch.Tensor, sigma_data: float = 0.5, timestep_scaling: float = 10.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(c_skip, c_out)`` of the consistency parameterisation
    ``f(x, t) = c_skip(t) x + c_out(t) x0_hat(x, t)`` (Song et al. 2023, eq. 3 and Appendix C;
    LCM, Luo et al. 2023, eq. 9) with ``c_skip(0) = 1``, ``c_out(0) = 0``, on the scaled discrete
    timestep ``timestep_scaling * t`` as ``LCMScheduler`` evaluates them at sampling time."""
    scaled = timestep_scaling * timesteps.float()
    c_skip = sigma_data**2 / (scaled**2 + sigma_data**2)
    c_out = scaled / (scaled**2 + sigma_data**2).sqrt()
    return c_skip, c_out


def _x0_from_eps(sample: torch.Tensor, eps: torch.Tensor, alpha_bar: torch.Tensor) -> torch.Tensor:
    return (sample - (1 - alpha_bar).sqrt() * eps) / alpha_bar.sqrt()


def train_lcm(
    teacher,
    out: str | Path | None = None,
    steps: int = 2000,
    batch_size: int = 64,
    lr: float = 2e-4,
    num_images: int = 20000,
    seed: int = 0,
    num_ddim_timesteps: int = 50,
    w_min: float = 2.0,
    w_max: float = 6.0,
    ema_decay: float = 0.95,
    time_cond_proj_dim: int = 64,
    log_every: int = 100,
    max_minutes: float | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Latent Consistency Distillation of an SD pipeline (Luo et al. 2023, Algorithm 1).

    Per step: latents ``z`` of renders with their captions; an index ``n`` of the ``N =
    num_ddim_timesteps`` DDIM grid (skip ``k = 1000 / N``) gives ``t_{n+k}`` and ``t_n``; a guidance
    weight ``w ~ U[w_min, w_max]`` (Algorithm 1's ``omega``); ``z_{n+k} = sqrt(a) z + sqrt(1 - a) eps``.
    The frozen teacher's guided DDIM step (eq. 11 with Psi = DDIM, CFG as
    ``x_hat = x_c + w (x_c - x_uncond)`` on both x0 and epsilon) gives ``z_hat_n``. The loss is
    ``|| f_theta(z_{n+k}, w, c, t_{n+k}) - f_theta^-(z_hat_n, w, c, t_n) ||^2`` where
    ``f = c_skip z + c_out x0_hat`` (:func:`lcm_boundary_scalings`) and ``theta^-`` is the EMA of
    ``theta`` with decay ``ema_decay`` (Algorithm 1's mu). The student is the teacher's UNet with
    a guidance-embedding input (``time_cond_proj_dim``, :func:`guidance_scale_embedding` of
    ``w``) whose projection starts at zero, so it starts as the teacher. The saved UNet is the EMA
    target ``theta^-``; the pipeline samples with ``guidance_scale = 1 + w``.
    """
    from diffusers import LatentConsistencyModelPipeline, LCMScheduler, UNet2DConditionModel

    torch.manual_seed(seed)
    teacher_unet, text_encoder, tokenizer, vae = (
        teacher.unet,
        teacher.text_encoder,
        teacher.tokenizer,
        teacher.vae,
    )
    for module in (teacher_unet, text_encoder, vae):
        module.requires_grad_(False).eval()
    images, captions = toy_dataset(num_images, seed=seed + 2000)
    latents = _encode_latents(vae, images) * vae.config.scaling_factor
    unique = sorted(set(captions) | {""})
    with torch.no_grad():
        table = torch.cat(
            [text_encoder(_tokenize(tokenizer, unique[i : i + 256]))[0] for i in range(0, len(unique), 256)]
        )
    caption_index = torch.tensor([unique.index(c) for c in captions])
    empty = table[unique.index("")]

    student = UNet2DConditionModel.from_config(
        dict(teacher_unet.config), time_cond_proj_dim=time_cond_proj_dim
    )
    missing, unexpected = student.load_state_dict(teacher_unet.state_dict(), strict=False)
    if unexpected or any("cond_proj" not in name for name in missing):
        raise RuntimeError(f"student/teacher mismatch: missing {missing}, unexpected {unexpected}")
    torch.nn.init.zeros_(student.time_embedding.cond_proj.weight)
    student.train()
    target = copy.deepcopy(student).requires_grad_(False).eval()
    target_pairs = list(zip(target.parameters(), student.parameters()))

    alphas_cumprod = teacher.scheduler.alphas_cumprod.float()
    train_steps = len(alphas_cumprod)
    skip = train_steps // num_ddim_timesteps
    ddim_timesteps = torch.arange(1, num_ddim_timesteps + 1) * skip - 1  # t_1 .. t_N (as LCMScheduler)
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(min(100, steps // 10 + 1), steps))
    generator = torch.Generator().manual_seed(seed)
    log = _Log(log_every, steps, "toy-lcm")
    start = time.time()
    done = 0
    for step in range(steps):
        index = torch.randint(len(latents), (batch_size,), generator=generator)
        z0 = latents[index]
        cond = table[caption_index[index]]
        n = torch.randint(0, num_ddim_timesteps, (batch_size,), generator=generator)
        t_start = ddim_timesteps[n]
        t_end = (t_start - skip).clamp(min=0)
        a_start = alphas_cumprod[t_start].view(-1, 1, 1, 1)
        a_end = torch.where(t_start - skip >= 0, alphas_cumprod[t_end], alphas_cumprod[0]).view(-1, 1, 1, 1)
        w = w_min + (w_max - w_min) * torch.rand(batch_size, generator=generator)
        w_embedding = guidance_scale_embedding(w, time_cond_proj_dim)
        noise = torch.randn(z0.shape, generator=generator)
        z_start = a_start.sqrt() * z0 + (1 - a_start).sqrt() * noise

        c_skip_start, c_out_start = (c.view(-1, 1, 1, 1) for c in lcm_boundary_scalings(t_start))
        c_skip_end, c_out_end = (c.view(-1, 1, 1, 1) for c in lcm_boundary_scalings(t_end))
        eps_student = student(z_start, t_start, encoder_hidden_states=cond, timestep_cond=w_embedding).sample
        f_student = c_skip_start * z_start + c_out_start * _x0_from_eps(z_start, eps_student, a_start)
        with torch.no_grad():
            eps_pair = teacher_unet(
                torch.cat([z_start, z_start]),
                torch.cat([t_start, t_start]),
                encoder_hidden_states=torch.cat([cond, empty.expand_as(cond)]),
            ).sample
            eps_cond, eps_uncond = eps_pair.chunk(2)
            x0_cond = _x0_from_eps(z_start, eps_cond, a_start)
            x0_uncond = _x0_from_eps(z_start, eps_uncond, a_start)
            x0_guided = x0_cond + w.view(-1, 1, 1, 1) * (x0_cond - x0_uncond)
            eps_guided = eps_cond + w.view(-1, 1, 1, 1) * (eps_cond - eps_uncond)
            z_end = a_end.sqrt() * x0_guided + (1 - a_end).sqrt() * eps_guided  # DDIM (eta = 0)
            eps_target = target(z_end, t_end, encoder_hidden_states=cond, timestep_cond=w_embedding).sample
            f_target = c_skip_end * z_end + c_out_end * _x0_from_eps(z_end, eps_target, a_end)
        loss = F.mse_loss(f_student, f_target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        with torch.no_grad():
            for target_param, param in target_pairs:
                target_param.lerp_(param.detach(), 1 - ema_decay)
        log(step, loss.item())
        done = step + 1
        if max_minutes is not None and time.time() - start > 60 * max_minutes:
            print(f"[toy-lcm] stopping at step {done}: {max_minutes} minutes", flush=True)
            break
    lcm_scheduler = LCMScheduler(
        **SD_BETAS,
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        original_inference_steps=num_ddim_timesteps,
        timestep_scaling=10.0,
    )
    return _finish_sd_layout(
        LatentConsistencyModelPipeline,
        vae,
        text_encoder,
        tokenizer,
        target,
        lcm_scheduler,
        done,
        log,
        start,
        out,
    )


# -- toy-flow ---------------------------------------------------------------------------------------


SD3_T5_TOKENS = 256  # StableDiffusion3Pipeline.encode_prompt's default max_sequence_length


def sd3_prompt_embeddings(
    text_encoders: Sequence[torch.nn.Module],
    ids: torch.Tensor,
    joint_attention_dim: int,
    t5_tokens: int = SD3_T5_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SD3's prompt conditioning from its two CLIP encoders without T5, as
    ``StableDiffusion3Pipeline.encode_prompt`` builds it (Esser et al. 2024, Sec. 5.1 and Fig. 2):
    the penultimate hidden states of both encoders concatenated along features and zero-padded
    to the T5 width, followed by ``t5_tokens`` zero tokens in place of T5's; pooled = both
    projections concatenated."""
    hidden, pooled = [], []
    for encoder in text_encoders:
        output = encoder(ids, output_hidden_states=True)
        pooled.append(output[0])
        hidden.append(output.hidden_states[-2])
    clip = torch.cat(hidden, dim=-1)
    clip = F.pad(clip, (0, joint_attention_dim - clip.shape[-1]))
    t5 = torch.zeros(ids.shape[0], t5_tokens, joint_attention_dim, dtype=clip.dtype)
    return torch.cat([clip, t5], dim=-2), torch.cat(pooled, dim=-1)


class RepeatedTokenJointAttention:
    """SD3 joint attention in which the last context token stands for ``repeats`` identical ones.

    Without T5, SD3's pipeline appends 256 zero tokens to the prompt; every layer maps identical
    tokens to identical states (all per-token maps, and identical queries attend identically), so
    ``r`` copies of a key/value are exactly one copy whose attention logit is raised by ``log r``
    (softmax: ``r e^s = e^(s + log r)``). Training with one zero token and this processor is
    therefore the same function as sampling with the pipeline's 256, at a fraction of the cost
    (checked in ``tests/toy/test_toy_generators.py``). Otherwise as diffusers' JointAttnProcessor2_0.
    """

    def __init__(self, repeats: int) -> None:
        self.log_repeats = math.log(repeats)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **kwargs):
        batch, length = hidden_states.shape[:2]

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(batch, -1, attn.heads, x.shape[-1] // attn.heads).transpose(1, 2)

        query, key, value = (
            split(attn.to_q(hidden_states)),
            split(attn.to_k(hidden_states)),
            split(attn.to_v(hidden_states)),
        )
        if attn.norm_q is not None:
            query, key = attn.norm_q(query), attn.norm_k(key)
        context_q = split(attn.add_q_proj(encoder_hidden_states))
        context_k = split(attn.add_k_proj(encoder_hidden_states))
        context_v = split(attn.add_v_proj(encoder_hidden_states))
        if attn.norm_added_q is not None:
            context_q, context_k = attn.norm_added_q(context_q), attn.norm_added_k(context_k)
        query = torch.cat([query, context_q], dim=2)
        key = torch.cat([key, context_k], dim=2)
        value = torch.cat([value, context_v], dim=2)
        bias = torch.zeros(key.shape[2], dtype=query.dtype)
        bias[-1] = self.log_repeats
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias[None])
        out = out.transpose(1, 2).reshape(batch, -1, query.shape[1] * query.shape[-1]).to(query.dtype)
        hidden_out, context_out = out[:, :length], out[:, length:]
        if not attn.context_pre_only:
            context_out = attn.to_add_out(context_out)
        hidden_out = attn.to_out[1](attn.to_out[0](hidden_out))
        return hidden_out, context_out


def flow_vae(vae, latents: torch.Tensor):
    """A copy of ``vae`` whose ``shift_factor`` / ``scaling_factor`` standardise ``latents``
    (unscaled), as SD3's VAE config does: ``z = (latent - shift) * scale``."""
    copied = copy.deepcopy(vae)
    shift = float(latents.mean())
    copied.register_to_config(
        shift_factor=round(shift, 5), scaling_factor=round(float(1 / (latents - shift).std()), 5)
    )
    return copied


def train_flow(
    vae,
    out: str | Path | None = None,
    steps: int = 6000,
    batch_size: int = 64,
    lr: float = 5e-4,
    num_images: int = 30000,
    seed: int = 0,
    caption_dropout: float = 0.1,
    ema_decay: float = 0.99,
    num_layers: int = 3,
    text_hidden: int = 64,
    log_every: int = 200,
    max_minutes: float | None = None,
    init: str | Path | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Train an SD3-architecture pipeline from scratch with the rectified-flow loss (or, with
    ``init``, continue from a saved toy-flow folder: its encoders, transformer and latent shift).

    ``z_t = (1 - t) z_0 + t eps`` and the transformer predicts the velocity ``eps - z_0``
    (Esser et al. 2024, eqs. 1-3 with the rectified-flow choice a_t = 1 - t, b_t = t, i.e. the
    conditional flow matching loss); ``t`` is logit-normal, ``t = sigmoid(u)``, ``u ~ N(0, 1)``
    (Sec. 3.1, ``lognorm(0, 1)``), and the transformer reads ``1000 t`` as
    ``FlowMatchEulerDiscreteScheduler`` (shift 1) feeds it at sampling time. Both CLIP encoders
    train jointly with it; caption dropout to ``""`` gives the unconditional branch. The VAE is
    ``vae`` re-saved with a latent shift (:func:`flow_vae`). Saved weights are the EMA. The
    pipeline's 256 zero T5 tokens are trained as one (:class:`RepeatedTokenJointAttention`).
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    torch.manual_seed(seed)
    tokenizer = toy_tokenizer()
    images, captions = toy_dataset(num_images, seed=seed + 3000)
    if init is not None:
        start_from = StableDiffusion3Pipeline.from_pretrained(
            str(init), text_encoder_3=None, tokenizer_3=None
        )
        vae = start_from.vae
        encoders = [start_from.text_encoder, start_from.text_encoder_2]
        transformer = start_from.transformer
        raw = _encode_latents(vae, images)
    else:
        raw = _encode_latents(vae, images)
        vae = flow_vae(vae, raw)
        projection = 32
        encoders = [
            build_text_encoder(tokenizer, text_hidden, 2, projection_dim=projection) for _ in range(2)
        ]
        transformer = build_sd3_transformer(
            raw.shape[-1],
            num_layers,
            joint_attention_dim=2 * text_hidden,
            pooled_projection_dim=2 * projection,
        )
    joint = transformer.config.joint_attention_dim
    latents = (raw - vae.config.shift_factor) * vae.config.scaling_factor
    ids = _tokenize(tokenizer, captions)
    empty_ids = _tokenize(tokenizer, [""])[0]
    modules = [*encoders, transformer]
    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(min(200, steps // 10 + 1), steps))
    ema = EMA(modules, ema_decay)
    generator = torch.Generator().manual_seed(seed)
    log = _Log(log_every, steps, "toy-flow")
    start = time.time()
    for module in modules:
        module.train()
    # one zero token standing for the pipeline's 256 (exact; see RepeatedTokenJointAttention)
    transformer.set_attn_processor(RepeatedTokenJointAttention(SD3_T5_TOKENS))
    done = 0
    for step in range(steps):
        index = torch.randint(len(latents), (batch_size,), generator=generator)
        z0, tokens = latents[index], ids[index].clone()
        tokens[torch.rand(batch_size, generator=generator) < caption_dropout] = empty_ids
        t = torch.sigmoid(torch.randn(batch_size, generator=generator))
        noise = torch.randn(z0.shape, generator=generator)
        zt = (1 - t.view(-1, 1, 1, 1)) * z0 + t.view(-1, 1, 1, 1) * noise
        embeds, pooled = sd3_prompt_embeddings(encoders, tokens, joint, t5_tokens=1)
        velocity = transformer(
            hidden_states=zt, timestep=1000 * t, encoder_hidden_states=embeds, pooled_projections=pooled
        ).sample
        loss = F.mse_loss(velocity, noise - z0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        ema.update(min(ema_decay, (1 + step) / (10 + step)))
        log(step, loss.item())
        done = step + 1
        if max_minutes is not None and time.time() - start > 60 * max_minutes:
            print(f"[toy-flow] stopping at step {done}: {max_minutes} minutes", flush=True)
            break
    encoder_1, encoder_2, transformer = ema.modules
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0),
        vae=vae,
        text_encoder=encoder_1,
        tokenizer=tokenizer,
        text_encoder_2=encoder_2,
        tokenizer_2=copy.deepcopy(tokenizer),
        text_encoder_3=None,
        tokenizer_3=None,
    )
    parameters = {"transformer": transformer, "text_encoders": [encoder_1, encoder_2], "vae": vae}
    return _finish_training(pipe, parameters, done, log, start, out)


# -- evaluation -------------------------------------------------------------------------------------


def eval_prompts(split: str = "heldout", per_category: int | None = None) -> list[PromptSpec]:
    """The prompts an evaluation uses: ``split``'s prompts, or only the first ``per_category`` of
    each category (the small fixed subset the tests re-score)."""
    prompts = prompts_for(split)
    if per_category is None:
        return prompts
    if per_category < 1:
        raise ValueError(f"per_category must be positive, got {per_category}")
    chosen: list[PromptSpec] = []
    for category in CATEGORIES:
        chosen += [p for p in prompts if p.category == category][:per_category]
    return chosen


@torch.no_grad()
def evaluate_generator(
    path: str | Path | Any,
    family: str,
    split: str = "heldout",
    num_per_prompt: int = 4,
    seed: int = 0,
    steps: int | None = None,
    guidance: float | None = None,
    per_category: int | None = None,
    batch_size: int = 64,
    num_threads: int | None = None,
    categories: Sequence[str] | None = None,
) -> dict[str, Any]:
    """ShapesEval of a generator on a prompt split, with fixed seeds.

    Args:
        path: a model folder, ``tiny:NAME`` or an already loaded policy of ``family``.
        family: ``"sd"`` (deterministic DDIM, eta 0), ``"consistency"`` (LCM multistep sampling:
            the consistency estimate re-noised with seeded noise) or ``"flow"`` (Euler ODE).
        split / per_category: which prompts (:func:`eval_prompts`); ``categories`` keeps only
            those categories' prompts (seeds are then numbered over the kept prompts).
        num_per_prompt: images per prompt; image ``j`` of prompt ``i`` has seed
            ``seed + i * num_per_prompt + j``, whatever the batching.
        steps / guidance: sampling steps and guidance scale (default :data:`DEFAULT_EVAL`).

    Returns:
        ``{"overall", "image_accuracy", "per_category", "counts"}`` from :func:`genalign.toy.evaluate`
        plus ``"settings"`` (everything needed to reproduce the numbers).
    """
    from genalign.policies import DiffusionPolicy, load_policy

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if num_per_prompt < 1:
        raise ValueError(f"num_per_prompt must be positive, got {num_per_prompt}")
    steps = DEFAULT_EVAL[family]["steps"] if steps is None else steps
    guidance = DEFAULT_EVAL[family]["guidance"] if guidance is None else guidance
    with _threads(num_threads):
        policy = path if isinstance(path, DiffusionPolicy) else load_policy(family, str(path), train=False)
        prompts = eval_prompts(split, per_category)
        if categories is not None:
            unknown = sorted(set(categories) - {p.category for p in prompts})
            if unknown:
                raise ValueError(f"no {split} prompts in categories {unknown}")
            prompts = [p for p in prompts if p.category in set(categories)]
        captions = [p.caption for p in prompts for _ in range(num_per_prompt)]
        specs = [p.spec for p in prompts for _ in range(num_per_prompt)]
        seeds = seed + torch.arange(len(captions))
        kwargs = {"sd": {"eta": 0.0}, "flow": {"mode": "ode"}, "consistency": {}}[family]
        images = []
        for i in range(0, len(captions), batch_size):
            trajectory = policy.rollout(
                captions[i : i + batch_size],
                num_inference_steps=steps,
                guidance_scale=guidance,
                seeds=seeds[i : i + batch_size],
                **kwargs,
            )
            images.append(trajectory.images.float().cpu())
        result = evaluate(torch.cat(images), specs)
    result.pop("per_sample")
    result["settings"] = {
        "family": family,
        "split": split,
        "per_category": per_category,
        **({"categories": sorted(categories)} if categories is not None else {}),
        "num_prompts": len(prompts),
        "num_per_prompt": num_per_prompt,
        "seed": seed,
        "steps": steps,
        "guidance": guidance,
        "sampler": {"sd": "DDIM eta=0", "flow": "Euler ODE", "consistency": "LCM multistep"}[family],
    }
    return result


# -- model cards ------------------------------------------------------------------------------------


def folder_megabytes(path: str | Path) -> float:
    """Size of a model folder, without a training run's ``snapshot`` sub-folder (not shipped)."""
    files = [f for f in Path(path).rglob("*") if f.is_file() and "snapshot" not in f.relative_to(path).parts]
    return round(sum(f.stat().st_size for f in files) / 2**20, 2)


def write_card(out: str | Path, card: dict[str, Any]) -> None:
    """Write ``card.json`` and a README.md rendered from it."""
    out = Path(out)
    card = dict(card, size_mb=folder_megabytes(out))
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    full, subset = card["eval"], card["eval_subset"]

    def table(result: dict[str, Any]) -> str:
        rows = [
            f"| {c} | {result['per_category'][c]:.3f} | {result['counts'][c]} |"
            for c in result["per_category"]
        ]
        return "\n".join(
            [
                "| category | accuracy | images |",
                "|---|---|---|",
                *rows,
                f"| **overall** | **{result['overall']:.3f}** | |",
            ]
        )

    extra = "".join(
        f"\n### {name}\n\n{table(result)}\n\nSettings: `{json.dumps(result['settings'])}`\n"
        for name, result in card.get("extra_evals", {}).items()
    )
    params = ", ".join(f"{k} {v:,}" for k, v in card["parameters"].items())
    text = f"""# {card["name"]}

{card["description"]}

Built by `genalign/toy/generators.py` (issue #6). Load it with
`{card["load"]}` or `genalign.policies.load_policy("{card["family"]}", "assets/models/{card["name"]}")`.

## Recipe

```
{chr(10).join(card["commands"])}
```

- Data: {card["data"]}
- Parameters: {params} (fp32); {card["size_mb"]} MB on disk.
- Training: {card["train"]}
{card.get("notes", "")}

## ShapesEval (held-out prompts)

Settings: `{json.dumps(full["settings"])}`

{table(full)}

Small fixed subset (re-scored by `tests/toy/test_toy_generators.py`):
settings `{json.dumps(subset["settings"])}`, overall {subset["overall"]:.4f}.
{extra}
Reproduce: `evaluate_generator(path, family, **settings)` in `genalign.toy.generators`
(`steps`, `guidance`, `seed`, `num_per_prompt`, `split`, `per_category` as above).
"""
    (out / "README.md").write_text(text, encoding="utf-8")


# -- command line -----------------------------------------------------------------------------------


def _command_line() -> str:
    return "python -m genalign.toy.generators " + " ".join(sys.argv[1:])


def _evaluations(path: Path, family: str, args: argparse.Namespace) -> dict[str, Any]:
    full = evaluate_generator(
        path,
        family,
        num_per_prompt=args.eval_per_prompt,
        seed=args.eval_seed,
        steps=args.eval_steps,
        guidance=args.eval_guidance,
    )
    subset = evaluate_generator(
        path,
        family,
        num_per_prompt=2,
        seed=args.eval_seed,
        steps=args.eval_steps,
        guidance=args.eval_guidance,
        per_category=2,
    )
    print(f"[{family}] held-out overall {full['overall']:.3f} {full['per_category']}", flush=True)
    print(f"[{family}] subset overall {subset['overall']:.4f}", flush=True)
    return {"eval": full, "eval_subset": subset}


TRAIN_EVAL = "train prompts (16 per category, 2 images each)"


def _train_evaluation(path: Path, family: str, args: argparse.Namespace, steps: int | None = None):
    """ShapesEval on train prompts: what the model renders for captions it was trained on (the
    single-object and colour categories are only in this split)."""
    result = evaluate_generator(
        path,
        family,
        split="train",
        per_category=16,
        num_per_prompt=2,
        seed=args.eval_seed,
        steps=args.eval_steps if steps is None else steps,
        guidance=args.eval_guidance,
    )
    print(f"[{family}] train prompts overall {result['overall']:.3f} {result['per_category']}", flush=True)
    return result


def _add_previous_stages(info: dict[str, Any], init: str | None) -> tuple[float, int]:
    """Add the stages ``init`` was trained in to ``info``'s seconds and ``total_train_steps``;
    returns this stage's ``(seconds, total steps over all stages)``."""
    stage_seconds, total_steps = info["train_seconds"], info["steps"]
    if init:
        previous = json.loads((Path(init) / "card.json").read_text())
        info["train_seconds"] += previous["train_seconds"]
        total_steps += previous.get("total_train_steps", previous["train_steps"])
    info["total_train_steps"] = total_steps
    return stage_seconds, total_steps


def _previous_commands(out: Path) -> list[str]:
    card = out / "card.json"
    return json.loads(card.read_text())["commands"] if card.exists() else []


def stage_commands(previous: Sequence[str], vae_command: str, command: str) -> list[str]:
    """The commands that reproduce a stage: the earlier stages', then the VAE's when it is not among
    them (a first stage, or a stage that moves to another VAE), then this stage's."""
    return [*previous, *([] if vae_command in previous else [vae_command]), command]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m genalign.toy.generators", description=__doc__.split("\n")[0]
    )
    parser.add_argument("what", choices=["vae", "toy-sd", "toy-lcm", "toy-flow", "eval", "card"])
    parser.add_argument("--out", required=True, help="output folder (eval: the model folder)")
    parser.add_argument("--vae", help="trained VAE folder (toy-sd, toy-flow)")
    parser.add_argument("--teacher", help="toy-sd folder (toy-lcm)")
    parser.add_argument(
        "--init", help="toy-sd / toy-flow: continue training from this folder of the same kind"
    )
    parser.add_argument("--family", choices=FAMILIES, help="eval: the model family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--num-images", type=int)
    parser.add_argument("--max-minutes", type=float)
    parser.add_argument(
        "--ema-decay", type=float, help="EMA of the saved weights (toy-sd, toy-flow; LCD target)"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--kl-weight",
        type=float,
        help=f"vae: weight of the KL term (default {SD_KL_WEIGHT:g}, Stable Diffusion's); larger values make the decoder "
        "robust to latent noise",
    )
    parser.add_argument(
        "--clip-text",
        help="toy-sd: an open_clip folder (toy-clip) whose text tower becomes the frozen text encoder",
    )
    parser.add_argument(
        "--v-weight-cap",
        type=float,
        help="toy-sd: draw timesteps with probability min(1/alpha_bar_t, CAP), i.e. the v-prediction loss "
        "(default: uniform timesteps, DDPM's L_simple)",
    )
    parser.add_argument(
        "--snapshot-every", type=int, help="toy-sd: save the EMA weights to OUT/snapshot every N steps"
    )
    parser.add_argument("--eval-steps", type=int)
    parser.add_argument("--eval-guidance", type=float)
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument("--eval-per-prompt", type=int, default=4)
    parser.add_argument(
        "--colour-per-prompt",
        type=int,
        help="card: also score the colour category of the train prompts with this many images per prompt",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    options = {
        k: v
        for k, v in {
            "steps": args.steps,
            "lr": args.lr,
            "num_images": args.num_images,
            "ema_decay": args.ema_decay,
        }.items()
        if v
    }
    for option, value, command in (
        ("--kl-weight", args.kl_weight, "vae"),
        ("--v-weight-cap", args.v_weight_cap, "toy-sd"),
        ("--clip-text", args.clip_text, "toy-sd"),
    ):
        if value is not None and args.what != command:
            parser.error(f"{option} is an option of the {command} command only")
    if args.what == "vae":
        if args.kl_weight is not None:
            options["kl_weight"] = args.kl_weight
        _, info = train_vae(out, seed=args.seed, **options)
        (out / "training.json").write_text(json.dumps(dict(info, command=_command_line()), indent=2) + "\n")
        print(json.dumps({k: v for k, v in info.items() if k != "loss_history"}))
        return 0
    if args.what == "card":  # add the train-prompt evaluation to a trained model's card
        card = json.loads((out / "card.json").read_text())
        eval_settings = card["eval"]["settings"]
        args.eval_steps, args.eval_guidance = eval_settings["steps"], eval_settings["guidance"]
        card.setdefault("extra_evals", {})[TRAIN_EVAL] = _train_evaluation(out, card["family"], args)
        if args.colour_per_prompt:  # the single-object colour target, on more images than above
            key = f"single-object colour, train prompts ({args.colour_per_prompt} images per prompt)"
            card["extra_evals"][key] = evaluate_generator(
                out,
                card["family"],
                split="train",
                per_category=16,
                num_per_prompt=args.colour_per_prompt,
                seed=args.eval_seed,
                steps=args.eval_steps,
                guidance=args.eval_guidance,
                categories=["colors"],
            )
        write_card(out, card)
        return 0
    if args.what == "eval":
        if args.family is None:
            parser.error("eval needs --family")
        result = evaluate_generator(
            out,
            args.family,
            num_per_prompt=args.eval_per_prompt,
            seed=args.eval_seed,
            steps=args.eval_steps,
            guidance=args.eval_guidance,
        )
        print(json.dumps(result, indent=2))
        return 0
    from diffusers import AutoencoderKL, StableDiffusionPipeline

    extra = {"batch_size": args.batch_size, "seed": args.seed, "max_minutes": args.max_minutes, **options}
    if args.what == "toy-sd":
        vae = AutoencoderKL.from_pretrained(args.vae or parser.error("toy-sd needs --vae"))
        vae_info = json.loads((Path(args.vae) / "training.json").read_text())
        if args.v_weight_cap is not None:
            extra["v_weight_cap"] = args.v_weight_cap
        if args.clip_text is not None:
            extra["clip_text"] = args.clip_text
        _, info = train_sd(vae, out, init=args.init, snapshot_every=args.snapshot_every, **extra)
        family, name = "sd", "toy-sd"
        description = (
            "A small Stable Diffusion 1.x-architecture text-to-image model of the toy world (48 px), "
            + (
                f"its UNet trained in stages on the toy world and, as in Stable Diffusion, conditioned on a frozen "
                f"pretrained CLIP text encoder: the text tower of {args.clip_text}. "
                if args.clip_text
                else "trained from scratch. "
            )
            + "It follows prompts imperfectly, by design: room for RL."
        )
        load = f'StableDiffusionPipeline.from_pretrained("assets/models/{name}")'
        commands = stage_commands(
            _previous_commands(Path(args.init)) if args.init else [], vae_info["command"], _command_line()
        )
        stage_seconds, total_steps = _add_previous_stages(info, args.init)
        data = (
            f"this stage {info['steps'] * args.batch_size:,} samples from {extra.get('num_images', 30000):,} "
            "renders (48 px, skia): train prompts only (category uniform) plus 15% random layouts captioned ''; "
            f"VAE on its own renders (reconstruction MAE {vae_info['reconstruction_mae']:.4f})."
        )
        train = (
            f"VAE {len(vae_info['loss_history']) * 100} steps (KL weight {vae_info.get('kl_weight', SD_KL_WEIGHT):g}); "
            + (
                f"text encoder: the text tower of {args.clip_text}, converted and frozen; UNet "
                if args.clip_text
                else "text encoder + UNet "
            )
            + f"{total_steps} steps over "
            f"{sum(' toy-sd ' in c for c in commands)} stage(s) (this one: {info['steps']} steps, batch {args.batch_size}, lr {args.lr}, "
            f"{stage_seconds:.0f} s), AdamW, epsilon prediction, "
            + (
                f"timesteps drawn with probability min(1/alpha_bar_t, {args.v_weight_cap:g}) (the v-prediction loss), "
                if args.v_weight_cap
                else "uniform timesteps (L_simple), "
            )
            + f"caption dropout 0.1, EMA {args.ema_decay or 0.99}; "
            f"{info['train_seconds']:.0f} s in all on CPU ({args.threads} thread(s) this stage). The UNet adds the attention-pooled prompt "
            "to its timestep embedding (`addition_embed_type: text`); a stage continued from weights without it "
            "adds it as an exact extension (`add_text_pooling`)."
        )
    elif args.what == "toy-lcm":
        teacher = StableDiffusionPipeline.from_pretrained(
            args.teacher or parser.error("toy-lcm needs --teacher"),
            safety_checker=None,
            feature_extractor=None,
        )
        _, info = train_lcm(teacher, out, **extra)
        family, name = "consistency", "toy-lcm"
        description = (
            "Latent Consistency Distillation (Luo et al. 2023, Algorithm 1) of toy-sd: 1-4 step sampling "
            "with the guidance scale as an input (w = guidance_scale - 1)."
        )
        load = f'DiffusionPipeline.from_pretrained("assets/models/{name}")'
        commands = [*_previous_commands(Path(args.teacher)), _command_line()]
        data = (
            "renders of train prompts (as toy-sd, another seed), encoded by toy-sd's VAE; teacher = toy-sd."
        )
        train = (
            f"{info['steps']} LCD steps, batch {args.batch_size}, N=50 DDIM skipping steps, w ~ U[2, 6], EMA 0.95, "
            f"L2 distance; {info['train_seconds']:.0f} s on one CPU thread."
        )
    else:
        vae = AutoencoderKL.from_pretrained(args.vae or parser.error("toy-flow needs --vae"))
        vae_info = json.loads((Path(args.vae) / "training.json").read_text())
        _, info = train_flow(vae, out, init=args.init, **extra)
        stage_seconds, total_steps = _add_previous_stages(info, args.init)
        family, name = "flow", "toy-flow"
        description = (
            "A small Stable Diffusion 3-architecture (MMDiT, two CLIP encoders, no T5) rectified-flow model "
            "of the toy world (48 px), trained from scratch; it shares toy-sd's VAE (with a latent shift)."
        )
        load = f'StableDiffusion3Pipeline.from_pretrained("assets/models/{name}", text_encoder_3=None, tokenizer_3=None)'
        commands = [
            *(_previous_commands(Path(args.init)) if args.init else [vae_info["command"]]),
            _command_line(),
        ]
        data = "renders of train prompts only plus 15% random layouts captioned '' (48 px, skia)."
        train = (
            f"{total_steps} steps over {len(commands) - 1} stage(s) (this one: {info['steps']} steps, batch "
            f"{args.batch_size}, lr {args.lr}, {stage_seconds:.0f} s), AdamW, rectified flow (velocity) loss with "
            f"logit-normal t, caption dropout 0.1, EMA {args.ema_decay or 0.99}; {info['train_seconds']:.0f} s in all "
            "on one CPU thread."
        )
    evals = _evaluations(out, family, args)
    extra_evals = {TRAIN_EVAL: _train_evaluation(out, family, args)}
    if family == "consistency":
        for k in (1, 2):
            extra_evals[f"{k} step{'s' if k > 1 else ''}"] = evaluate_generator(
                out,
                family,
                num_per_prompt=args.eval_per_prompt,
                seed=args.eval_seed,
                steps=k,
                guidance=args.eval_guidance,
            )
    card = {
        "name": name,
        "family": family,
        "description": description,
        "load": load,
        "commands": commands,
        "data": data,
        "train": train,
        "parameters": info["parameters"],
        "train_seconds": info["train_seconds"],
        "train_steps": info["steps"],
        **({"total_train_steps": info["total_train_steps"]} if "total_train_steps" in info else {}),
        "loss_history": info["loss_history"],
        **evals,
        "extra_evals": extra_evals,
    }
    write_card(out, card)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
