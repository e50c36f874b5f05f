"""``python -m genalign.toy.generators {vae,toy-sd,toy-lcm,toy-flow,video-vae,toy-ar-video,video-pack,eval,card,...}``:
one function per command (the video ones in :mod:`genalign.toy.generators.video_cli`). The exact commands of the shipped models are in ``assets/models/<name>/README.md``."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from genalign.toy.generators.card import (
    add_previous_stages,
    command_line,
    previous_commands,
    stage_commands,
    write_card,
)
from genalign.toy.generators.evaluate import FAMILIES, evaluate_generator
from genalign.toy.generators.flow import train_flow
from genalign.toy.generators.train import SD_KL_WEIGHT, train_lcm, train_sd, train_vae
from genalign.toy.generators.video_cli import (
    ar_video_command,
    guidance_command,
    reflow_command,
    video_card_command,
    video_pack_command,
    video_vae_command,
)

logger = logging.getLogger(__name__)

TRAIN_EVAL = "train prompts (16 per category, 2 images each)"
# options that belong to one command only
COMMAND_OPTIONS = (
    ("--kl-weight", "kl_weight", "vae video-vae"),
    ("--v-weight-cap", "v_weight_cap", "toy-sd"),
)
COMMAND_OPTIONS += (
    ("--clip-text", "clip_text", "toy-sd toy-flow toy-ar-video"),
    ("--caption-noise", "caption_noise", "toy-sd toy-flow"),
)
COMMAND_OPTIONS += (("--name", "name", "toy-sd toy-flow"), ("--layers", "layers", "toy-flow toy-ar-video"))
COMMAND_OPTIONS += (
    (
        "--num-videos",
        "num_videos",
        "video-vae toy-ar-video toy-ar-video-reflow toy-ar-video-guidance video-pack",
    ),
    ("--guidance", "guidance", "toy-ar-video-guidance"),
    ("--device", "device", "toy-ar-video"),
    ("--videos", "videos", "toy-ar-video"),
    ("--ode-steps", "ode_steps", "toy-ar-video-reflow"),
    ("--width", "width", "toy-ar-video"),
    ("--patch-size", "patch_size", "toy-ar-video"),
    ("--foreground-weight", "foreground_weight", "video-vae"),
    ("--caption-dropout", "caption_dropout", "toy-ar-video"),
    ("--ode-guidance", "ode_guidance", "toy-ar-video-reflow"),
    ("--categories", "categories", "video-pack"),
    ("--first-block-prob", "first_block_prob", "toy-ar-video toy-ar-video-guidance"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m genalign.toy.generators",
        description="Toy generators: small real diffusers pipelines trained on the toy world (issue #6).",
    )
    parser.add_argument(
        "what",
        choices=[
            "vae",
            "toy-sd",
            "toy-lcm",
            "toy-flow",
            "video-vae",
            "toy-ar-video",
            "toy-ar-video-reflow",
            "toy-ar-video-guidance",
            "toy-ar-video-card",
            "video-pack",
            "eval",
            "card",
        ],
    )
    parser.add_argument("--out", required=True, help="output folder (eval: the model folder)")
    parser.add_argument(
        "--vae",
        help="trained VAE folder, or a toy model folder whose VAE to reuse (toy-sd, toy-flow); toy-ar-video: a video-vae folder",
    )
    parser.add_argument("--teacher", help="toy-sd folder (toy-lcm)")
    parser.add_argument(
        "--init",
        help="toy-sd / toy-flow / video-vae / toy-ar-video: continue training from this folder of the same kind",
    )
    parser.add_argument("--family", choices=FAMILIES, help="eval: the model family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int, help="default 64 (toy-ar-video-guidance: 16)")
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
        help="toy-sd, toy-flow: an open_clip folder (toy-clip) whose text tower becomes the frozen text encoder "
        "(toy-flow: both of them)",
    )
    parser.add_argument(
        "--layers",
        type=int,
        help="toy-flow: MMDiT blocks of a new transformer (default 3); toy-ar-video: blocks (4)",
    )
    _add_video_options(parser)
    parser.add_argument(
        "--v-weight-cap",
        type=float,
        help="toy-sd: draw timesteps with probability min(1/alpha_bar_t, CAP), i.e. the v-prediction loss "
        "(default: uniform timesteps, DDPM's L_simple)",
    )
    parser.add_argument(
        "--name", help="toy-sd, toy-flow: the model's name on its card (default: the command)"
    )
    parser.add_argument(
        "--caption-noise",
        type=float,
        help="toy-sd, toy-flow: the fraction of captioned renders that show a scene of another train prompt of the same "
        "category (loose, web-like captions; default 0)",
    )
    parser.add_argument(
        "--snapshot-every",
        type=int,
        help="toy-sd, toy-flow: save the EMA weights to OUT/snapshot every N steps",
    )
    parser.add_argument("--eval-steps", type=int)
    parser.add_argument("--eval-guidance", type=float)
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument(
        "--eval-per-prompt",
        type=int,
        default=4,
        help="toy-ar-video: 0 skips the evaluation (then toy-ar-video-card)",
    )
    parser.add_argument(
        "--colour-per-prompt",
        type=int,
        help="card: also score the colour category of the train prompts with this many images per prompt",
    )
    return parser


def _add_video_options(parser: argparse.ArgumentParser) -> None:
    """The options of the video commands (video-vae, toy-ar-video, toy-ar-video-reflow)."""
    parser.add_argument("--num-videos", type=int, help="video-vae, toy-ar-video: training videos rendered")
    parser.add_argument("--width", type=int, help="toy-ar-video: the transformer's width (default 128)")
    parser.add_argument("--device", help="toy-ar-video: where to encode and train, e.g. cuda (default cpu)")
    parser.add_argument(
        "--patch-size",
        type=int,
        help="toy-ar-video: spatial patch of the transformer (default 4: 9 tokens a frame)",
    )
    parser.add_argument(
        "--videos", help="toy-ar-video: train on this pack of rendered videos (written by video-pack)"
    )
    parser.add_argument(
        "--caption-dropout",
        type=float,
        help="toy-ar-video: probability of training on the empty caption, for classifier-free guidance "
        "(default 0)",
    )
    parser.add_argument(
        "--ode-guidance",
        type=float,
        help="toy-ar-video-reflow: classifier-free guidance of the ODE pairs (default 1: none; needs a "
        "model trained with --caption-dropout)",
    )
    parser.add_argument(
        "--ode-steps",
        type=int,
        help="toy-ar-video-reflow: Euler steps per block of the ODE pairs (default 8)",
    )
    parser.add_argument(
        "--foreground-weight",
        type=float,
        help="video-vae: weight of shape pixels in the reconstruction loss, the white background's being 1 (default 5)",
    )
    parser.add_argument(
        "--first-block-prob",
        type=float,
        help="toy-ar-video: fraction of steps that train the first block alone, drawn from noise (default 0; "
        "toy-ar-video-guidance: 0.5)",
    )
    parser.add_argument(
        "--guidance",
        type=float,
        help="toy-ar-video-guidance: the classifier-free guidance w whose output the student learns (default 3)",
    )
    parser.add_argument(
        "--categories", help="video-pack: only these video categories, comma-separated (default: all four)"
    )


def _training_options(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe options given on the command line (unset ones keep the recipe's defaults)."""
    options = {"steps": args.steps, "lr": args.lr, "num_images": args.num_images, "ema_decay": args.ema_decay}
    return {k: v for k, v in options.items() if v}


