"""The ``genalign`` command line: ``genalign list | sample | ...``.

This module is the only place that prints: library code logs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

# Pipeline classes (as written in a model folder's model_index.json) and their policy family.
PIPELINE_FAMILIES = {
    "StableDiffusionPipeline": "sd",
    "StableDiffusionXLPipeline": "sd",
    "StableDiffusion3Pipeline": "flow",
    "FluxPipeline": "flow",
    "SanaPipeline": "flow",
    "LatentConsistencyModelPipeline": "consistency",
}


def detect_family(model: str) -> str:
    """The policy family of a hub id or local folder, read from its ``model_index.json``."""
    from diffusers import DiffusionPipeline

    class_name = DiffusionPipeline.load_config(model)["_class_name"]
    if class_name not in PIPELINE_FAMILIES:
        known = ", ".join(sorted(PIPELINE_FAMILIES))
        raise SystemExit(
            f"cannot tell the family of {model} ({class_name}); pass --family. Known pipelines: {known}"
        )
    return PIPELINE_FAMILIES[class_name]


def cmd_list(args: argparse.Namespace) -> int:
    from genalign.policies import list_policies

    sections = {"policy families": list_policies()}
    try:
        from genalign.rewards import list_rewards

        sections["rewards"] = list_rewards()
    except ImportError:  # pragma: no cover - rewards always import in a full install
        pass
    try:
        from genalign.trainers import list_trainers

        sections.update(list_trainers())
    except ImportError:
        pass
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
    prompts = args.prompt
    trajectory = policy.rollout(
        prompts,
        num_inference_steps=args.steps,
        guidance_scale=args.guidance_scale,
        eta=args.eta,
        noise_level=args.noise_level,
        mode=args.mode,
        group_size=args.num_images,
        generator=torch.Generator().manual_seed(args.seed),
        height=args.height,
        width=args.width,
    )
    paths = save_images(trajectory.images, args.out)
    print(f"wrote {len(paths) - 1} images and a grid to {args.out}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from genalign.trainers.config import load_recipe
    from genalign.trainers.trainer import build_trainer

    config = load_recipe(args.config, args.overrides)
    trainer = build_trainer(config, base_dir=Path(args.config).parent)
    main_process = trainer.is_main_process
    if main_process:
        print(f"run folder: {trainer.run_dir}")
    history = trainer.train()
    if main_process:
        applied = [m for m in history if not m.get("skipped")]
        if applied:
            first, last = applied[0], applied[-1]
            print(
                f"mean reward: step {first['step']}: {first['reward_mean']:.4f} +- {first['reward_stderr']:.4f}  ->  "
                f"step {last['step']}: {last['reward_mean']:.4f} +- {last['reward_stderr']:.4f}"
            )
        print(f"run folder: {trainer.run_dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genalign", description="Align image, SVG and video generators with reward models."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list registered policy families, rewards and trainers")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("train", help="fine-tune a generator with RL from a YAML recipe")
    p.add_argument("config", help="recipe YAML, e.g. configs/tiny/ddpo_jpeg.yaml")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.num_steps=20")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sample", help="sample images from a model (hub id or local folder)")
    p.add_argument("model", help="hub id, local diffusers folder, or tiny:NAME (offline tiny model)")
    p.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several)")
    p.add_argument("--out", required=True, help="output folder for PNGs and grid.png")
    p.add_argument("--family", default=None, help="policy family (default: read from model_index.json)")
    p.add_argument("--num-images", type=int, default=1, help="images per prompt")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (family default if omitted)")
    p.add_argument("--guidance-scale", type=float, default=None)
    p.add_argument("--eta", type=float, default=0.0, help="DDIM eta for the sd family (0 = deterministic)")
    p.add_argument("--noise-level", type=float, default=0.0, help="flow SDE noise level")
    p.add_argument("--mode", default="ode", choices=["ode", "sde", "cps"], help="flow sampler")
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if _cuda() else "cpu")
    p.add_argument("--dtype", default=None, help="e.g. float16, bfloat16")
    p.set_defaults(func=cmd_sample)
    return parser


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, KeyError) as error:  # ConfigError is a ValueError
        print(f"genalign: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
