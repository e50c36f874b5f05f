"""`train.fuse_timesteps`: one training update with a minibatch's K noise levels fused into one loss
call, against K calls, side by side on the same rollout batch.

A :class:`~genalign.trainers.Trainer` is built from the demo recipe (``configs/toy/demo.yaml``:
DiffusionNFT on toy-sd-web, 64 samples, minibatches of 16, 3 of the 10 noise levels per sample;
``key=value`` arguments override it), one rollout batch is collected, and ``Trainer.train_step`` is
timed on that cached batch in alternating repeats with ``train.fuse_timesteps`` on (``fused``: one
call on the 48 rows of each minibatch) and off (``unfused``: three calls on 16). Both variants run
the same update (``tests/trainers/test_fuse_timesteps.py`` checks equal gradients); what differs is
how the work is batched, so the ratio says how much of a small model's update is per-call overhead
on this machine. The weights move with every timed update, identically in kind for both variants.

    python benchmarks/fuse_timesteps.py                       # CPU, about a minute
    python benchmarks/fuse_timesteps.py --threads 2 --repeats 7 --json /tmp/fuse.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path

import diffusers
import torch
import transformers
from _timing import compare
from train_step import trainer_update

from genalign.trainers.config import load_recipe
from genalign.trainers.strategies import RolloutBatch
from genalign.trainers.trainer import Trainer, build_trainer

RECIPE = Path(__file__).resolve().parent.parent / "configs" / "toy" / "demo.yaml"


def variant(trainer: Trainer, batch: RolloutBatch, fuse: bool, times: list[float]) -> Callable[[], None]:
    """``train_step.trainer_update`` (``Trainer.train_step(0)`` on the cached ``batch``, its
    ``time_update`` into ``times``) with ``train.fuse_timesteps = fuse``."""
    run = trainer_update(trainer, batch, times)

    def call() -> None:
        trainer.config.train.fuse_timesteps = fuse
        run()

    return call


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="recipe overrides, e.g. train.minibatch_size=32")
    parser.add_argument("--recipe", default=str(RECIPE))
    parser.add_argument("--repeats", type=int, default=5, help="timed pairs (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (the demo uses 2)")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)

    overrides = ["logging.run_dir=/tmp/bench/{name}", "logging.progress=false", *args.overrides]
    config = load_recipe(args.recipe, overrides)
    trainer = build_trainer(config, base_dir=Path(args.recipe).parent)  # prompts.file beside it
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)  # the rollout is done once, outside
    fused_times: list[float] = []
    unfused_times: list[float] = []
    fused = variant(trainer, batch, True, fused_times)
    unfused = variant(trainer, batch, False, unfused_times)
    result = compare(fused, unfused, repeats=args.repeats, warmup=1, device=str(trainer.device))

    train = config.train
    print(
        f"recipe={Path(args.recipe).name} samples={batch.global_batch_size} minibatch={train.minibatch_size} "
        f"timestep_fraction={train.timestep_fraction} loss={train.loss} threads={torch.get_num_threads()} repeats={args.repeats}"
    )
    print(f"{'variant':8s} {'median s':>9s} {'time_update metric':>19s}")
    for name, seconds, own in (
        ("fused", result.measured_median, fused_times[-args.repeats :]),
        ("unfused", result.baseline_median, unfused_times[-args.repeats :]),
    ):
        print(f"{name:8s} {seconds:9.3f} {statistics.median(own):19.3f}")
    print(
        f"fused / unfused: {result.ratio:.3f} (paired {result.paired_ratio:.3f}, noise +-{result.noise:.3f})"
    )
    payload = {"config": vars(args), "device": str(trainer.device), "result": result.to_dict()}
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return payload


if __name__ == "__main__":
    main()
