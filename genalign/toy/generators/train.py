"""Training recipes of the toy generators: the VAE, toy-sd and toy-lcm (issue #6).

- :func:`train_vae`: the KL autoencoder on renders (Rombach et al. 2022, Sec. 3.1).
- :func:`train_sd`: text encoder and UNet with DDPM's L_simple (Ho et al. 2020, eq. 14) and caption
  dropout for classifier-free guidance (Ho & Salimans 2022, Sec. 3.2).
- :func:`train_lcm`: Latent Consistency Distillation of toy-sd (Luo et al. 2023, Algorithm 1).

toy-flow's rectified-flow recipe is :mod:`genalign.toy.generators.flow`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from genalign.toy.generators.budget import TrainBudget, recipe_budget
from genalign.toy.generators.build import (
    add_text_pooling,
    build_text_encoder,
    build_unet,
    build_vae,
    clip_text_encoder,
    tokenize,
    toy_tokenizer,
)
from genalign.toy.generators.data import (
    captioned_latents,
    encode_latents,
    random_crop,
    to_model_range,
    toy_dataset,
)
from genalign.toy.training import (
    AveragedTraining,
    TrainingLog,
    optimise_module,
    parameter_count,
    snapshots,
)

SD_BETAS = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear"}
# the KL weight of the Stable Diffusion autoencoder objective (Rombach et al. 2022); VAE folders
# written before the recipe recorded its KL weight were trained with it
SD_KL_WEIGHT = 1e-6

# each recipe's default budget (its ``budget`` keyword's default; the fields: TrainBudget)
VAE_BUDGET = TrainBudget(steps=600, batch_size=16, lr=2e-3, num_examples=4000)
SD_BUDGET = TrainBudget(steps=6000, batch_size=64, lr=5e-4, num_examples=30000, log_every=200, ema_decay=0.99)
LCM_BUDGET = TrainBudget(steps=2000, batch_size=64, lr=2e-4, num_examples=20000, ema_decay=0.95)


# -- VAE --------------------------------------------------------------------------------------------


def train_vae(
    out: str | Path | None = None,
    *,
    budget: TrainBudget = VAE_BUDGET,
    kl_weight: float = SD_KL_WEIGHT,
    crop: int = 24,
    block_out_channels: Sequence[int] = (16, 32, 32),
    **budget_keywords: Any,
) -> tuple[Any, dict[str, Any]]:
    """Train the KL autoencoder on renders (reconstruction L1 + L2 and a small KL term, the
    Stable Diffusion autoencoder objective of Rombach et al. 2022, Sec. 3.1, without the
    perceptual and adversarial terms, which flat shapes on white do not need). Each step trains
    on random ``crop`` x ``crop`` windows (at multiples of 4 px, the latent grid) of the renders:
    the autoencoder is convolutional, and crops cost a quarter of a 48 px image.

    The latent ``scaling_factor`` is then set to one over the standard deviation of the training
    latents (Rombach et al. 2022, Appendix G), so scaled latents have unit variance. Returns
    ``(vae, info)``; ``info`` has the loss history and reconstruction error.

    The budget (default :data:`VAE_BUDGET`) and its keywords ``steps``, ``batch_size``, ``lr``,
    ``num_images``, ``seed`` and ``log_every`` are :class:`~genalign.toy.generators.budget.TrainBudget`'s.
    """
    budget = recipe_budget(
        "train_vae", budget, budget_keywords, unused=("max_minutes", "ema_decay", "snapshot_every")
    )
    torch.manual_seed(budget.seed)
    images, _ = toy_dataset(budget.num_examples, seed=budget.seed, unconditional_fraction=0.3)
    vae = build_vae(block_out_channels)
    generator = torch.Generator().manual_seed(budget.seed)
    log = TrainingLog(budget.log_every, budget.steps, "vae")

    def loss_fn(step: int) -> torch.Tensor:
        index = torch.randint(len(images), (budget.batch_size,), generator=generator)
        x = random_crop(to_model_range(images[index]), crop, 4, generator)
        posterior = vae.encode(x).latent_dist
        reconstruction = vae.decode(posterior.sample(generator)).sample
        # L1 + L2 reconstruction + KL to N(0, I)
        return (
            F.l1_loss(reconstruction, x) + F.mse_loss(reconstruction, x) + kl_weight * posterior.kl().mean()
        )

    optimise_module(vae, loss_fn, budget.lr, budget.steps, log, max_warmup=100)
    latents = encode_latents(vae, images[:2000])
    vae.register_to_config(scaling_factor=round(float(1.0 / latents.std()), 5))
    with torch.no_grad():
        held = to_model_range(toy_dataset(64, seed=budget.seed + 1)[0])
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


def finish_training(
    pipe, parameters: dict[str, Any], done: int, log: TrainingLog, start: float, out
) -> tuple[Any, dict[str, Any]]:
    """Describe a finished training run of ``pipe`` (steps, losses, seconds, parameter counts of
    the named modules or lists of modules) and save the pipeline if ``out`` is given."""
    pipe.set_progress_bar_config(disable=True)
    info = {
        "steps": done,
        "loss_history": log.history,
        "train_seconds": round(time.time() - start, 1),
        "parameters": {name: parameter_count(modules) for name, modules in parameters.items()},
    }
    if out is not None:
        pipe.save_pretrained(str(out))
    return pipe, info


def sd_layout_parameters(pipe) -> dict[str, Any]:
    """The parameter groups of an SD-layout pipeline (toy-sd, toy-lcm; assembled by
    :func:`~genalign.tiny.diffusion.sd_layout_pipeline`) for :func:`finish_training`."""
    return {"unet": pipe.unet, "text_encoder": pipe.text_encoder, "vae": pipe.vae}


def train_and_save(
    training: AveragedTraining,
    loss_fn: Callable[[int], torch.Tensor],
    log: TrainingLog,
    start: float,
    pipeline: Callable[..., tuple[Any, dict[str, Any]]],
    out: str | Path | None,
    max_minutes: float | None = None,
    snapshot_every: int | None = None,
    after_step: Callable[[int], None] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """What the generators' recipes do once their data and modules are ready: run ``training`` for
    ``log.total`` steps, then save the averages as a pipeline and describe the run
    (:func:`finish_training`, seconds counted from ``start``). ``pipeline(*averaged modules)`` gives
    ``(pipe, parameter groups)``; with ``out`` and ``snapshot_every`` the averages are also saved to
    ``out/snapshot`` every that many steps (:func:`snapshots`), after ``after_step(steps done)``.
    Returns ``(pipe, info)``."""

    def save(folder, done: int) -> tuple[Any, dict[str, Any]]:
        pipe, parameters = pipeline(*training.averages())
        return finish_training(pipe, parameters, done, log, start, folder)

    snapshot = snapshots(out, snapshot_every, save)

    def each_step(done: int) -> None:
        if after_step is not None:
            after_step(done)
        snapshot(done)

    done = training.run(loss_fn, log.total, log, max_minutes, each_step)
    return save(out, done)


def train_sd(
    vae,
    out: str | Path | None = None,
    *,
    budget: TrainBudget = SD_BUDGET,
    caption_dropout: float = 0.1,
    unet_channels: Sequence[int] = (32, 64),
    text_hidden: int = 64,
    text_layers: int = 2,
    init: str | Path | None = None,
    text_pooling: bool = True,
    v_weight_cap: float | None = None,
    clip_text: str | Path | None = None,
    caption_noise: float = 0.0,
    **budget_keywords: Any,
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
    ``caption_noise``: :func:`toy_dataset`. Returns ``(pipeline, info)``.

    The budget (default :data:`SD_BUDGET`) and its keywords ``steps``, ``batch_size``, ``lr``,
    ``num_images``, ``seed``, ``log_every``, ``max_minutes``, ``ema_decay`` and ``snapshot_every``
    are :class:`~genalign.toy.generators.budget.TrainBudget`'s.
    """
    from diffusers import DDIMScheduler, DDPMScheduler, StableDiffusionPipeline

    from genalign.tiny.diffusion import sd_layout_pipeline

    def pipeline(text_encoder, unet) -> tuple[Any, dict[str, Any]]:  # of the averaged modules
        sampler = DDIMScheduler(**SD_BETAS, clip_sample=False, set_alpha_to_one=False, steps_offset=1)
        pipe = sd_layout_pipeline(StableDiffusionPipeline, vae, text_encoder, tokenizer, unet, sampler)
        return pipe, sd_layout_parameters(pipe)

    budget = recipe_budget("train_sd", budget, budget_keywords)
    torch.manual_seed(budget.seed)
    tokenizer = toy_tokenizer()
    images, captions = toy_dataset(budget.num_examples, seed=budget.seed + 1000, caption_noise=caption_noise)
    data = captioned_latents(encode_latents(vae, images) * vae.config.scaling_factor, tokenizer, captions)
    text_encoder, unet = _sd_modules(
        tokenizer,
        data.latents.shape[-1],
        init,
        unet_channels,
        text_hidden,
        text_layers,
        text_pooling,
        clip_text,
    )
    alphas_cumprod = DDPMScheduler(**SD_BETAS, clip_sample=False).alphas_cumprod
    timestep_weights = None if v_weight_cap is None else v_loss_timestep_weights(alphas_cumprod, v_weight_cap)
    training = AveragedTraining.of(
        [text_encoder, unet], budget.lr, budget.steps, budget.ema_decay, max_warmup=200
    )
    generator = torch.Generator().manual_seed(budget.seed)
    log = TrainingLog(budget.log_every, budget.steps, "toy-sd")
    start = time.time()
    text_encoder.train(clip_text is None)
    unet.train()

    def loss_fn(step: int) -> torch.Tensor:
        z0, tokens = data.draw(budget.batch_size, caption_dropout, generator)
        if timestep_weights is None:
            t = torch.randint(0, len(alphas_cumprod), (budget.batch_size,), generator=generator)
        else:
            t = torch.multinomial(timestep_weights, budget.batch_size, replacement=True, generator=generator)
        noise = torch.randn(z0.shape, generator=generator)
        a = alphas_cumprod[t].view(-1, 1, 1, 1)
        zt = a.sqrt() * z0 + (1 - a).sqrt() * noise  # q(z_t | z_0)
        prediction = unet(zt, t, encoder_hidden_states=text_encoder(tokens)[0]).sample
        return F.mse_loss(prediction, noise)  # L_simple

    return train_and_save(
        training, loss_fn, log, start, pipeline, out, budget.max_minutes, budget.snapshot_every
    )


