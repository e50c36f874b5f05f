"""The ``genalign`` command line: ``genalign list | sample | ...``.

This module is the only place that prints: library code logs.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from genalign.cli_errors import describe_error
from genalign.trainers.model_config import DTYPES

logger = logging.getLogger(__name__)


def _same_named(args: argparse.Namespace, names: Sequence[str], given_only: bool = False) -> dict:
    """The options ``names`` as keyword arguments of the function they are named after (dashes on
    the command line, underscores here, as argparse stores them); ``given_only``: only those not
    None, so an unset option keeps the function's default."""
    options = {name: getattr(args, name) for name in names}
    return {k: v for k, v in options.items() if v is not None} if given_only else options


def detect_family(model: str) -> str:
    """The policy family of a hub id or local folder, read from its ``model_index.json`` and the
    table of model families (:data:`genalign.pipelines.families.MODEL_FAMILIES`)."""
    from diffusers import DiffusionPipeline

    from genalign.pipelines.families import policy_families

    families = policy_families()
    class_name = DiffusionPipeline.load_config(model)["_class_name"]
    if class_name not in families:
        known = ", ".join(sorted(families))
        raise SystemExit(
            f"cannot tell the family of {model} ({class_name}); pass --family. Known pipelines: {known}"
        )
    return families[class_name]


