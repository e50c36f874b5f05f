"""Tiny, randomly initialised diffusers pipelines of real architectures, built offline.

Every builder returns the real diffusers pipeline class (``StableDiffusionPipeline``,
``FluxPipeline`` ...) made of real components with tiny configs, so the library's code paths
(policies, step kernels, LoRA through peft, ``save_pretrained`` / ``from_pretrained``) run
unchanged on CPU in seconds. Weights are random and seeded: the same ``seed`` gives the same
weights, and the global torch RNG is left as it was.

Shared conventions:

* Text encoders are tiny ``CLIPTextModel`` / ``CLIPTextModelWithProjection`` (vocab 514,
  77 positions) matching :func:`~genalign.tiny.tokenizers.byte_level_clip_tokenizer`;
  T5 and Gemma encoders use character-level tokenizers made in memory by
  :func:`t5_tokenizer` and :func:`gemma_tokenizer`.
* Latent-space models use ``sample_size`` latents (8 by default); the VAEs downsample 4x, so
  default images are 32x32 px (Flux and Sana pick their own default resolution, see below).
* ``save_to`` writes the pipeline with ``save_pretrained``; ``DiffusionPipeline.from_pretrained``
  on that folder gives the same outputs.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import torch
from diffusers import (
    AutoencoderDC,
    AutoencoderKL,
    DDIMScheduler,
    DDPMScheduler,
    DiffusionPipeline,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    LatentConsistencyModelPipeline,
    LCMScheduler,
    PixArtAlphaPipeline,
    PixArtTransformer2DModel,
    SanaPipeline,
    SanaTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    Gemma2Config,
    Gemma2Model,
    GemmaTokenizer,
    T5Config,
    T5EncoderModel,
    T5Tokenizer,
)

from genalign.tiny.tokenizers import byte_level_clip_tokenizer

__all__ = [
    "SD_SCHEDULERS",
    "flux_pipeline",
    "gemma_tokenizer",
    "lcm_pipeline",
    "pixart_pipeline",
    "sana_pipeline",
    "sd3_pipeline",
    "sd_pipeline",
    "sdxl_pipeline",
    "t5_tokenizer",
]

PipelineT = TypeVar("PipelineT", bound=DiffusionPipeline)

CLIP_VOCAB_SIZE = 514  # byte_level_clip_tokenizer: 256 bytes, 256 end-of-word bytes, BOS, EOS
CLIP_BOS_ID = 512
CLIP_EOS_ID = 513

# Stable Diffusion 1.x/2.x noise schedule: every SD-family scheduler below is built on it.
_SD_BETAS = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear"}

SD_SCHEDULERS: dict[str, Callable[..., object]] = {
    "ddim": lambda **kw: DDIMScheduler(
        **_SD_BETAS, clip_sample=False, set_alpha_to_one=False, steps_offset=1, **kw
    ),
    "ddpm": lambda **kw: DDPMScheduler(**_SD_BETAS, clip_sample=False, steps_offset=1, **kw),
    "euler": lambda **kw: EulerDiscreteScheduler(**_SD_BETAS, steps_offset=1, **kw),
    "dpm": lambda **kw: DPMSolverMultistepScheduler(**_SD_BETAS, steps_offset=1, **kw),
}
"""Schedulers :func:`sd_pipeline` accepts by name, all on SD's scaled-linear beta schedule."""

_PRINTABLE = [c for c in string.printable if not c.isspace()]  # 94 visible ASCII characters


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch for weight initialisation without disturbing the caller's global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _finish(pipe: PipelineT, save_to: str | Path | None) -> PipelineT:
    """Put every module in eval mode (as ``from_pretrained`` does), silence the progress bar
    (not saved) and optionally save."""
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    pipe.set_progress_bar_config(disable=True)
    if save_to is not None:
        pipe.save_pretrained(str(save_to))
    return pipe


# --------------------------------------------------------------------------------------------
# Offline tokenizers for the T5 and Gemma text encoders
# --------------------------------------------------------------------------------------------


def t5_tokenizer(model_max_length: int = 512) -> T5Tokenizer:
    """A character-level ``T5Tokenizer`` (Unigram, 98 ids) built in memory.

    Ids: 0 ``<pad>``, 1 ``</s>``, 2 ``<unk>``, 3 the word-start symbol ``▁``, then the 94
    visible ASCII characters. Like T5 it appends ``</s>``; other characters map to ``<unk>``.
    No sentinel ``<extra_id_*>`` tokens: the tiny models only use T5 as an encoder.
    """
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [(char, -3.0) for char in _PRINTABLE]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=model_max_length)


