"""Held-out verifier accuracy of toy-ar-video before and after the toy Astrolabe recipe, per seed.

Issue #26's target: +10 points of RL-held-out accuracy (the video verifier, ``toy_video_eval``)
within 15 CPU-minutes of Astrolabe (``configs/toy/astrolabe_video.yaml``). Each seed trains the
recipe with ``train.seed=SEED`` and scores the same (prompt, seed) videos of the RL-held-out prompts
before and after (``genalign.toy.generators.video_eval``); the change's 95% interval is paired and
stratified by category (``genalign.toy.evaluation.paired_change_interval``). One JSON line per seed
is appended to ``--out/results.jsonl``::

    python benchmarks/toy_astrolabe_video.py --seeds 0 1 2 --out runs/astrolabe-video train.num_steps=60
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RECIPE = ROOT / "configs" / "toy" / "astrolabe_video.yaml"


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    from genalign.toy.evaluation import paired_change_interval
    from genalign.toy.generators.video_eval import evaluate_video_generator
    from genalign.trainers.config import load_recipe
    from genalign.trainers.trainer import build_trainer

    overrides = [f"train.seed={seed}", f"name=seed{seed}", f"logging.run_dir={args.out}/runs/{{name}}"]
    config = load_recipe(args.recipe, [*overrides, *args.overrides])
    torch.manual_seed(seed)
    trainer = build_trainer(config, base_dir=Path(args.recipe).parent)
    evaluate = {  # the recipe's own rollout: its steps per block
        "split": "rl_heldout",
        "num_per_prompt": args.eval_per_prompt,
        "keep_per_video": True,
        "steps": int(config.sampling.num_inference_steps),
    }
    before = evaluate_video_generator(trainer.policy, **evaluate)
    start = time.perf_counter()
    history = trainer.train()
    seconds = time.perf_counter() - start
    after = evaluate_video_generator(trainer.policy, **evaluate)
    change, low, high = paired_change_interval(before["correct"], after["correct"], before["categories"])
    return {
        "seed": seed,
        "overrides": list(args.overrides),
        "videos": len(before["correct"]),
        "before": before["overall"],
        "after": after["overall"],
        "change": change,
        "change_ci": [low, high],
        "per_category_before": before["per_category"],
        "per_category_after": after["per_category"],
        "steps": len(history),
        "train_seconds": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("overrides", nargs="*", help="recipe overrides, key=value")
    parser.add_argument("--recipe", default=str(RECIPE))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-per-prompt", type=int, default=2, help="videos per RL-held-out prompt")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "astrolabe-video")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        result = run_seed(seed, args)
        with (args.out / "results.jsonl").open("a") as handle:
            handle.write(json.dumps(result) + "\n")
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
