"""Rollout overhead: ``policy.rollout`` (log-probs recorded) vs the plain diffusers ``__call__``.

For each family's tiny model (``genalign.tiny``), the policy and the pipeline share the very same
modules and draw the same initial noise from the same per-sample seeds, with the noise-free
sampler where one exists so both do the same work: DDIM with ``eta=0`` (sd, sdxl: the pipeline's
scheduler is swapped for DDIM too) and the Euler ODE (``mode="ode"``: sd3, flux, sana). A
consistency model has no noise-free multistep sampler, so lcm runs stochastic on both sides, with
the same per-sample generators. Both return ``[B, 3, H, W]`` tensors (``output_type="pt"``, no
progress bar); ``max|dimg|`` is the largest difference between their images, the check that
they computed the same thing.

The two are timed in alternating repeats in one process (``_timing.compare``); the ratio of
median times rollout / pipeline is the cost of what a rollout adds (per-sample generators,
kept latents, step log-probs) and should be at most 1.10. Where it is not, a cProfile of both
sides lists the functions whose self time differs the most.

    python benchmarks/rollout.py                               # all families, CPU, ~2-3 minutes
    python benchmarks/rollout.py --families sd flux --repeats 9 --json /tmp/rollout.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from _timing import Comparison, compare, profile_difference

from genalign.policies import ConsistencyPolicy, DiffusionPolicy, FlowPolicy, SDPolicy
from genalign.tiny import diffusion as tiny

PROMPTS = ["a red circle", "a blue square", "a green triangle", "a yellow star left of a purple square"]
TARGET = 1.10


def _ddim(pipe: Any) -> Any:
    """Give the pipeline the DDIM scheduler the sd policy samples with."""
    from diffusers import DDIMScheduler

    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    return pipe


@dataclass
class Family:
    """How to build one family's tiny model and call its policy and pipeline alike."""

    build: Callable[[], Any]
    policy: type[DiffusionPolicy]
    rollout_kwargs: dict[str, Any] = field(default_factory=dict)
    pipeline_kwargs: dict[str, Any] = field(default_factory=dict)
    size: int | None = None  # image side in px (None: the model's default)


FAMILIES: dict[str, Family] = {
    "sd": Family(lambda: _ddim(tiny.sd_pipeline()), SDPolicy, {"eta": 0.0}, {"eta": 0.0}),
    "sdxl": Family(lambda: _ddim(tiny.sdxl_pipeline()), SDPolicy, {"eta": 0.0}, {"eta": 0.0}),
    "sd3": Family(tiny.sd3_pipeline, FlowPolicy, {"mode": "ode"}),
    "flux": Family(tiny.flux_pipeline, FlowPolicy, {"mode": "ode"}, size=32),
    "sana": Family(
        tiny.sana_pipeline, FlowPolicy, {"mode": "ode"}, {"use_resolution_binning": False}, size=32
    ),
    "lcm": Family(tiny.lcm_pipeline, ConsistencyPolicy),
}


def make_calls(
    family: Family, pipe: Any, policy: DiffusionPolicy, batch_size: int, steps: int, device: str
) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
    """(rollout, pipeline call): same prompts, steps, guidance, size and per-sample seeds."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch_size)]
    seeds = torch.arange(batch_size) + 1000
    guidance_scale = policy.default_guidance_scale
    size = {"height": family.size, "width": family.size} if family.size else {}

    def rollout() -> torch.Tensor:
        trajectory = policy.rollout(
            prompts, steps, guidance_scale, seeds=seeds, **size, **family.rollout_kwargs
        )
        return trajectory.images

    def pipeline() -> torch.Tensor:
        generators = [torch.Generator(device).manual_seed(int(s)) for s in seeds]
        return pipe(
            prompts,
            num_inference_steps=steps,
            guidance_scale=guidance_scale,
            generator=generators,
            output_type="pt",
            **size,
            **family.pipeline_kwargs,
        ).images

    return rollout, pipeline


def run_family(name: str, args: argparse.Namespace) -> Comparison:
    family = FAMILIES[name]
    pipe = family.build()
    pipe.set_progress_bar_config(disable=True)
    policy = family.policy.from_pipe(pipe, train=False, device=args.device)
    rollout, pipeline = make_calls(family, pipe, policy, args.batch_size, args.steps, args.device)
    with torch.no_grad():
        difference = (rollout().float() - pipeline().float().to(args.device)).abs().max().item()
        result = compare(rollout, pipeline, repeats=args.repeats, warmup=1, device=args.device)
        result.extras["max_image_difference"] = difference
        if args.profile == "all" or (args.profile == "auto" and result.ratio > TARGET):
            result.extras["profile"] = profile_difference(rollout, pipeline)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--repeats", type=int, default=7, help="timed pairs per family (median reported)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (tiny models: 1 is steadiest)"
    )
    parser.add_argument(
        "--profile",
        choices=["auto", "all", "off"],
        default="auto",
        help="cProfile families over target (auto), all, or none",
    )
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()

    print(
        f"device={args.device} batch={args.batch_size} steps={args.steps} repeats={args.repeats} "
        f"threads={torch.get_num_threads()} target<={TARGET:.2f}"
    )
    header = (
        f"{'family':8s} {'rollout ms':>11s} {'pipeline ms':>12s} {'ratio':>7s} {'paired':>7s} {'noise':>6s} "
        f"{'max|dimg|':>10s}"
    )
    print(header)
    results: dict[str, Comparison] = {}
    for name in args.families:
        result = results[name] = run_family(name, args)
        flag = "" if result.ratio <= TARGET else "  > target"
        print(
            f"{name:8s} {result.measured_median * 1e3:11.1f} {result.baseline_median * 1e3:12.1f} "
            f"{result.ratio:7.3f} {result.paired_ratio:7.3f} {result.noise:6.3f} {result.extras['max_image_difference']:10.2e}{flag}",
            flush=True,
        )
    for name, result in results.items():
        if "profile" in result.extras:
            print(f"\n{name}: where the rollout's extra time goes\n{result.extras['profile']}")
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if args.json:
        payload = {"config": {k: v for k, v in vars(args).items() if k != "json"}, "target": TARGET}
        payload["families"] = {name: result.to_dict() for name, result in results.items()}
        with open(args.json, "w") as handle:
            json.dump(payload, handle, indent=2)


if __name__ == "__main__":
    main()