def gemma_tokenizer(model_max_length: int = 8192) -> GemmaTokenizer:
    """A character-level ``GemmaTokenizer`` (BPE without merges, byte fallback; 356 ids).

    Ids: 0 ``<pad>``, 1 ``<eos>``, 2 ``<bos>`` (prepended, as Gemma does), 3 ``<unk>``,
    4 ``<mask>``, 5..260 the byte tokens ``<0x00>``..``<0xFF>`` that any non-ASCII character
    falls back to, 261 ``▁`` (space), then the 94 visible ASCII characters.
    """
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for piece in ["▁", *_PRINTABLE]:
        vocab[piece] = len(vocab)
    return GemmaTokenizer(vocab=vocab, merges=[], add_bos_token=True, model_max_length=model_max_length)


# --------------------------------------------------------------------------------------------
# Shared components
# --------------------------------------------------------------------------------------------


def _clip_text_config(hidden_size: int = 32, num_layers: int = 2, projection_dim: int = 32) -> CLIPTextConfig:
    """A tiny CLIP text tower over the byte-level vocabulary (4 heads, MLP 2x)."""
    return CLIPTextConfig(
        vocab_size=CLIP_VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=projection_dim,
        hidden_act="quick_gelu",
        bos_token_id=CLIP_BOS_ID,
        eos_token_id=CLIP_EOS_ID,  # pooling reads the hidden state at the first EOS
        pad_token_id=CLIP_EOS_ID,
    )


def _t5_encoder(vocab_size: int, d_model: int) -> T5EncoderModel:
    """A tiny T5 v1.1 encoder (gated-GELU feed-forward, as SD3's and FLUX's T5-XXL)."""
    config = T5Config(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=8,
        d_ff=2 * d_model,
        num_layers=2,
        num_heads=d_model // 8,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return T5EncoderModel(config)


def _kl_vae(flow: bool = False) -> AutoencoderKL:
    """A tiny ``AutoencoderKL`` that downsamples 4x (three blocks of 4/8/8 channels, 4 latents).

    ``flow=True`` gives the SD3/FLUX variant: no quant convs, a latent shift and scale.
    """
    extra = {"use_quant_conv": False, "use_post_quant_conv": False, "shift_factor": 0.0609} if flow else {}
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(4, 8, 8),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=2,
        sample_size=32,
        scaling_factor=1.5305 if flow else 0.18215,
        **extra,
    )


def two_level_unet(
    sample_size: int,
    cross_attention_dim: int,
    block_out_channels: tuple[int, int] = (8, 16),
    norm_num_groups: int = 4,
    attention_head_dim: int = 4,
    **extra: object,
) -> UNet2DConditionModel:
    """A two-level conditional SD-layout UNet (4 latent channels, one layer per block, cross-
    attention at the lower level): by default the tiny one (8/16 channels); the toy generators'
    (:func:`genalign.toy.generators.build.build_unet`) is a wider one."""
    return UNet2DConditionModel(
        sample_size=sample_size,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        block_out_channels=block_out_channels,
        layers_per_block=1,
        norm_num_groups=norm_num_groups,
        attention_head_dim=attention_head_dim,
        cross_attention_dim=cross_attention_dim,
        **extra,
    )


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------


