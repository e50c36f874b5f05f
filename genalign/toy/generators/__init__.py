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

Modules: ``build`` (tokenizer, text encoders, VAE, UNet, SD3 transformer), ``data`` (renders and
captions), ``train`` (VAE, toy-sd, toy-lcm), ``flow`` (toy-flow), ``evaluate`` (ShapesEval of a
generator), ``card`` (model cards) and ``cli``; the loop, EMA and schedule they share are
:mod:`genalign.toy.training`, and the training budget every recipe takes (steps, batch size,
learning rate, data, seed, ...: :class:`TrainBudget`) is ``budget``.

``toy-ar-video`` (issue #26), the ``ar_video`` family's toy: a ``SkyReelsV2DiffusionForcingPipeline``
of the toy video world (``genalign.toy.video``) -- ``video`` (its parts and its Wan autoencoder,
:func:`train_video_vae`), ``video_train`` (the block-causal transformer trained with diffusion
forcing, :func:`train_ar_video`), ``video_eval`` (the video verifier's accuracy of its rollouts,
:func:`evaluate_video_generator`) and ``video_cli`` (its commands and card).

Run ``python -m genalign.toy.generators {vae,toy-sd,toy-lcm,toy-flow,video-vae,toy-ar-video,eval,card} --help``; the exact
commands used for the shipped models are in ``assets/models/<name>/README.md``.
"""

from __future__ import annotations

from genalign.toy.generators.budget import TrainBudget
from genalign.toy.generators.build import (
    IMAGE_SIZE,
    TOKEN_LENGTH,
    add_text_pooling,
    build_sd3_transformer,
    build_text_encoder,
    build_unet,
    build_vae,
    clip_text_encoder,
    flow_vae,
    tokenize,
    toy_tokenizer,
    toy_words,
)
from genalign.toy.generators.card import stage_commands, write_card
from genalign.toy.generators.cli import main
from genalign.toy.generators.data import encode_latents, to_model_range, toy_dataset
from genalign.toy.generators.evaluate import DEFAULT_EVAL, FAMILIES, eval_prompts, evaluate_generator
from genalign.toy.generators.flow import (
    SD3_T5_TOKENS,
    RepeatedTokenJointAttention,
    sd3_prompt_embeddings,
    train_flow,
)
from genalign.toy.generators.train import (
    SD_BETAS,
    SD_KL_WEIGHT,
    guidance_scale_embedding,
    lcm_boundary_scalings,
    train_lcm,
    train_sd,
    train_vae,
    v_loss_timestep_weights,
)
from genalign.toy.generators.video import train_video_vae
from genalign.toy.generators.video_eval import evaluate_video_generator
from genalign.toy.generators.video_train import train_ar_video
from genalign.toy.training import folder_megabytes, parameter_count

__all__ = [
    "DEFAULT_EVAL",
    "FAMILIES",
    "IMAGE_SIZE",
    "SD3_T5_TOKENS",
    "SD_BETAS",
    "SD_KL_WEIGHT",
    "TOKEN_LENGTH",
    "RepeatedTokenJointAttention",
    "TrainBudget",
    "add_text_pooling",
    "build_sd3_transformer",
    "build_text_encoder",
    "build_unet",
    "build_vae",
    "clip_text_encoder",
    "encode_latents",
    "eval_prompts",
    "evaluate_generator",
    "evaluate_video_generator",
    "flow_vae",
    "folder_megabytes",
    "guidance_scale_embedding",
    "lcm_boundary_scalings",
    "main",
    "parameter_count",
    "sd3_prompt_embeddings",
    "stage_commands",
    "to_model_range",
    "tokenize",
    "toy_dataset",
    "toy_tokenizer",
    "toy_words",
    "train_ar_video",
    "train_flow",
    "train_lcm",
    "train_sd",
    "train_vae",
    "train_video_vae",
    "v_loss_timestep_weights",
    "write_card",
]
