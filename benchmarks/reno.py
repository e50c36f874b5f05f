"""ReNO cost: seconds per noise-optimisation iteration relative to one plain generation.

One ReNO iteration (Eyring et al., NeurIPS 2024) is a differentiable generation, a reward call and
a backward pass to the initial noise; the paper budgets 20-50 s for 50 iterations on a one-step
model. This benchmark times, side by side in one process (``_timing.compare``, alternating
pairs), ``ReNOPipeline`` with ``--iterations`` iterations against the wrapped pipeline's plain
``__call__`` (no gradients) with the same prompt, steps and guidance, and reports

* ``ratio``: (seconds per ReNO iteration) / (seconds per plain generation);
* peak memory of one ReNO run and of one plain generation (CUDA: allocated; CPU: resident set).

``--model`` picks the architecture (tiny random models of each, one step as the paper runs them):
``lcm`` (LCM, the default), ``sdxl-turbo``, ``flux-schnell``, ``pixart-dmd``, or ``all``. The reward is
a tiny transformers CLIP; about a minute per architecture on CPU. Absolute times on tiny models say
little about real ones; the ratio is the number to read.

    python benchmarks/reno.py
    python benchmarks/reno.py --model all
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
from genalign.tiny.diffusion import flux_pipeline, lcm_pipeline, pixart_pipeline, sdxl_pipeline  # noqa: E402

PROMPT = "a red circle left of a blue square"

# name: (tiny builder, arguments both calls share, arguments only the plain pipeline call takes)
ARCHITECTURES = {
    "lcm": (lambda: lcm_pipeline(seed=0), {"guidance_scale": 1.5}, {}),
    "sdxl-turbo": (lambda: sdxl_pipeline(seed=0), {"guidance_scale": 0.0}, {}),
    "flux-schnell": (
        lambda: flux_pipeline(seed=0, schnell=True),
        {"guidance_scale": 0.0, "height": 32, "width": 32, "max_sequence_length": 256},
        {},
    ),
    "pixart-dmd": (
        lambda: pixart_pipeline(seed=0),
        {"guidance_scale": 1.0, "timesteps": [400]},
        {"use_resolution_binning": False, "clean_caption": False},
    ),
}


def _bench(name: str, reward: object, args: argparse.Namespace) -> None:
    """Time one architecture: ReNO per iteration vs one plain generation; peak memory of each."""
    build, shared, plain_only = ARCHITECTURES[name]
    if args.steps != 1:  # DMD's timestep 400 is its one-step schedule
        shared = {key: value for key, value in shared.items() if key != "timesteps"}
    base = build().to(args.device)
    base.set_progress_bar_config(disable=True)
    pipe = ReNOPipeline.from_pipe(base)
    if args.gradient_checkpointing:
        pipe.enable_gradient_checkpointing()

    def reno() -> object:
        return pipe(
            PROMPT,
            rewards=[reward],
            num_inference_steps=args.steps,
            generator=torch.Generator(args.device).manual_seed(0),
            num_iterations=args.iterations,
            output_type="pt",
            **shared,
        )

    def plain() -> object:
        return base(
            PROMPT,
            num_inference_steps=args.steps,
            generator=torch.Generator(args.device).manual_seed(0),
            output_type="pt",
            **shared,
            **plain_only,
        )

    timing = compare(reno, plain, repeats=args.repeats, device=args.device)
    per_iteration = Comparison([t / args.iterations for t in timing.measured], timing.baseline)
    reno_peak, reno_rise = peak_memory(reno, args.device)
    plain_peak, plain_rise = peak_memory(plain, args.device)
    history = reno().rewards_history[:, 0]

    print(f"\n[{name}] {type(pipe).__name__}")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iterations", type=int, default=5, help="ReNO iterations per timed run")
    parser.add_argument("--steps", type=int, default=1, help="denoising steps of the generator")
    parser.add_argument("--model", default="lcm", choices=[*ARCHITECTURES, "all"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as folder:
        clip_model(seed=0, save_to=Path(folder) / "clip")
        reward = load_reward(
            "clip",
            backend="transformers",
            model=str(Path(folder) / "clip"),
            convention="cosine",
            device=args.device,
        )
    names = list(ARCHITECTURES) if args.model == "all" else [args.model]
    print(f"device={args.device} steps={args.steps} iterations={args.iterations} repeats={args.repeats}")
    for name in names:
        _bench(name, reward, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