def sd_layout_pipeline(
    pipeline_class: type[PipelineT],
    vae: torch.nn.Module,
    text_encoder: torch.nn.Module,
    tokenizer: object,
    unet: torch.nn.Module,
    scheduler: object,
) -> PipelineT:
    """``pipeline_class`` (``StableDiffusionPipeline``, ``LatentConsistencyModelPipeline``) of the
    SD 1.x layout from these components, without safety checker or feature extractor: the tiny
    pipelines' and the toy generators' (:mod:`genalign.toy.generators.train`) layout."""
    return pipeline_class(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def _sd_layout_pipeline(
    pipeline_class: type[PipelineT], unet: Callable[[], UNet2DConditionModel], scheduler: object
) -> PipelineT:
    """An SD 1.x-layout pipeline (KL VAE, one CLIP text encoder, byte-level tokenizer, no safety
    checker) around ``unet()``, which is called after the VAE and the text encoder are built, so
    the seeded weights are drawn in one fixed order."""
    vae = _kl_vae()
    text_encoder = CLIPTextModel(_clip_text_config())
    tokenizer = byte_level_clip_tokenizer()
    return sd_layout_pipeline(pipeline_class, vae, text_encoder, tokenizer, unet(), scheduler)


def sd_pipeline(
    seed: int = 0,
    save_to: str | Path | None = None,
    scheduler: str = "ddim",
    prediction_type: str = "epsilon",
    sample_size: int = 8,
) -> StableDiffusionPipeline:
    """A tiny Stable Diffusion 1.x/2.x pipeline (UNet + KL VAE + CLIP text encoder).

    Args:
        seed: weight-initialisation seed.
        save_to: folder to ``save_pretrained`` into (reloads with ``from_pretrained``).
        scheduler: a key of :data:`SD_SCHEDULERS` (``"ddim"``, ``"ddpm"``, ``"euler"``, ``"dpm"``).
        prediction_type: ``"epsilon"`` (SD1.x), ``"v_prediction"`` (SD2.x 768) or ``"sample"``.
        sample_size: latent side; images are ``4 * sample_size`` px (32 by default).

    Sizes: 120k parameters (UNet 67k, VAE 17k, text encoder 36k), 0.5 MB saved; no safety
    checker.
    """
    if scheduler not in SD_SCHEDULERS:
        raise ValueError(f"scheduler={scheduler!r}: expected one of {sorted(SD_SCHEDULERS)}")
    with _seeded(seed):
        pipe = _sd_layout_pipeline(
            StableDiffusionPipeline,
            lambda: two_level_unet(sample_size, cross_attention_dim=32),
            SD_SCHEDULERS[scheduler](prediction_type=prediction_type),
        )
    return _finish(pipe, save_to)


def sdxl_pipeline(
    seed: int = 0, save_to: str | Path | None = None, sample_size: int = 8
) -> StableDiffusionXLPipeline:
    """A tiny SDXL pipeline: two CLIP text encoders and ``text_time`` added conditioning.

    As in SDXL, the UNet cross-attends to the two encoders' penultimate hidden states
    concatenated (32 + 32 = 64 features) and receives the second encoder's pooled projection
    (32) plus six Fourier-embedded size/crop numbers (6 x 8) as added conditioning (80 inputs).
    Images are ``4 * sample_size`` px (32 by default). 164k parameters, 0.7 MB saved.
    """
    with _seeded(seed):
        unet = two_level_unet(
            sample_size,
            cross_attention_dim=64,
            addition_embed_type="text_time",
            addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=6 * 8 + 32,
            use_linear_projection=True,
        )
        pipe = StableDiffusionXLPipeline(
            vae=_kl_vae(),
            text_encoder=CLIPTextModel(_clip_text_config()),
            text_encoder_2=CLIPTextModelWithProjection(_clip_text_config(projection_dim=32)),
            tokenizer=byte_level_clip_tokenizer(),
            tokenizer_2=byte_level_clip_tokenizer(),
            unet=unet,
            scheduler=SD_SCHEDULERS["euler"](prediction_type="epsilon"),
        )
    return _finish(pipe, save_to)


def sd3_pipeline(
    seed: int = 0, save_to: str | Path | None = None, with_t5: bool = False, sample_size: int = 8
) -> StableDiffusion3Pipeline:
    """A tiny Stable Diffusion 3 pipeline (MMDiT, rectified flow).

    The transformer (2 joint blocks, 4 heads x 8, patch 2) reads the two CLIP encoders'
    penultimate states concatenated (32 + 32) beside the T5 states (64 features), and their
    pooled projections concatenated (16 + 16). Without T5 (``with_t5=False``, the default) the
    pipeline feeds zeros in its place, as SD3 does when ``text_encoder_3`` is dropped.
    Images are ``4 * sample_size`` px (32 by default). 168k parameters (257k with T5), 0.9 MB
    saved (1.2 MB with T5).

    A folder saved without T5 reloads as real T5-less SD3 checkpoints do, naming the missing
    parts: ``DiffusionPipeline.from_pretrained(folder, text_encoder_3=None, tokenizer_3=None)``
    (diffusers does not treat them as optional components).
    """
    with _seeded(seed):
        transformer = SD3Transformer2DModel(
            sample_size=sample_size,
            patch_size=2,
            in_channels=4,
            out_channels=4,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=4,
            joint_attention_dim=64,
            caption_projection_dim=32,
            pooled_projection_dim=32,
            pos_embed_max_size=32,
        )
        text_encoder = CLIPTextModelWithProjection(_clip_text_config(projection_dim=16))
        text_encoder_2 = CLIPTextModelWithProjection(_clip_text_config(projection_dim=16))
        text_encoder_3 = tokenizer_3 = None
        if with_t5:
            tokenizer_3 = t5_tokenizer(model_max_length=256)
            text_encoder_3 = _t5_encoder(len(tokenizer_3), d_model=64)
        pipe = StableDiffusion3Pipeline(
            transformer=transformer,
            scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
            vae=_kl_vae(flow=True),
            text_encoder=text_encoder,
            tokenizer=byte_level_clip_tokenizer(),
            text_encoder_2=text_encoder_2,
            tokenizer_2=byte_level_clip_tokenizer(),
            text_encoder_3=text_encoder_3,
            tokenizer_3=tokenizer_3,
        )
    return _finish(pipe, save_to)


def flux_pipeline(seed: int = 0, save_to: str | Path | None = None, schnell: bool = False) -> FluxPipeline:
    """A tiny FLUX.1-dev-style pipeline (double- and single-stream blocks, guidance embedding).

    Latents have 4 channels, packed 2x2 into 16-channel tokens; the transformer (1 double and
    1 single block, 2 heads x 16, RoPE axes 4/4/8) reads T5 states (32 features) and the CLIP
    pooled output (32). The scheduler shifts with image size as FLUX.1-dev's does.
    ``schnell=True`` gives the FLUX.1-schnell layout instead: no guidance embedding (the
    timestep-distilled model takes no guidance) and a fixed, unshifted flow schedule (shift 1).

    ``FluxPipeline`` hard-codes its default resolution to ``128 * vae_scale_factor`` = 512 px;
    pass ``height=width=32`` (any multiple of 8) for small images. 155k parameters, 0.7 MB saved.
    """
    with _seeded(seed):
        transformer = FluxTransformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            guidance_embeds=not schnell,
            axes_dims_rope=(4, 4, 8),
        )
        tokenizer_2 = t5_tokenizer(model_max_length=512)
        scheduler = (
            FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False)
            if schnell
            else FlowMatchEulerDiscreteScheduler(
                shift=3.0,
                use_dynamic_shifting=True,
                base_shift=0.5,
                max_shift=1.15,
                base_image_seq_len=256,
                max_image_seq_len=4096,
            )
        )
        pipe = FluxPipeline(
            transformer=transformer,
            scheduler=scheduler,
            vae=_kl_vae(flow=True),
            text_encoder=CLIPTextModel(_clip_text_config()),
            tokenizer=byte_level_clip_tokenizer(),
            text_encoder_2=_t5_encoder(len(tokenizer_2), d_model=32),
            tokenizer_2=tokenizer_2,
        )
    return _finish(pipe, save_to)


