"""ReNO cost: seconds per noise-optimisation iteration relative to one plain generation.

One ReNO iteration (Eyring et al., NeurIPS 2024) is a differentiable generation, a reward call and
a backward pass to the initial noise; the paper budgets 20-50 s for 50 iterations on a one-step
model. This benchmark times, side by side in one process (``_timing.compare``, alternating
pairs), ``ReNOPipeline`` with ``--iterations`` iterations against the wrapped pipeline's plain
``__call__`` (no gradients) with the same prompt, steps and guidance, and reports

* ``ratio``: (seconds per ReNO iteration) / (seconds per plain generation);
* peak memory of one ReNO run and of one plain generation (CUDA: allocated; CPU: resident set).

Defaults: the tiny LCM (``tiny:lcm``) and a tiny transformers CLIP reward, 1 step, on CPU, about a
minute. Absolute times on tiny models say little about real ones; the ratio is the number to read.

    python benchmarks/reno.py
    python benchmarks/reno.py --device cuda --iterations 10 --repeats 7 --gradient-checkpointing
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import Comparison, compare, peak_memory  # noqa: E402

from genalign.pipelines import ReNOPipeline  # noqa: E402
from genalign.rewards import load_reward  # noqa: E402
from genalign.tiny.clip import clip_model  # noqa: E402
from genalign.tiny.diffusion import lcm_pipeline  # noqa: E402

PROMPT = "a red circle left of a blue square"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iterations", type=int, default=5, help="ReNO iterations per timed run")
    parser.add_argument("--steps", type=int, default=1, help="denoising steps of the generator")
    parser.add_argument("--guidance-scale", type=float, default=1.5, help="LCM embedded guidance")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory() as folder:
        base = lcm_pipeline(seed=0).to(args.device)
        clip_model(seed=0, save_to=Path(folder) / "clip")
        reward = load_reward(
            "clip",
            backend="transformers",
            model=str(Path(folder) / "clip"),
            convention="cosine",
            device=args.device,
        )
    pipe = ReNOPipeline.from_pipe(base)
    if args.gradient_checkpointing:
        pipe.enable_gradient_checkpointing()

    def reno() -> object:
        return pipe(
            PROMPT,
            rewards=[reward],
            num_inference_steps=args.steps,
            guidance_scale=args.guidance_scale,
            generator=torch.Generator(args.device).manual_seed(0),
            num_iterations=args.iterations,
            output_type="pt",
        )

    def plain() -> object:
        return base(
            PROMPT,
            num_inference_steps=args.steps,
            guidance_scale=args.guidance_scale,
            generator=torch.Generator(args.device).manual_seed(0),
            output_type="pt",
        )

    timing = compare(reno, plain, repeats=args.repeats, device=args.device)
    per_iteration = Comparison([t / args.iterations for t in timing.measured], timing.baseline)
    reno_peak, reno_rise = peak_memory(reno, args.device)
    plain_peak, plain_rise = peak_memory(plain, args.device)
    history = reno().rewards_history[:, 0]

    print(f"device={args.device} steps={args.steps} iterations={args.iterations} repeats={args.repeats}")
    print(f"{'':24s} {'ms':>9s} {'peak MiB':>10s} {'rise MiB':>10s}")
    print(
        f"{'ReNO, per iteration':24s} {per_iteration.measured_median * 1e3:9.1f} {reno_peak:10.1f} {reno_rise:10.1f}"
    )
    print(
        f"{'plain generation':24s} {per_iteration.baseline_median * 1e3:9.1f} {plain_peak:10.1f} {plain_rise:10.1f}"
    )
    print(
        f"ratio (ReNO iteration / plain generation): {per_iteration.ratio:.2f} "
        f"(paired {per_iteration.paired_ratio:.2f}, noise +-{per_iteration.noise:.2f})"
    )
    print(f"reward: {history[0]:.4f} -> best {history.max():.4f} over {len(history)} iterations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
