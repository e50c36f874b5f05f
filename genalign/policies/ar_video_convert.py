"""Turn a Self-Forcing / Causal Forcing / LongLive checkpoint into an ``ar_video`` model folder.

The official code of these distilled autoregressive Wan2.1 generators (and Astrolabe's trainer)
keeps the causal DiT in its own ``WanDiffusionWrapper(is_causal=True)``: the generator's weights
are Wan2.1's original layout (``blocks.N.self_attn.q``, ``ffn.0``, ``head.head``, ...) under a
``model.`` prefix, stored in a ``.pt`` beside the training state (Self-Forcing's
``self_forcing_dmd.pt``: ``generator_ema`` and ``generator``). The ``ar_video`` family loads a
diffusers ``SkyReelsV2DiffusionForcingPipeline`` folder instead. :func:`convert_causal_wan`

1. picks the generator's state dict (``generator_ema`` first: Self-Forcing's EMA weights are the
   ones its inference uses) and strips the wrapper's ``model.`` prefix;
2. renames it with diffusers' own Wan converter
   (``diffusers.loaders.single_file_utils.convert_wan_transformer_to_diffusers``, the mapping
   ``from_single_file`` uses for Wan);
3. builds a ``SkyReelsV2Transformer3DModel`` from the base Wan2.1 folder's transformer config with
   ``num_frame_per_block`` set (3 for Self-Forcing, chunkwise Causal Forcing and LongLive; 1 for
   framewise Causal Forcing, whose frame-causal mask :mod:`genalign.policies.video_kv_cache`
   applies, as diffusers builds none for blocks of 1), loads
   the weights strictly (a missing or unexpected key is an error naming it);
4. takes the VAE, text encoder, tokenizer and scheduler of the base folder
   (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers`` by default) and saves the pipeline to ``out``.

Not converted: LongLive's LoRA initialisation (``lora.pt``; merge it first). Framewise Causal
Forcing converts with ``num_frame_per_block=1`` on the assumption that its checkpoint has the
chunkwise one's layout (no released weights to check against offline). The command is
``genalign convert-ar-video CHECKPOINT --out DIR``; docs/astrolabe.md says what maps.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from pathlib import Path

import torch

__all__ = ["WAN_T2V_1_3B", "causal_wan_state_dict", "convert_causal_wan"]

WAN_T2V_1_3B = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
# Where the official trainers keep the generator's weights, in the order they are tried.
GENERATOR_KEYS = ("generator_ema", "generator", "model", "state_dict")
WRAPPER_PREFIXES = ("model.", "module.", "_orig_mod.", "diffusion_model.")


def _is_state_dict(value: object) -> bool:
    return isinstance(value, Mapping) and bool(value) and all(torch.is_tensor(v) for v in value.values())


def causal_wan_state_dict(
    checkpoint: Mapping[str, object], key: str | None = None
) -> dict[str, torch.Tensor]:
    """The generator's weights in diffusers' Wan layout, from a loaded official checkpoint.

    ``key`` names the entry holding them (None: the first of ``generator_ema``, ``generator``,
    ``model``, ``state_dict`` that is a state dict, or the checkpoint itself when it is one). The
    wrapper prefixes (``model.``, ``module.``, ``_orig_mod.``, ``diffusion_model.``) are stripped
    where every key has them.
    """
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    if key is not None:
        if key not in checkpoint:
            raise KeyError(f"the checkpoint has no entry {key!r}; its entries: {sorted(checkpoint)[:10]}")
        state = checkpoint[key]
    elif _is_state_dict(checkpoint):
        state = checkpoint
    else:
        state = next((checkpoint[k] for k in GENERATOR_KEYS if _is_state_dict(checkpoint.get(k))), None)
        if state is None:
            raise ValueError(
                f"no generator weights in the checkpoint: none of {', '.join(GENERATOR_KEYS)} is a state dict "
                f"(its entries: {sorted(checkpoint)[:10]}); pass the entry's name"
            )
    if not _is_state_dict(state):
        raise ValueError(f"checkpoint entry {key!r} is not a state dict of tensors")
    state = dict(state)
    stripped = True
    while stripped:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if all(name.startswith(prefix) for name in state):
                state = {name[len(prefix) :]: value for name, value in state.items()}
                stripped = True
    return convert_wan_transformer_to_diffusers(state)


def _load_checkpoint(path: Path) -> Mapping[str, object]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def convert_causal_wan(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    base: str | os.PathLike = WAN_T2V_1_3B,
    num_frame_per_block: int = 3,
    key: str | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write an ``ar_video`` folder (``SkyReelsV2DiffusionForcingPipeline``) to ``out``: the causal
    DiT of ``checkpoint`` with the other components of the diffusers Wan2.1 folder ``base``
    (module docstring). ``dtype``: cast the transformer (None: as stored). Returns ``out``."""
    from diffusers import SkyReelsV2DiffusionForcingPipeline, SkyReelsV2Transformer3DModel

    if num_frame_per_block < 1:
        raise ValueError(
            f"num_frame_per_block {num_frame_per_block}: a block holds at least one latent frame"
        )
    state = causal_wan_state_dict(_load_checkpoint(Path(checkpoint)), key)
    config = dict(SkyReelsV2Transformer3DModel.load_config(base, subfolder="transformer"))
    accepted = set(inspect.signature(SkyReelsV2Transformer3DModel.__init__).parameters) - {"self"}
    config = {k: v for k, v in config.items() if k in accepted}
    config["num_frame_per_block"] = num_frame_per_block
    transformer = SkyReelsV2Transformer3DModel.from_config(config)
    missing, unexpected = transformer.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{checkpoint}: the weights do not fit {base}'s transformer: "
            f"missing {sorted(missing)[:3]} ({len(missing)}), unexpected {sorted(unexpected)[:3]} ({len(unexpected)})"
        )
    if dtype is not None:
        transformer = transformer.to(dtype)
    pipe = SkyReelsV2DiffusionForcingPipeline.from_pretrained(base, transformer=transformer)
    out = Path(out)
    pipe.save_pretrained(out)
    return out