def sana_pipeline(seed: int = 0, save_to: str | Path | None = None) -> SanaPipeline:
    """A tiny SANA pipeline: linear-attention DiT, deep-compression autoencoder, Gemma-2 encoder.

    The DC-AE (two ResBlock stages, one EfficientViT stage) downsamples 4x into 4 latent
    channels; the transformer (2 blocks, 2 heads x 8) cross-attends to a 2-layer Gemma-2
    encoder (16 features) reading :func:`gemma_tokenizer` ids. ``sample_size`` is 16, the
    smallest that ``SanaPipeline``'s resolution binning accepts (its 512 px bin set), so a
    plain call renders at 512 px and resizes to the requested size (``SanaPipeline`` defaults
    to 1024 px); pass ``height=width=32, use_resolution_binning=False`` for small images, and
    ``complex_human_instruction=None`` to skip SANA's long instruction prefix.
    The scheduler is ``FlowMatchEulerDiscreteScheduler`` (SANA ships DPM-Solver in flow mode;
    the Euler flow scheduler is the one flow step kernels score). 38k parameters, 0.2 MB saved.
    """
    with _seeded(seed):
        transformer = SanaTransformer2DModel(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=8,
            num_layers=2,
            num_cross_attention_heads=2,
            cross_attention_head_dim=8,
            cross_attention_dim=16,
            caption_channels=16,
            sample_size=16,
            patch_size=1,
        )
        vae = AutoencoderDC(
            in_channels=3,
            latent_channels=4,
            attention_head_dim=4,
            encoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
            decoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
            encoder_block_out_channels=(4, 8, 8),
            decoder_block_out_channels=(4, 8, 8),
            encoder_qkv_multiscales=((), (), (5,)),
            decoder_qkv_multiscales=((), (), (5,)),
            encoder_layers_per_block=(1, 1, 1),
            decoder_layers_per_block=(1, 1, 1),
            downsample_block_type="conv",
            upsample_block_type="interpolate",
            decoder_norm_types="rms_norm",
            decoder_act_fns="silu",
            scaling_factor=0.41407,
        )
        tokenizer = gemma_tokenizer()
        text_encoder = Gemma2Model(
            Gemma2Config(
                vocab_size=len(tokenizer),
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=8,
                max_position_embeddings=8192,
                sliding_window=64,
                pad_token_id=0,
                eos_token_id=1,
                bos_token_id=2,
            )
        )
        pipe = SanaPipeline(
            tokenizer=tokenizer,
            text_encoder=text_encoder,
            vae=vae,
            transformer=transformer,
            scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        )
    return _finish(pipe, save_to)


