"""The toy AR video generator's commands of ``python -m genalign.toy.generators``: ``video-vae``
(the autoencoder), ``toy-ar-video`` (the transformer, then the card) and its later stages
(``toy-ar-video-reflow``, ``toy-ar-video-guidance``). One function per command."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from genalign.toy.generators.card import command_line
from genalign.toy.generators.video import train_video_vae
from genalign.toy.generators.video_eval import VIDEO_SAMPLING, evaluate_video_generator
from genalign.toy.generators.video_guidance import train_guidance_distillation
from genalign.toy.generators.video_reflow import train_reflow
from genalign.toy.generators.video_train import VIDEO_DATA_SEED_OFFSET, train_ar_video
from genalign.toy.training import folder_megabytes, write_card_files
from genalign.toy.video.data import load_video_pack, save_video_pack, toy_video_dataset

logger = logging.getLogger(__name__)

NAME = "toy-ar-video"
DEFAULT_CLIP_TEXT = "assets/models/toy-clip"


def video_vae_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Train the video autoencoder; writes the folder and its ``training.json`` (with the command)."""
    out = Path(args.out)
    options = {"steps": args.steps, "lr": args.lr, "num_videos": args.num_videos, "kl_weight": args.kl_weight}
    options["foreground_weight"] = args.foreground_weight  # None: the recipe's default
    options = {k: v for k, v in options.items() if v is not None}
    _, info = train_video_vae(out, seed=args.seed, max_minutes=args.max_minutes, init=args.init, **options)
    info["commands"] = [command_line()]
    if args.init:  # a continued stage: the earlier stages' commands, steps and seconds come first
        previous = json.loads((Path(args.init) / "training.json").read_text())
        info["commands"] = previous["commands"] + info["commands"]
        info["steps"] += previous["steps"]
        info["train_seconds"] += previous["train_seconds"]
    (out / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps({k: v for k, v in info.items() if k != "loss_history"}))
    return 0


def ar_video_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Train the transformer on a ``video-vae`` folder's latents (or continue a toy-ar-video folder,
    ``--init``, on its own autoencoder), then evaluate and write the card."""
    vae, vae_info, previous = ar_video_stage(args, parser)
    options = {
        "steps": args.steps,
        "lr": args.lr,
        "num_videos": args.num_videos,
        "ema_decay": args.ema_decay,
        "num_layers": args.layers,
        "width": args.width,
        "patch": args.patch_size,
        "caption_dropout": args.caption_dropout,
        "first_block_prob": args.first_block_prob,
    }
    options = {k: v for k, v in options.items() if v is not None}
    if args.videos is not None:
        if args.num_videos is not None:
            parser.error("toy-ar-video takes --videos (a pack) or --num-videos (render), not both")
        try:
            options["videos"] = load_video_pack(args.videos)
        except (FileNotFoundError, ValueError) as error:
            parser.error(f"--videos: {error}")
    out = Path(args.out)
    _, info = train_ar_video(
        vae,
        args.clip_text or DEFAULT_CLIP_TEXT,
        out,
        batch_size=args.batch_size,
        seed=args.seed,
        max_minutes=args.max_minutes,
        snapshot_every=args.snapshot_every,
        device=args.device or "cpu",
        init=args.init,
        **options,
    )
    card = {
        "name": NAME,
        "commands": [*(previous or vae_info)["commands"], command_line()],
        "vae": {k: v for k, v in vae_info.items() if k not in ("loss_history", "parameters")},
        "clip_text": args.clip_text or DEFAULT_CLIP_TEXT,
        "batch_size": args.batch_size,
        **{k: info[k] for k in ("steps", "train_seconds", "parameters", "loss_history")},
        "device": args.device or "cpu",
    }
    if previous:  # a continued stage: the whole model's steps and seconds, this stage's loss
        card["stage_steps"], card["stage_seconds"] = info["steps"], info["train_seconds"]
        card["steps"] += previous.get("steps", 0)
        card["train_seconds"] += previous.get("train_seconds", 0.0)
    return finish_video_card(out, card, args)


def ar_video_stage(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[Any, dict, dict]:
    """toy-ar-video's autoencoder, its record, and the continued folder's card (``{}`` for a first
    stage): ``--vae`` (a video-vae folder with training.json), or with ``--init`` the continued
    folder's own autoencoder, whose card records it. Errors name the folder or option at fault."""
    from diffusers import AutoencoderKLWan

    if args.init:
        card = Path(args.init) / "card.json"
        if not card.is_file():
            parser.error(f"--init {args.init}: no card.json (not a folder written by toy-ar-video)")
        given = [
            f
            for f, v in (
                ("--patch-size", args.patch_size),
                ("--width", args.width),
                ("--layers", args.layers),
            )
            if v
        ]
        if given:
            parser.error(f"--init continues {args.init}'s architecture; drop {', '.join(given)}")
        if args.vae:
            parser.error("--init trains on the continued folder's own autoencoder; drop --vae")
        previous = json.loads(card.read_text())
        return AutoencoderKLWan.from_pretrained(str(Path(args.init) / "vae")), previous["vae"], previous
    if not args.vae or not (Path(args.vae) / "training.json").is_file():
        parser.error(
            "toy-ar-video needs --vae: a folder written by the video-vae command (with training.json)"
        )
    return (
        AutoencoderKLWan.from_pretrained(args.vae),
        json.loads((Path(args.vae) / "training.json").read_text()),
        {},
    )