def cmd_list(args: argparse.Namespace) -> int:
    from genalign.policies import list_policies
    from genalign.rewards import list_rewards
    from genalign.trainers import list_trainers

    sections = {"policy families": list_policies(), "rewards": list_rewards(), **list_trainers()}
    for title, names in sections.items():
        print(f"{title}:")
        for name in names:
            print(f"  {name}")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    import torch

    from genalign.policies import load_policy
    from genalign.tiny.materialize import materialize
    from genalign.utils.images import save_images

    model = materialize(args.model)
    family = args.family or detect_family(model)
    policy = load_policy(family, model, train=False, device=args.device, dtype=args.dtype)
    same_names = ("eta", "noise_level", "mode", "height", "width")  # options named as rollout names them
    trajectory = policy.rollout(
        args.prompt,
        num_inference_steps=args.steps,
        guidance_scale=args.guidance_scale,
        group_size=args.num_images,
        generator=torch.Generator().manual_seed(args.seed),
        **_same_named(args, same_names),
    )
    paths = save_images(trajectory.images, args.out)
    print(f"wrote {len(paths) - 1} images and a grid to {args.out}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from genalign.trainers.config import load_recipe

    config = load_recipe(args.config, args.overrides)  # a mistyped key fails before the model libraries load
    from genalign.trainers.distributed import release_process_group
    from genalign.trainers.trainer import build_trainer

    trainer = build_trainer(config, base_dir=Path(args.config).parent)
    main_process = trainer.is_main_process
    if main_process:
        print(f"run folder: {trainer.run_dir}")
    history = trainer.train()
    release_process_group(trainer.accelerator)  # not after an error: a barrier could wait forever
    if main_process:
        applied = [m for m in history if not m.get("skipped")]
        if applied:
            first, last = applied[0], applied[-1]
            print(
                f"mean reward: step {first['step']}: {first['reward_mean']:.4f} +- {first['reward_stderr']:.4f}  ->  "
                f"step {last['step']}: {last['reward_mean']:.4f} +- {last['reward_stderr']:.4f}"
            )
        print(f"run folder: {trainer.run_dir}")
    if trainer.interrupted is not None:  # SIGTERM / Ctrl-C: the shell's convention, 128 + signal
        if main_process:
            print(
                f"interrupted after step {trainer.step - 1}: checkpoint saved; continue with "
                "logging.resume=latest"
            )
        return 128 + int(trainer.interrupted)
    ran = [m for m in history if m.get("step", -1) >= 0]
    if ran and all(m.get("skipped") for m in ran):  # nothing reached the weights: not a success
        print(f"genalign: error: every step was skipped ({ran[0].get('skip_reason', '?')})", file=sys.stderr)
        return 2
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from genalign.toy.demo import DEFAULT_RECIPE, DemoInterrupted, run_demo

    overrides = list(args.overrides)
    if args.config is not None and "=" in args.config and not Path(args.config).exists():
        overrides.insert(0, args.config)  # `genalign demo key=value ...` with the default recipe
        args.config = None
    recipe = args.config or DEFAULT_RECIPE
    print(f"recipe: {recipe}", flush=True)
    options = ("eval_every", "oracle", "rl_heldout_images", "rl_train_images", "unseen_images")
    try:
        result = run_demo(recipe, overrides, **_same_named(args, options, given_only=True))
    except DemoInterrupted as stopped:  # SIGTERM / Ctrl-C: the shell's convention, 128 + signal
        print(f"genalign demo: {stopped}", file=sys.stderr)
        return 128 + stopped.signal
    for name, evaluation in result.evaluations.items():
        change, low, high = evaluation.interval()
        print(
            f"{name} ShapesEval: {evaluation.before['overall']:.1%} -> {evaluation.after['overall']:.1%} "
            f"(change {100 * change:+.1f} pts, 95% CI [{100 * low:+.1f}, {100 * high:+.1f}])"
        )
    print(f"reward hacking check: {result.hacking.verdict}")
    print(f"report: {result.report}")
    print(f"run folder: {result.run_dir}")
    return 0


def cmd_eval_reward(args: argparse.Namespace) -> int:
    from genalign.rewards.evaluation.data import load_eval_dataset, parse_columns
    from genalign.rewards.evaluation.run import EvalConfig, evaluate_rewards, parse_reward_specs

    dataset = load_eval_dataset(
        args.data,
        args.task,
        columns=parse_columns(args.columns),
        preset=args.preset,
        split=args.split,
        image_root=args.image_root,
    )
    specs = parse_reward_specs(args.reward, args.reward_arg)
    same_names = "batch_size bootstrap seed image_size tie_threshold temperature cluster_by".split()
    config = EvalConfig(progress=not args.no_progress, **_same_named(args, same_names))
    summary = evaluate_rewards(dataset, specs, args.out, config)
    print((Path(args.out) / "report.md").read_text(encoding="utf-8"))
    failed = sum(entry["n_failed"] for entry in summary["rewards"].values())
    if failed:
        logger.warning("%d (reward, sample) scores failed; see report.md", failed)
    print(f"wrote scores.jsonl, summary.json, report.md and plots to {args.out}")
    nothing = [key for key, entry in summary["rewards"].items() if entry["n_scored"] == 0]
    if nothing:  # no metric exists: a script must not read this run as a result
        for key in nothing:
            first = (summary["rewards"][key].get("failures") or [{}])[0]
            reason = f" (first failure: {first.get('line', '?')}: {first.get('error', '?')})" if first else ""
            print(
                f"genalign: error: {key} scored none of {summary['n_samples']} samples{reason}",
                file=sys.stderr,
            )
        return 1
    return 0


def cmd_eval_svg(args: argparse.Namespace) -> int:
    from genalign.toy.svg_eval import EVAL_SEED, evaluate_svg_writers, format_report, parse_models

    if args.seed is None:  # not a parser default, so that --help imports nothing heavy
        args.seed = EVAL_SEED
    same_names = ("count", "seed", "split", "task", "temperature", "max_new_tokens")
    report = evaluate_svg_writers(parse_models(args.models), **_same_named(args, same_names))
    print(format_report(report))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


def _reward_spec(rewards: Sequence[str], reward_args: Sequence[str]) -> dict[str, tuple[float, dict]]:
    """``--reward NAME=WEIGHT`` and ``--reward-arg NAME.key=value`` -> ``{name: (weight, kwargs)}``."""
    import yaml

    spec: dict[str, tuple[float, dict]] = {}
    for item in rewards:
        name, _, weight = item.partition("=")
        spec[name.strip()] = (float(weight) if weight else 1.0, {})
    for item in reward_args:
        key, _, value = item.partition("=")
        name, _, option = key.partition(".")
        if name not in spec or not option or not _:
            raise ValueError(f"--reward-arg {item!r}: expected NAME.key=value for a NAME given with --reward")
        spec[name][1][option] = yaml.safe_load(value)
    return spec


def cmd_reno(args: argparse.Namespace) -> int:
    import torch

    from genalign.pipelines import RENO_REWARD_WEIGHTS, ReNOPipeline
    from genalign.tiny.materialize import materialize
    from genalign.utils.images import save_images

    pipe = ReNOPipeline.from_pretrained(materialize(args.model)).to(args.device)
    pipe.set_progress_bar_config(disable=True)
    if args.gradient_checkpointing:
        pipe.enable_gradient_checkpointing()
    rewards = _reward_spec(args.reward, args.reward_arg) if args.reward else None
    out = pipe(
        args.prompt,
        rewards=rewards,
        num_inference_steps=args.steps,
        guidance_scale=args.guidance_scale,
        generator=torch.Generator(args.device).manual_seed(args.seed),
        num_iterations=args.iterations,
        learning_rate=args.lr,
        regularization_weight=args.reg_weight,
        max_grad_norm=args.grad_clip if args.grad_clip > 0 else None,
        optimizer=args.optimizer,
        height=args.height,
        width=args.width,
        output_type="pt",
    )
    paths = save_images(out.images, args.out)
    history = out.rewards_history
    print(f"rewards: {', '.join(rewards or RENO_REWARD_WEIGHTS)}")
    for i, prompt in enumerate(args.prompt):
        print(
            f"{prompt!r}: reward {history[0, i]:.4f} -> best {history[:, i].max():.4f} "
            f"(iteration {int(out.best_iteration[i])} of {len(history)})"
        )
    print(f"wrote {len(paths) - 1} images and a grid to {args.out}")
    return 0


def cmd_rlg(args: argparse.Namespace) -> int:
    import torch

    from genalign.pipelines import RLGPipeline
    from genalign.policies.model_folder import looks_like_local_path
    from genalign.tiny.materialize import materialize
    from genalign.utils.images import save_images

    pipe = RLGPipeline.from_pretrained(materialize(args.base)).to(args.device)
    pipe.set_progress_bar_config(disable=True)
    if looks_like_local_path(args.rl_lora) and not Path(args.rl_lora).exists():  # not a hub repo id
        raise FileNotFoundError(f"--rl-lora {args.rl_lora} does not exist")
    pipe.load_rl_lora(args.rl_lora)
    kwargs = {"num_inference_steps": args.steps} if args.steps else {}
    if args.guidance_scale is not None:
        kwargs["guidance_scale"] = args.guidance_scale
    out = pipe(
        args.prompt,
        rlg_scale=args.rlg_scale,
        num_images_per_prompt=args.num_images,
        generator=torch.Generator(args.device).manual_seed(args.seed),
        height=args.height,
        width=args.width,
        output_type="pt",
        **kwargs,
    )
    paths = save_images(out.images, args.out)
    print(f"wrote {len(paths) - 1} images (rlg_scale={args.rlg_scale}) and a grid to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genalign", description="Align image, SVG and video generators with reward models."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_subcommand in (
        _add_list,
        _add_train,
        _add_demo,
        _add_sample,
        _add_eval_reward,
        _add_eval_svg,
        _add_reno,
        _add_rlg,
        _add_convert_ar_video,
    ):
        add_subcommand(sub)
    return parser


def _add_list(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list registered policy families, rewards and trainers")
    p.set_defaults(func=cmd_list)


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="fine-tune a generator with RL from a YAML recipe")
    p.add_argument("config", help="recipe YAML, e.g. configs/tiny/ddpo_jpeg.yaml")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.num_steps=20")
    p.set_defaults(func=cmd_train)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="offline toy-world demo: evaluate a toy generator, RL-train it on a learned reward, "
        "evaluate again with the ShapesEval verifier and write a report",
    )
    p.add_argument("config", nargs="?", default=None, help="demo recipe (default: configs/toy/demo.yaml)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.num_steps=20")
    p.add_argument(
        "--rl-heldout-images",
        type=int,
        default=None,
        help="images per evaluation of the RL-held-out prompts, the headline, spread over categories (default 648)",
    )
    p.add_argument(
        "--rl-train-images",
        type=int,
        default=None,
        help="images per evaluation of the RL-train prompts (default 324)",
    )
    p.add_argument(
        "--unseen-images",
        type=int,
        default=None,
        help="images per evaluation of the unseen combinations (default 324)",
    )
    p.add_argument(
        "--eval-every", type=int, default=0, help="RL-held-out evaluation every N steps (0: start and end)"
    )
    p.add_argument(
        "--oracle",
        choices=("correct", "partial", "mixed"),
        default=None,
        help="control run: train on the ShapesEval verifier itself (0/1, fraction of checks, or 0/1 plus "
        "half the fraction), the upper bound of what a learned reward could give the recipe",
    )
    p.set_defaults(func=cmd_demo)


def _add_prompts_and_out(p: argparse.ArgumentParser) -> None:
    """``--prompt`` (repeatable) and ``--out``: what every image-writing command takes."""
    p.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several)")
    p.add_argument("--out", required=True, help="output folder for PNGs and grid.png")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _add_size_seed_device(p: argparse.ArgumentParser, size_help: str | None = None) -> None:
    """``--height``, ``--width``, ``--seed`` and ``--device``."""
    p.add_argument("--height", type=int, default=None, help=size_help and f"image height ({size_help})")
    p.add_argument("--width", type=int, default=None, help=size_help and f"image width ({size_help})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")