def lcm_pipeline(
    seed: int = 0, save_to: str | Path | None = None, sample_size: int = 8
) -> LatentConsistencyModelPipeline:
    """A tiny latent consistency model pipeline (LCM-distilled SD 1.x layout).

    The UNet takes the guidance scale as an embedding (``time_cond_proj_dim=32``) instead of
    running classifier-free guidance, and ``LCMScheduler`` performs consistency steps.
    Images are ``4 * sample_size`` px (32 by default). 120k parameters, 0.5 MB saved.
    """
    with _seeded(seed):
        pipe = _sd_layout_pipeline(
            LatentConsistencyModelPipeline,
            lambda: two_level_unet(sample_size, cross_attention_dim=32, time_cond_proj_dim=32),
            LCMScheduler(**_SD_BETAS, clip_sample=False, set_alpha_to_one=False),
        )
    return _finish(pipe, save_to)


def pixart_pipeline(
    seed: int = 0, save_to: str | Path | None = None, sample_size: int = 8
) -> PixArtAlphaPipeline:
    """A tiny PixArt-alpha pipeline in the one-step DMD layout (PixArt-Alpha-DMD-XL-2-512x512).

    The DiT (2 blocks, 2 heads x 8, patch 2, adaLN-single, learned sigma: 8 output channels for
    4 latents) cross-attends to a tiny T5 v1.1 encoder (32 features) reading
    :func:`t5_tokenizer` ids. The scheduler is ``DDPMScheduler`` on PixArt's linear beta
    schedule, as the DMD checkpoint ships it: the distilled model runs one step at
    ``timesteps=[400]`` and its image is the step's ``pred_original_sample``
    (``PixArtAlphaPipeline`` does this whenever ``num_inference_steps == 1``). Images are
    ``4 * sample_size`` px (32 by default); ``sample_size`` is not one of PixArt's
    resolution-binning sizes, so call the pipeline with ``use_resolution_binning=False`` (and
    ``clean_caption=False``, which needs no BeautifulSoup). 57k parameters (transformer 16k,
    T5 24k, VAE 17k), 0.3 MB saved.
    """
    with _seeded(seed):
        transformer = PixArtTransformer2DModel(
            num_attention_heads=2,
            attention_head_dim=8,
            in_channels=4,
            out_channels=8,
            num_layers=2,
            cross_attention_dim=16,
            sample_size=sample_size,
            patch_size=2,
            norm_num_groups=2,
            caption_channels=32,
        )
        tokenizer = t5_tokenizer(model_max_length=120)
        pipe = PixArtAlphaPipeline(
            tokenizer=tokenizer,
            text_encoder=_t5_encoder(len(tokenizer), d_model=32),
            vae=_kl_vae(),
            transformer=transformer,
            scheduler=DDPMScheduler(
                beta_start=0.0001, beta_end=0.02, beta_schedule="linear", clip_sample=False
            ),
        )
    return _finish(pipe, save_to)