def _sd_modules(
    tokenizer,
    latent_size: int,
    init: str | Path | None,
    unet_channels: Sequence[int],
    text_hidden: int,
    text_layers: int,
    text_pooling: bool,
    clip_text: str | Path | None,
):
    """toy-sd's (text encoder, UNet): new, or ``init``'s (extended by :func:`add_text_pooling`),
    with toy-clip's converted text tower, frozen, when ``clip_text`` is given."""
    from diffusers import StableDiffusionPipeline

    if init is None:
        text_encoder = build_text_encoder(tokenizer, text_hidden, text_layers)
        unet = build_unet(
            latent_size, unet_channels, cross_attention_dim=text_hidden, text_pooling=text_pooling
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
    return text_encoder, unet


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
    *,
    budget: TrainBudget = LCM_BUDGET,
    num_ddim_timesteps: int = 50,
    w_min: float = 2.0,
    w_max: float = 6.0,
    time_cond_proj_dim: int = 64,
    **budget_keywords: Any,
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

    The budget (default :data:`LCM_BUDGET`) and its keywords ``steps``, ``batch_size``, ``lr``,
    ``num_images``, ``seed``, ``log_every``, ``max_minutes`` and ``ema_decay`` are
    :class:`~genalign.toy.generators.budget.TrainBudget`'s.
    """
    from diffusers import LatentConsistencyModelPipeline, LCMScheduler

    from genalign.tiny.diffusion import sd_layout_pipeline

    budget = recipe_budget("train_lcm", budget, budget_keywords, unused=("snapshot_every",))
    torch.manual_seed(budget.seed)
    teacher_unet, text_encoder, tokenizer, vae = (
        teacher.unet,
        teacher.text_encoder,
        teacher.tokenizer,
        teacher.vae,
    )
    for module in (teacher_unet, text_encoder, vae):
        module.requires_grad_(False).eval()
    images, captions = toy_dataset(budget.num_examples, seed=budget.seed + 2000)
    latents = encode_latents(vae, images) * vae.config.scaling_factor
    table, caption_index, empty = _caption_table(text_encoder, tokenizer, captions)
    student = _lcm_student(teacher_unet, time_cond_proj_dim)
    # theta^-: the EMA of the student (constant decay), refreshed after every step
    training = AveragedTraining.of(
        [student], budget.lr, budget.steps, budget.ema_decay, max_warmup=100, weight_decay=0.0, warm_ema=False
    )
    (target,) = training.averaged

    alphas_cumprod = teacher.scheduler.alphas_cumprod.float()
    skip = len(alphas_cumprod) // num_ddim_timesteps
    ddim_timesteps = torch.arange(1, num_ddim_timesteps + 1) * skip - 1  # t_1 .. t_N (as LCMScheduler)
    generator = torch.Generator().manual_seed(budget.seed)
    log = TrainingLog(budget.log_every, budget.steps, "toy-lcm")
    start = time.time()

    def loss_fn(step: int) -> torch.Tensor:
        index = torch.randint(len(latents), (budget.batch_size,), generator=generator)
        z0 = latents[index]
        cond = table[caption_index[index]]
        n = torch.randint(0, num_ddim_timesteps, (budget.batch_size,), generator=generator)
        t_start = ddim_timesteps[n]
        t_end = (t_start - skip).clamp(min=0)
        a_start = alphas_cumprod[t_start].view(-1, 1, 1, 1)
        a_end = torch.where(t_start - skip >= 0, alphas_cumprod[t_end], alphas_cumprod[0]).view(-1, 1, 1, 1)
        w = w_min + (w_max - w_min) * torch.rand(budget.batch_size, generator=generator)
        w_embedding = guidance_scale_embedding(w, time_cond_proj_dim)
        noise = torch.randn(z0.shape, generator=generator)
        z_start = a_start.sqrt() * z0 + (1 - a_start).sqrt() * noise

        c_skip_start, c_out_start = (c.view(-1, 1, 1, 1) for c in lcm_boundary_scalings(t_start))
        c_skip_end, c_out_end = (c.view(-1, 1, 1, 1) for c in lcm_boundary_scalings(t_end))
        eps_student = student(z_start, t_start, encoder_hidden_states=cond, timestep_cond=w_embedding).sample
        f_student = c_skip_start * z_start + c_out_start * _x0_from_eps(z_start, eps_student, a_start)
        with torch.no_grad():
            z_end = _guided_ddim_step(teacher_unet, z_start, t_start, cond, empty, w, a_start, a_end)
            eps_target = target(z_end, t_end, encoder_hidden_states=cond, timestep_cond=w_embedding).sample
            f_target = c_skip_end * z_end + c_out_end * _x0_from_eps(z_end, eps_target, a_end)
        return F.mse_loss(f_student, f_target)

    def refresh_target(done: int) -> None:
        training.averages()  # theta^- <- mu theta^- + (1 - mu) theta, as averaged

    def pipeline(unet) -> tuple[Any, dict[str, Any]]:  # of the EMA target theta^-
        lcm_scheduler = LCMScheduler(
            **SD_BETAS, clip_sample=False, set_alpha_to_one=False, steps_offset=1,
            original_inference_steps=num_ddim_timesteps, timestep_scaling=10.0,
        )  # fmt: skip
        pipe = sd_layout_pipeline(
            LatentConsistencyModelPipeline, vae, text_encoder, tokenizer, unet, lcm_scheduler
        )
        return pipe, sd_layout_parameters(pipe)

    return train_and_save(
        training, loss_fn, log, start, pipeline, out, budget.max_minutes, after_step=refresh_target
    )


def _caption_table(text_encoder, tokenizer, captions: Sequence[str]):
    """The frozen text encoder's states of every distinct caption: ``(table [K, L, D], index of each
    caption's row [N], the empty prompt's row [L, D])``."""
    unique = sorted(set(captions) | {""})
    with torch.no_grad():
        table = torch.cat(
            [text_encoder(tokenize(tokenizer, unique[i : i + 256]))[0] for i in range(0, len(unique), 256)]
        )
    return table, torch.tensor([unique.index(c) for c in captions]), table[unique.index("")]


def _lcm_student(teacher_unet, time_cond_proj_dim: int):
    """The teacher's UNet with a guidance-embedding input whose projection starts at zero (so the
    student starts as the teacher), in training mode."""
    from diffusers import UNet2DConditionModel

    student = UNet2DConditionModel.from_config(
        dict(teacher_unet.config), time_cond_proj_dim=time_cond_proj_dim
    )
    missing, unexpected = student.load_state_dict(teacher_unet.state_dict(), strict=False)
    if unexpected or any("cond_proj" not in name for name in missing):
        raise RuntimeError(f"student/teacher mismatch: missing {missing}, unexpected {unexpected}")
    torch.nn.init.zeros_(student.time_embedding.cond_proj.weight)
    return student.train()


def _guided_ddim_step(teacher_unet, z_start, t_start, cond, empty, w, a_start, a_end) -> torch.Tensor:
    """The teacher's classifier-free-guided DDIM step ``z_{n+k} -> z_hat_n`` (Luo et al. 2023,
    eq. 11 with Psi = DDIM), guidance ``x_hat = x_c + w (x_c - x_uncond)`` on both x0 and epsilon."""
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
    return a_end.sqrt() * x0_guided + (1 - a_end).sqrt() * eps_guided  # DDIM (eta = 0)
