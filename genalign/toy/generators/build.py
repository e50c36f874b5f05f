"""Toy generators' parts: the toy tokenizer, the text encoders, the VAE, the UNet and the SD3
transformer, all small instances of the real diffusers / transformers classes (issue #6).

:func:`clip_text_encoder` turns toy-clip's text tower into a ``CLIPTextModel``; the flow model's
latent shift is :func:`flow_vae`.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from genalign.toy.conversion import open_clip_blocks_to_transformers
from genalign.toy.prompts import all_prompts

IMAGE_SIZE = 48
TOKEN_LENGTH = 16  # the longest toy caption is 10 words + BOS + EOS


# -- tokenizer ------------------------------------------------------------------------------------


def toy_words() -> list[str]:
    """Every word of the toy grammar's captions, sorted."""
    return sorted({word for prompt in all_prompts() for word in prompt.caption.split()})


def _byte_symbols() -> list[str]:
    from genalign.tiny.tokenizers import _bytes_to_unicode

    table = _bytes_to_unicode()
    return [table[b] for b in range(256)]


def toy_tokenizer(model_max_length: int = TOKEN_LENGTH, words: Sequence[str] | None = None):
    """A real ``CLIPTokenizer`` whose BPE merges spell every toy word (or every one of ``words``)
    as one token.

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

    for word in toy_words() if words is None else sorted(words):
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


def tokenize(tokenizer, captions: Sequence[str]) -> torch.Tensor:
    """Token ids ``[N, model_max_length]`` of ``captions``, padded and truncated."""
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


def clip_text_encoder(
    clip_model: str | Path | torch.nn.Module, tokenizer, projection: bool = False
) -> torch.nn.Module:
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

    With ``projection`` it is a ``CLIPTextModelWithProjection`` whose ``text_embeds`` are
    open_clip's ``encode_text`` (the end-of-text state after ``ln_final`` times
    ``text_projection``): the pooled vector Stable Diffusion 3 conditions on (Esser et al. 2024,
    Sec. 5.1).
    """
    import open_clip
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

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
        projection_dim=clip_model.text_projection.shape[-1] if projection else width,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    encoder = (CLIPTextModelWithProjection if projection else CLIPTextModel)(config).eval()
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
    if projection:  # open_clip multiplies by a (width, embed) matrix; nn.Linear stores its transpose
        text_projection = clip_model.text_projection
        weight = text_projection.weight if isinstance(text_projection, torch.nn.Linear) else text_projection.T
        with torch.no_grad():
            encoder.text_projection.weight.copy_(weight.detach())
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
    from genalign.tiny.diffusion import two_level_unet

    return two_level_unet(
        sample_size,
        cross_attention_dim,
        block_out_channels=tuple(block_out_channels),
        norm_num_groups=16,
        attention_head_dim=2,  # diffusers' legacy name: the number of heads
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


def flow_vae(vae, latents: torch.Tensor):
    """A copy of ``vae`` whose ``shift_factor`` / ``scaling_factor`` standardise ``latents``
    (unscaled), as SD3's VAE config does: ``z = (latent - shift) * scale``."""
    copied = copy.deepcopy(vae)
    shift = float(latents.mean())
    copied.register_to_config(
        shift_factor=round(shift, 5), scaling_factor=round(float(1 / (latents - shift).std()), 5)
    )
    return copied