def _stage_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "batch_size": args.batch_size,
        "seed": args.seed,
        "max_minutes": args.max_minutes,
        **_training_options(args),
    }


# -- commands that do not train a pipeline ----------------------------------------------------------


def vae_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    out = Path(args.out)
    options = _training_options(args)
    if args.kl_weight is not None:
        options["kl_weight"] = args.kl_weight
    _, info = train_vae(out, seed=args.seed, **options)
    (out / "training.json").write_text(json.dumps(dict(info, command=command_line()), indent=2) + "\n")
    print(json.dumps({k: v for k, v in info.items() if k != "loss_history"}))
    return 0


def card_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Add the train-prompt evaluation to a trained model's card."""
    out = Path(args.out)
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


def eval_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.family is None:
        parser.error("eval needs --family")
    result = evaluate_generator(
        Path(args.out),
        args.family,
        num_per_prompt=args.eval_per_prompt,
        seed=args.eval_seed,
        steps=args.eval_steps,
        guidance=args.eval_guidance,
    )
    print(json.dumps(result, indent=2))
    return 0


# -- training commands: each returns its card's fields ------------------------------------------------


def stage_vae(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[Any, dict[str, Any]]:
    """The VAE a toy-sd stage trains on and its record: ``--vae`` (a folder from the vae command),
    or else the VAE of the ``--init`` model, whose card records how it was trained."""
    from diffusers import AutoencoderKL

    if args.vae and (Path(args.vae) / "training.json").is_file():
        return AutoencoderKL.from_pretrained(args.vae), json.loads(
            (Path(args.vae) / "training.json").read_text()
        )
    for model in (args.vae, args.init):  # a toy model folder whose card records how its VAE was trained
        card = Path(model or "") / "card.json"
        if model and card.is_file() and "vae" in (recorded := json.loads(card.read_text())):
            return AutoencoderKL.from_pretrained(str(Path(model) / "vae")), recorded["vae"]
    parser.error(
        f"{args.what} needs --vae: a VAE folder with training.json, or a model folder whose card.json records its VAE"
    )


def sd_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    vae, vae_info = stage_vae(args, parser)
    vae_steps = vae_info.get("steps") or len(vae_info["loss_history"]) * 100
    extra = _stage_options(args)
    if args.v_weight_cap is not None:
        extra["v_weight_cap"] = args.v_weight_cap
    if args.clip_text is not None:
        extra["clip_text"] = args.clip_text
    if args.caption_noise is not None:
        extra["caption_noise"] = args.caption_noise
    _, info = train_sd(vae, Path(args.out), init=args.init, snapshot_every=args.snapshot_every, **extra)
    commands = stage_commands(
        previous_commands(Path(args.init)) if args.init else [], vae_info["command"], command_line()
    )
    stage_seconds, total_steps = add_previous_stages(info, args.init)
    text_encoder = (
        f"its UNet trained in stages on the toy world and, as in Stable Diffusion, conditioned on a frozen "
        f"pretrained CLIP text encoder: the text tower of {args.clip_text}. "
        if args.clip_text
        else "trained from scratch. "
    )
    data = (
        f"this stage {info['steps'] * args.batch_size:,} samples from {extra.get('num_images', 30000):,} "
        "renders (48 px, skia): train prompts only (category uniform) plus 15% random layouts captioned ''; "
        + (
            f"{args.caption_noise:.0%} of the captioned renders show a scene of another train prompt of the same "
            "category (loose captions, `--caption-noise`); "
            if args.caption_noise
            else ""
        )
        + f"VAE on its own renders (reconstruction MAE {vae_info['reconstruction_mae']:.4f})."
    )
    train = (
        f"VAE {vae_steps} steps (KL weight {vae_info.get('kl_weight', SD_KL_WEIGHT):g}); "
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
    name = args.name or "toy-sd"
    loose = (
        f"Its last stage trained on loose captions ({args.caption_noise:.0%} of the captioned renders show a scene "
        "of another prompt of the same category), as a model trained on web alt-text is: it draws the caption's "
        "scene only part of the time, the failure that RL with a GenEval-style reward corrects. "
        if args.caption_noise
        else ""
    )
    return {
        "name": name,
        "family": "sd",
        "vae": {
            "command": vae_info["command"],
            "steps": vae_steps,
            "kl_weight": vae_info.get("kl_weight", SD_KL_WEIGHT),
            "reconstruction_mae": vae_info["reconstruction_mae"],
        },
        "description": "A small Stable Diffusion 1.x-architecture text-to-image model of the toy world (48 px), "
        + text_encoder
        + loose
        + "It follows prompts imperfectly, by design: room for RL.",
        "load": f'StableDiffusionPipeline.from_pretrained("assets/models/{name}")',
        "commands": commands,
        "data": data,
        "train": train,
        "info": info,
    }


def lcm_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    from diffusers import StableDiffusionPipeline

    teacher = StableDiffusionPipeline.from_pretrained(
        args.teacher or parser.error("toy-lcm needs --teacher"), safety_checker=None, feature_extractor=None
    )
    _, info = train_lcm(teacher, Path(args.out), **_stage_options(args))
    return {
        "name": "toy-lcm",
        "family": "consistency",
        "description": "Latent Consistency Distillation (Luo et al. 2023, Algorithm 1) of toy-sd: 1-4 step sampling "
        "with the guidance scale as an input (w = guidance_scale - 1).",
        "load": 'DiffusionPipeline.from_pretrained("assets/models/toy-lcm")',
        "commands": [*previous_commands(Path(args.teacher)), command_line()],
        "data": "renders of train prompts (as toy-sd, another seed), encoded by toy-sd's VAE; teacher = toy-sd.",
        "train": f"{info['steps']} LCD steps, batch {args.batch_size}, N=50 DDIM skipping steps, w ~ U[2, 6], EMA 0.95, "
        f"L2 distance; {info['train_seconds']:.0f} s on one CPU thread.",
        "info": info,
    }


def flow_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    vae, vae_info = stage_vae(args, parser) if args.vae or not args.init else (None, {})
    extra = {"clip_text": args.clip_text, "caption_noise": args.caption_noise, "num_layers": args.layers}
    _, info = train_flow(
        vae,
        Path(args.out),
        init=args.init,
        snapshot_every=args.snapshot_every,
        **{k: v for k, v in extra.items() if v is not None},
        **_stage_options(args),
    )
    stage_seconds, total_steps = add_previous_stages(info, args.init)
    commands = [
        *(previous_commands(Path(args.init)) if args.init else [vae_info["command"]]),
        command_line(),
    ]
    name = args.name or "toy-flow"
    text = (
        f"conditioned on a frozen pretrained CLIP text encoder (the text tower of {args.clip_text}, with its "
        "projection, as both CLIP encoders)"
        if args.clip_text
        else "trained from scratch"
    )
    loose = (
        f" Its last stage trained on loose captions ({args.caption_noise:.0%} of the captioned renders show a scene "
        "of another prompt of the same category), as a model trained on web alt-text is: room for RL."
        if args.caption_noise
        else ""
    )
    return {
        "name": name,
        "family": "flow",
        "description": "A small Stable Diffusion 3-architecture (MMDiT, two CLIP encoders, no T5) rectified-flow model "
        f"of the toy world (48 px), {text}; it shares a toy-sd VAE (with a latent shift).{loose}",
        "load": f'StableDiffusion3Pipeline.from_pretrained("assets/models/{name}", text_encoder_3=None, tokenizer_3=None)',
        "commands": commands,
        "data": "renders of train prompts only plus 15% random layouts captioned '' (48 px, skia)"
        + (
            f"; {args.caption_noise:.0%} of the captioned renders show another train prompt's scene."
            if args.caption_noise
            else "."
        ),
        "train": f"{total_steps} steps over {len(commands) - 1} stage(s) (this one: {info['steps']} steps, batch "
        f"{args.batch_size}, lr {args.lr}, {stage_seconds:.0f} s), AdamW, rectified flow (velocity) loss with "
        f"logit-normal t, caption dropout 0.1, EMA {args.ema_decay or 0.99}"
        + ("; text encoders frozen" if args.clip_text else "")
        + f"; {info['train_seconds']:.0f} s in all on CPU ({args.threads} thread(s) this stage).",
        "info": info,
    }


# -- evaluation and the card of a trained pipeline -------------------------------------------------------


def _evaluations(path: Path, family: str, args: argparse.Namespace) -> dict[str, Any]:
    settings = {"seed": args.eval_seed, "steps": args.eval_steps, "guidance": args.eval_guidance}
    full = evaluate_generator(path, family, num_per_prompt=args.eval_per_prompt, **settings)
    subset = evaluate_generator(path, family, num_per_prompt=2, per_category=2, **settings)
    logger.info("[%s] held-out overall %.3f %s", family, full["overall"], full["per_category"])
    logger.info("[%s] subset overall %.4f", family, subset["overall"])
    return {"eval": full, "eval_subset": subset}


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
    logger.info("[%s] train prompts overall %.3f %s", family, result["overall"], result["per_category"])
    return result


def write_trained_card(out: Path, fields: dict[str, Any], args: argparse.Namespace) -> None:
    """Evaluate a freshly trained pipeline (held-out, subset, train prompts; 1 and 2 steps for a
    consistency model) and write its card."""
    family, info = fields["family"], fields["info"]
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
        **{
            key: fields[key]
            for key in ("name", "family", "description", "load", "commands", "data", "train", "vae")
            if key in fields
        },
        "parameters": info["parameters"],
        "train_seconds": info["train_seconds"],
        "train_steps": info["steps"],
        **({"total_train_steps": info["total_train_steps"]} if "total_train_steps" in info else {}),
        "loss_history": info["loss_history"],
        **evals,
        "extra_evals": extra_evals,
    }
    write_card(out, card)


COMMANDS: dict[str, Callable[[argparse.Namespace, argparse.ArgumentParser], int]] = {
    "vae": vae_command,
    "card": card_command,
    "eval": eval_command,
    "video-vae": video_vae_command,
    "toy-ar-video": ar_video_command,
    "toy-ar-video-reflow": reflow_command,
    "toy-ar-video-guidance": guidance_command,
    "toy-ar-video-card": video_card_command,
    "video-pack": video_pack_command,
}
TRAINING_COMMANDS: dict[str, Callable[[argparse.Namespace, argparse.ArgumentParser], dict[str, Any]]] = {
    "toy-sd": sd_command,
    "toy-lcm": lcm_command,
    "toy-flow": flow_command,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # a no-op when logging is set up
    torch.set_num_threads(args.threads)
    if args.batch_size is None:
        args.batch_size = 16 if args.what == "toy-ar-video-guidance" else 64
    for option, name, command in COMMAND_OPTIONS:
        if getattr(args, name) is not None and args.what not in command.split():
            commands = command.split()
            plural = "s" if len(commands) > 1 else ""
            parser.error(f"{option} is an option of the {' and '.join(commands)} command{plural} only")
    if args.what in COMMANDS:
        return COMMANDS[args.what](args, parser)
    fields = TRAINING_COMMANDS[args.what](args, parser)
    write_trained_card(Path(args.out), fields, args)
    return 0