def _add_sample(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample", help="sample images from a model (hub id or local folder)")
    p.add_argument("model", help="hub id, local diffusers folder, or tiny:NAME (offline tiny model)")
    _add_prompts_and_out(p)
    p.add_argument("--family", default=None, help="policy family (default: read from model_index.json)")
    p.add_argument("--num-images", type=_positive_int, default=1, help="images per prompt")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (family default if omitted)")
    p.add_argument("--guidance-scale", type=float, default=None)
    p.add_argument("--eta", type=float, default=0.0, help="DDIM eta for the sd family (0 = deterministic)")
    p.add_argument("--noise-level", type=float, default=0.0, help="flow SDE noise level")
    p.add_argument("--mode", default="ode", choices=["ode", "sde", "cps"], help="flow sampler")
    _add_size_seed_device(p)
    p.add_argument("--dtype", default=None, choices=DTYPES, help="weights' dtype (default: the model's)")
    p.set_defaults(func=cmd_sample)


def _add_eval_reward(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval-reward",
        help="evaluate reward models against human preferences, rankings or MOS",
        description="Score a human-judgement data set with rewards and report agreement "
        "(preference accuracy under tie policies, HPS v2 inversion score, SRCC/KRCC/PLCC) "
        "with bootstrap intervals. Layouts and presets: genalign/rewards/evaluation/data.py.",
    )
    p.add_argument(
        "--reward", action="append", required=True, help="reward name(s), comma-separated or repeated"
    )
    p.add_argument(
        "--reward-arg",
        action="append",
        default=[],
        help="reward keyword k=v (YAML value) for every reward, or NAME.k=v for one reward",
    )
    p.add_argument(
        "--data", required=True, help="JSONL / JSON / CSV / Parquet file or a saved datasets folder"
    )
    p.add_argument("--task", required=True, choices=["preference", "ranking", "mos"])
    p.add_argument("--out", required=True, help="output folder (cache/ inside it makes runs resumable)")
    p.add_argument(
        "--columns",
        action="append",
        default=[],
        help="name=column mappings, e.g. prompt=caption,image_0=jpg_0",
    )
    p.add_argument("--preset", default=None, help="pickapic | hpdv2 | imagereward | imagereward-db | koniq")
    p.add_argument("--split", default=None, help="split of a datasets folder holding several")
    p.add_argument(
        "--image-root", default=None, help="folder for relative image paths (default: the data file's)"
    )
    p.add_argument("--batch-size", type=int, default=16, help="images per reward call")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (0: no intervals)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-size", type=int, default=None, help="resize images to this square side")
    p.add_argument(
        "--tie-threshold", type=float, default=None, help="fixed PickScore tie threshold (default: tuned)"
    )
    p.add_argument("--temperature", type=float, default=1.0, help="softmax temperature for PickScore")
    cluster_help = (
        "intervals resample clusters of rows sharing FIELD: prompt, category, id (default: cluster)"
    )
    p.add_argument("--cluster-by", default=None, metavar="FIELD", help=cluster_help)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=cmd_eval_reward)