def video_card_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Evaluate a toy-ar-video folder trained with ``--eval-per-prompt 0`` and write its card."""
    path = Path(args.out) / "card.json"
    if not path.is_file():
        parser.error(f"toy-ar-video-card: {path} not found (a folder written by toy-ar-video)")
    card = json.loads(path.read_text())
    card["eval_steps"] = _eval_steps(args, card)
    card["evals"] = video_evaluations(
        Path(args.out), args.eval_seed, args.eval_per_prompt, card["eval_steps"]
    )
    write_video_card(Path(args.out), card)
    return 0


def video_pack_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Render ``--num-videos`` training videos (the toy-ar-video recipe's data for ``--seed``;
    ``--categories a,b``: only those video categories) into one compressed pack (``--out``), for
    ``toy-ar-video --videos``."""
    if not args.num_videos:
        parser.error("video-pack needs --num-videos N (N > 0)")
    categories = args.categories.split(",") if args.categories else None
    try:
        videos, captions = toy_video_dataset(
            args.num_videos, seed=args.seed + VIDEO_DATA_SEED_OFFSET, categories=categories
        )
    except ValueError as error:
        parser.error(f"--categories: {error}")
    save_video_pack(args.out, videos, captions)
    logger.info(
        "[video-pack] %d videos -> %s (%.1f MB)", len(captions), args.out, Path(args.out).stat().st_size / 1e6
    )
    return 0


def reflow_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Reflow a ``toy-ar-video`` folder (``--init``), then evaluate and write the card."""
    previous = _previous_card(args, parser, "toy-ar-video-reflow")
    options = _later_stage_options(args, ode_steps=args.ode_steps, guidance_scale=args.ode_guidance)
    out = Path(args.out)
    _, info = train_reflow(
        args.init, out, batch_size=args.batch_size, seed=args.seed, max_minutes=args.max_minutes, **options
    )
    record = {
        "num_videos": options.get("num_videos", 2000),
        "ode_steps": options.get("ode_steps", 8),
        "ode_guidance": options.get("guidance_scale", 1.0),
    }
    card = _continued_card(previous, "reflow", record, info, args.batch_size)
    if "evals" in previous:  # a teacher trained with --eval-per-prompt 0 has none
        card["stage_1_evals"] = {k: previous["evals"][k]["overall"] for k in ("rl_heldout", "rl_train")}
    return finish_video_card(out, card, args)


def guidance_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Distil a guided ``toy-ar-video`` folder (``--init``, trained with ``--caption-dropout``) into a
    student that samples unguided (:mod:`genalign.toy.generators.video_guidance`), then evaluate it
    (``--eval-steps`` per block; default 8, where the distilled student gains) and write the card."""
    previous = _previous_card(args, parser, "toy-ar-video-guidance")
    options = _later_stage_options(args, guidance_scale=args.guidance, first_block_prob=args.first_block_prob)
    out = Path(args.out)
    _, info = train_guidance_distillation(
        args.init, out, batch_size=args.batch_size, seed=args.seed, max_minutes=args.max_minutes, **options
    )
    record = {
        "num_videos": options.get("num_videos", 4000),
        "guidance_scale": options.get("guidance_scale", 3.0),
    }
    card = _continued_card(previous, "guidance_distillation", record, info, args.batch_size)
    card["eval_steps"] = args.eval_steps or 8
    return finish_video_card(out, card, args)


def _previous_card(args: argparse.Namespace, parser: argparse.ArgumentParser, command: str) -> dict:
    """The card of the ``--init`` folder a later stage continues (an argparse error without one)."""
    if not args.init or not (Path(args.init) / "card.json").is_file():
        parser.error(f"{command} needs --init: a folder written by the toy-ar-video command")
    return json.loads((Path(args.init) / "card.json").read_text())


