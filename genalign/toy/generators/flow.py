"""toy-flow's recipe: an SD3-architecture pipeline trained with the rectified-flow loss and SD3's
logit-normal timestep density (Esser et al. 2024, eqs. 1-3 and Sec. 3.1)."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from genalign.toy.generators.budget import TrainBudget, recipe_budget
from genalign.toy.generators.build import (
    build_sd3_transformer,
    build_text_encoder,
    clip_text_encoder,
    flow_vae,
    toy_tokenizer,
)
from genalign.toy.generators.data import captioned_latents, encode_latents, toy_dataset
from genalign.toy.generators.train import train_and_save
from genalign.toy.training import AveragedTraining, TrainingLog

SD3_T5_TOKENS = 256  # StableDiffusion3Pipeline.encode_prompt's default max_sequence_length
# train_flow's default budget (the fields: TrainBudget)
FLOW_BUDGET = TrainBudget(
    steps=6000, batch_size=64, lr=5e-4, num_examples=30000, log_every=200, ema_decay=0.99
)


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


def train_flow(
    vae,
    out: str | Path | None = None,
    *,
    budget: TrainBudget = FLOW_BUDGET,
    caption_dropout: float = 0.1,
    num_layers: int = 3,
    text_hidden: int = 64,
    init: str | Path | None = None,
    clip_text: str | Path | None = None,
    caption_noise: float = 0.0,
    **budget_keywords: Any,
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

    With ``clip_text`` (an open_clip folder, toy-clip) both CLIP encoders are that CLIP's text
    tower with its projection (:func:`clip_text_encoder`), frozen, as SD3's pretrained CLIPs are,
    and only the transformer trains (a new one sized to them, or ``init``'s, whose encoders they
    replace). ``caption_noise``: :func:`toy_dataset`.

    The budget (default :data:`FLOW_BUDGET`) and its keywords ``steps``, ``batch_size``, ``lr``,
    ``num_images``, ``seed``, ``log_every``, ``max_minutes``, ``ema_decay`` and ``snapshot_every``
    are :class:`~genalign.toy.generators.budget.TrainBudget`'s.
    """
    budget = recipe_budget("train_flow", budget, budget_keywords)
    torch.manual_seed(budget.seed)
    tokenizer = toy_tokenizer()
    images, captions = toy_dataset(budget.num_examples, seed=budget.seed + 3000, caption_noise=caption_noise)
    vae, encoders, transformer, raw = _flow_modules(
        vae, images, tokenizer, init, num_layers, text_hidden, clip_text
    )
    joint = transformer.config.joint_attention_dim
    data = captioned_latents((raw - vae.config.shift_factor) * vae.config.scaling_factor, tokenizer, captions)
    modules = [*encoders, transformer]
    # the averaged copies are taken before the training-only attention processor below
    training = AveragedTraining.of(modules, budget.lr, budget.steps, budget.ema_decay, max_warmup=200)
    generator = torch.Generator().manual_seed(budget.seed)
    log = TrainingLog(budget.log_every, budget.steps, "toy-flow")
    start = time.time()
    for module in modules:
        module.train(clip_text is None or module is transformer)
    # one zero token standing for the pipeline's 256 (exact; see RepeatedTokenJointAttention)
    transformer.set_attn_processor(RepeatedTokenJointAttention(SD3_T5_TOKENS))

    def loss_fn(step: int) -> torch.Tensor:
        z0, tokens = data.draw(budget.batch_size, caption_dropout, generator)
        t = torch.sigmoid(torch.randn(budget.batch_size, generator=generator))  # logit-normal t
        noise = torch.randn(z0.shape, generator=generator)
        zt = (1 - t.view(-1, 1, 1, 1)) * z0 + t.view(-1, 1, 1, 1) * noise
        with torch.set_grad_enabled(clip_text is None):
            embeds, pooled = sd3_prompt_embeddings(encoders, tokens, joint, t5_tokens=1)
        velocity = transformer(
            hidden_states=zt, timestep=1000 * t, encoder_hidden_states=embeds, pooled_projections=pooled
        ).sample
        return F.mse_loss(velocity, noise - z0)  # conditional flow matching

    def pipeline(*averaged) -> tuple[Any, dict[str, Any]]:
        return _flow_pipeline(vae, tokenizer, *averaged)

    return train_and_save(
        training, loss_fn, log, start, pipeline, out, budget.max_minutes, budget.snapshot_every
    )


def _flow_pipeline(vae, tokenizer, encoder_1, encoder_2, transformer) -> tuple[Any, dict[str, Any]]:
    """The SD3 pipeline of toy-flow's modules (no T5; Euler flow matching, shift 1) and its
    parameter groups for the card."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

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
    return pipe, {"transformer": transformer, "text_encoders": [encoder_1, encoder_2], "vae": vae}


def _flow_modules(
    vae, images: torch.Tensor, tokenizer, init, num_layers: int, text_hidden: int, clip_text=None
):
    """toy-flow's ``(vae, [two CLIP encoders], transformer, unscaled latents of images)``: new (the
    VAE re-saved with a latent shift, :func:`flow_vae`), or ``init``'s; with ``clip_text`` the
    encoders are two frozen copies of that CLIP's text tower."""
    from diffusers import StableDiffusion3Pipeline

    frozen = None
    if clip_text is not None:
        frozen = [clip_text_encoder(clip_text, tokenizer, projection=True).requires_grad_(False)]
        frozen.append(copy.deepcopy(frozen[0]))
    if init is not None:
        start_from = StableDiffusion3Pipeline.from_pretrained(
            str(init), text_encoder_3=None, tokenizer_3=None
        )
        encoders = frozen or [start_from.text_encoder, start_from.text_encoder_2]
        transformer = start_from.transformer
        if transformer.config.joint_attention_dim != 2 * encoders[0].config.hidden_size:
            raise ValueError(
                f"{init}'s transformer attends to {transformer.config.joint_attention_dim}-d text states but the "
                f"two text encoders give {2 * encoders[0].config.hidden_size}"
            )
        return start_from.vae, encoders, transformer, encode_latents(start_from.vae, images)
    raw = encode_latents(vae, images)
    if frozen is not None:
        text_hidden, projection = frozen[0].config.hidden_size, frozen[0].config.projection_dim
        encoders = frozen
    else:
        projection = 32
        encoders = [
            build_text_encoder(tokenizer, text_hidden, 2, projection_dim=projection) for _ in range(2)
        ]
    transformer = build_sd3_transformer(
        raw.shape[-1], num_layers, joint_attention_dim=2 * text_hidden, pooled_projection_dim=2 * projection
    )
    return flow_vae(vae, raw), encoders, transformer, raw