def _add_eval_svg(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval-svg",
        help="evaluate SVG writers on held-out toy scenes (fidelity, validity, ShapesEval, hacking check)",
        description="One completion per held-out toy scene for each model; svg_fidelity terms, pixel "
        "MSE, SSIM, validity, length ratio and ShapesEval on the render with 95%% intervals; paired "
        "changes and a reward-hacking check between consecutive models (genalign/toy/svg_eval.py).",
    )
    p.add_argument(
        "models", nargs="+", help="LABEL=PATH or PATH: a model folder, tiny:NAME or a checkpoint folder"
    )
    p.add_argument("--count", type=int, default=256, help="held-out scenes")
    p.add_argument(
        "--seed", type=int, default=None, help="scene seed (default: the held-out set's, svg_eval.EVAL_SEED)"
    )
    p.add_argument("--split", default="rl_heldout", help="toy prompt split of the scenes")
    p.add_argument("--task", default="image_to_svg", choices=["image_to_svg", "text_to_svg"])
    p.add_argument("--temperature", type=float, default=0.01, help="sampling temperature (0.01: ~greedy)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--out", default=None, help="write the full report as JSON here")
    p.set_defaults(func=cmd_eval_svg)


def _add_reno(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reno", help="ReNO: optimise the initial noise of a one-step model for rewards")
    p.add_argument(
        "model",
        help="hub id or local diffusers folder (sd-turbo, LCM, sdxl-turbo, FLUX.1-schnell, PixArt-alpha DMD), "
        "or tiny:lcm / tiny:sdxl / tiny:flux / tiny:pixart",
    )
    _add_prompts_and_out(p)
    p.add_argument(
        "--reward",
        action="append",
        default=[],
        help="NAME=WEIGHT, repeated (default: the paper's ensemble, hpsv2=5 pickscore=0.05 and clip=0.01 "
        "as ReNO's CLIP logit on the LAION ViT-H/14: RENO_REWARD_KWARGS)",
    )
    p.add_argument(
        "--reward-arg", action="append", default=[], help="NAME.key=value (YAML value) for one reward"
    )
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--lr", type=float, default=5.0)
    p.add_argument("--reg-weight", type=float, default=0.01, help="lambda of the noise-norm regulariser")
    p.add_argument("--grad-clip", type=float, default=0.1, help="gradient-norm clip (<= 0 disables)")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p.add_argument("--steps", type=_positive_int, default=1, help="denoising steps of the generator")
    p.add_argument(
        "--guidance-scale",
        type=float,
        default=None,
        help="default: 0 (one-step models), LCM 8.5, FLUX.1-dev 3.5",
    )
    p.add_argument("--gradient-checkpointing", action="store_true")
    _add_size_seed_device(p, size_help="default: the model's native size; FLUX 512, as ReNO's code")
    p.set_defaults(func=cmd_reno)


def _add_rlg(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rlg", help="RLG: sample mixing a base model and its RL-tuned LoRA")
    p.add_argument(
        "base", help="hub id or local diffusers folder (SD, SDXL, SD3, FLUX, SANA) or tiny:sd, tiny:sdxl, ..."
    )
    p.add_argument("--rl-lora", required=True, help="the RL-tuned LoRA (file or folder, diffusers format)")
    p.add_argument("--rlg-scale", type=float, default=1.0, help="w: 0 base, 1 RL-tuned, > 1 extrapolate")
    _add_prompts_and_out(p)
    p.add_argument("--num-images", type=_positive_int, default=1, help="images per prompt")
    p.add_argument(
        "--steps", type=_positive_int, default=None, help="denoising steps (pipeline default if omitted)"
    )
    p.add_argument("--guidance-scale", type=float, default=None)
    _add_size_seed_device(p)
    p.set_defaults(func=cmd_rlg)


def _add_convert_ar_video(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert-ar-video",
        help="turn a Self-Forcing / Causal Forcing / LongLive checkpoint into an ar_video model folder",
    )
    p.add_argument("checkpoint", help="the official .pt (or .safetensors) holding the causal Wan DiT")
    p.add_argument("--out", required=True, help="the model folder to write (model.path of a recipe)")
    p.add_argument(
        "--base",
        default=None,
        help="diffusers Wan2.1 folder for the VAE, text encoder, config (default: the hub's Wan2.1-T2V-1.3B)",
    )
    p.add_argument("--block", type=int, default=3, help="latent frames per block (num_frame_per_block)")
    p.add_argument(
        "--key", default=None, help="checkpoint entry with the weights (default: generator_ema, generator)"
    )
    p.add_argument("--dtype", default=None, choices=DTYPES)
    p.set_defaults(func=cmd_convert_ar_video)


def cmd_convert_ar_video(args: argparse.Namespace) -> int:
    import torch

    from genalign.policies.ar_video_convert import WAN_T2V_1_3B, convert_causal_wan

    dtype = getattr(torch, args.dtype) if args.dtype else None
    base = args.base or WAN_T2V_1_3B
    out = convert_causal_wan(args.checkpoint, args.out, base, args.block, args.key, dtype)
    print(f"wrote {out} (load it with model.family: ar_video, model.path: {out})")
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def parse_command_line(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``, letting ``key=value`` overrides sit before, between or after a command's
    options (``genalign demo recipe.yaml --eval-every 50 train.seed=1``): argparse alone stops
    collecting a ``nargs="*"`` positional at the first option and rejects what follows."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in argv:  # every error message suggests it: after the subcommand too
        argv = ["--debug", *(a for a in argv if a != "--debug")]
    args, extras = parser.parse_known_args(argv)
    stray = [e for e in extras if e.startswith("-") or "=" not in e or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extras:
        args.overrides = [*(args.overrides or []), *extras]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from genalign.utils.quiet import silence_startup_noise

    silence_startup_noise()  # before any command imports diffusers / transformers
    parser = build_parser()
    args = parse_command_line(parser, argv)
    if getattr(args, "device", "") is None:  # resolved here, not in the parser: --help needs no torch
        args.device = "cuda" if _cuda() else "cpu"
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("genalign: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # every error is one line; --debug shows the traceback
        if args.debug:
            raise
        print(f"genalign: error: {describe_error(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