def _later_stage_options(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """The training options given on the command line (unset ones keep the stage's defaults)."""
    options = {"steps": args.steps, "lr": args.lr, "num_videos": args.num_videos, "ema_decay": args.ema_decay}
    return {k: v for k, v in {**options, **extra}.items() if v is not None}


def _continued_card(
    previous: dict[str, Any], key: str, record: dict[str, Any], info: dict[str, Any], batch_size: int
) -> dict[str, Any]:
    """The card of a later stage: the earlier card (less its evaluations and size), this command,
    the stage's ``record`` under ``key`` and the summed training time."""
    stage = {"steps": info["steps"], "train_seconds": info["train_seconds"], **record}
    stage.update(batch_size=batch_size, loss_history=info["loss_history"])
    return {
        **{k: v for k, v in previous.items() if k not in ("evals", "size_mb")},
        "commands": [*previous["commands"], command_line()],
        key: stage,
        "train_seconds": previous["train_seconds"] + info["train_seconds"],
    }


def finish_video_card(out: Path, card: dict[str, Any], args: argparse.Namespace) -> int:
    """Evaluate ``out`` and write its card and README; with ``--eval-per-prompt 0`` (e.g. trained on
    a GPU box) write only card.json, for ``toy-ar-video-card`` to finish later."""
    if args.eval_per_prompt == 0:
        (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
        logger.info("[%s] evaluation skipped; finish the card with: toy-ar-video-card --out %s", NAME, out)
        return 0
    card["eval_steps"] = _eval_steps(args, card)
    card["evals"] = video_evaluations(out, args.eval_seed, args.eval_per_prompt, card["eval_steps"])
    write_video_card(out, card)
    return 0


def _eval_steps(args: argparse.Namespace, card: dict[str, Any]) -> int:
    """Steps per block of the card's evaluation: ``--eval-steps``, else the card's own, else 4."""
    return int(args.eval_steps or card.get("eval_steps") or VIDEO_SAMPLING["num_inference_steps"])


def video_evaluations(
    path: Path, seed: int = 0, num_per_prompt: int = 1, steps: int | None = None
) -> dict[str, Any]:
    """The card's evaluations: RL-held-out and RL-train prompts, and a small fixed subset, with
    ``steps`` Self-Forcing steps per block (None: the policy's 4)."""
    steps = int(steps or VIDEO_SAMPLING["num_inference_steps"])
    evals = {
        split: evaluate_video_generator(path, split, num_per_prompt=num_per_prompt, seed=seed, steps=steps)
        for split in ("rl_heldout", "rl_train")
    }
    evals["subset"] = evaluate_video_generator(
        path, "rl_heldout", per_category=2, num_per_prompt=2, seed=seed, steps=steps
    )
    for name, result in evals.items():
        logger.info("[%s] %s overall %.3f %s", NAME, name, result["overall"], result["interval"])
    return evals


def _table(result: dict[str, Any]) -> str:
    rows = [f"| {c} | {a:.3f} | {result['counts'][c]} |" for c, a in result["per_category"].items()]
    low, high = result["interval"]
    return "\n".join(
        [
            "| category | accuracy | videos |",
            "|---|---|---|",
            *rows,
            f"| **overall** (mean of categories) | **{result['overall']:.3f}** [{low:.3f}, {high:.3f}] | |",
        ]
    )


def _reflow_line(card: dict[str, Any]) -> str:
    if "reflow" not in card:
        return ""
    reflow, before = card["reflow"], card["stage_1_evals"]
    return (
        f"\n- Reflow (Liu et al. 2023): {reflow['num_videos']} pairs (noise, its {reflow['ode_steps']}-step Euler ODE "
        f"sample at guidance {reflow.get('ode_guidance', 1.0):g}, block by block), then {reflow['steps']} steps of the same loss with the paired noise, batch "
        f"{reflow['batch_size']}, {reflow['train_seconds']:.0f} s. The 4-step Self-Forcing rollout of the "
        "flow-matching model before reflow (its x0 is a posterior mean: `genalign/toy/generators/video_reflow.py`): "
        f"verifier accuracy {before['rl_heldout']:.3f} (RL-held-out) / {before['rl_train']:.3f} (RL-train)."
    )


def _guidance_line(card: dict[str, Any]) -> str:
    if "guidance_distillation" not in card:
        return ""
    stage = card["guidance_distillation"]
    return (
        f"\n- Guidance distillation (Meng et al. 2023, stage one): from the model above (the teacher), "
        f"{stage['steps']} steps regressing its classifier-free-guided velocity at w = {stage['guidance_scale']:g} "
        f"on diffusion forcing's noisy frames of {stage['num_videos']} rendered videos, batch "
        f"{stage['batch_size']}, {stage['train_seconds']:.0f} s (`genalign/toy/generators/video_guidance.py`). "
        "The student samples unguided what the teacher samples guided."
    )


def _where(card: dict[str, Any]) -> str:
    device = card.get("device", "cpu")
    return "the CPU" if device == "cpu" else f"{device} (the first stage)"


def write_video_card(out: Path, card: dict[str, Any]) -> None:
    """``card.json`` and README.md of toy-ar-video."""
    card = dict(card, size_mb=folder_megabytes(out))
    evals, vae = card["evals"], card["vae"]
    params = ", ".join(f"{k} {v:,}" for k, v in card["parameters"].items())
    sections = "".join(
        f"\n### {title}\n\n{_table(evals[key])}\n\nSettings: `{json.dumps(evals[key]['settings'])}`\n"
        for key, title in (("rl_heldout", "RL-held-out prompts"), ("rl_train", "RL-train prompts"))
    )
    readme = f"""# {card["name"]}

A small block-causal autoregressive video generator of the toy video world (moving shapes, 8 frames
at 48 px; `genalign.toy.video`), in the `ar_video` family's layout: a
`SkyReelsV2DiffusionForcingPipeline` with a block-causal `SkyReelsV2Transformer3DModel` (blocks of 2
latent frames), an `AutoencoderKLWan` (4x spatial, no temporal compression) and, as text encoder,
the frozen text tower of toy-clip (a `CLIPTextModel` with a toy `CLIPTokenizer`; diffusers logs that
it expected a T5 encoder, and runs it). Sampled Self-Forcing style by the `ar_video` policy,
{card.get("eval_steps", 4)} steps per block in the tables below. It follows its prompts imperfectly (a few CPU-hours of training; docs/astrolabe.md tracks it
stage by stage), which leaves room for Astrolabe; its own guided Euler ODE draws better videos than
the few-step rollout (`benchmarks/toy_video_teacher.py`).

Built by `genalign/toy/generators/video*.py` (issue #26). Load it with
`SkyReelsV2DiffusionForcingPipeline.from_pretrained("assets/models/{card["name"]}")` or
`genalign.policies.load_policy("ar_video", "assets/models/{card["name"]}")` and roll out with
`height=48, width=48, num_frames=8`.

## Recipe

```
{chr(10).join(card["commands"])}
```

A `--videos` pack is `python -m genalign.toy.generators video-pack --out PACK --num-videos N --seed S`
(each stage's N and S: docs/astrolabe.md).

- Data: toy videos of train prompts only (`toy_video_dataset`, categories uniform, 8 frames, 48 px, skia).
- Autoencoder: {vae["steps"]} steps over {len(vae["commands"])} stage(s), L1 + L2 (shape pixels weighted
  x{vae["foreground_weight"]:g}, the last stage's setting) + KL (weight {vae["kl_weight"]:g}), {vae["train_seconds"]:.0f} s;
  reconstruction MAE {vae["reconstruction_mae"]:.4f}; verifier accuracy on renders {vae["render_accuracy"]:.3f},
  on their reconstructions {vae["reconstruction_accuracy"]:.3f} (train prompts, 16 per category).
- Transformer: {card["steps"]} steps, batch {card["batch_size"]}, AdamW, diffusion forcing with a clean
  prefix (flow-matching velocity loss, an independent shifted noise level per block), EMA weights;
  text tower of {card["clip_text"]} frozen.{_reflow_line(card)}{_guidance_line(card)}
- Training time: {card["train_seconds"]:.0f} s for the transformer stages on {_where(card)} (data
  encoding and ODE pairs included), plus the autoencoder's.
- Parameters: {params} (fp32); {card["size_mb"]} MB on disk.

## Verifier accuracy (`toy_video_eval`), 95% intervals stratified by category
{sections}
Small fixed subset (re-scored by `tests/toy/test_toy_ar_video.py`): settings
`{json.dumps(evals["subset"]["settings"])}`, overall {evals["subset"]["overall"]:.4f}, mean fraction of
the checks met {evals["subset"]["mean_fraction"]:.4f}.

Reproduce: `evaluate_video_generator(path, split, per_category, num_per_prompt, seed, steps)` in
`genalign.toy.generators.video_eval`.
"""
    write_card_files(out, card, readme)
