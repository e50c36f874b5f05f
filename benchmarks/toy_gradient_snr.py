"""How much of a training step's gradient is signal: cosine similarity of independent batch gradients.

For a recipe (default ``configs/toy/demo.yaml``) and its loss, the frozen initial weights receive
``--batches`` gradients, each from an independent rollout batch of the same prompts. If a batch
gradient is ``g_i = g + n_i`` (true gradient plus independent noise), the mean pairwise cosine of
two batch gradients estimates ``|g|^2 / (|g|^2 + E|n|^2)``: the fraction of a step's squared
gradient that is signal. Adam moves every weight by about the learning rate whatever that fraction
is, so a loss whose fraction is near 0 random-walks the weights (DESIGN.md "The offline world";
``docs/toy_rl_study.md`` reports the numbers)::

    python benchmarks/toy_gradient_snr.py --oracle --prompts "a photo of a black circle and a red square" \\
        --set model.lora=null --set train.method=diffusion_nft --set train.loss=nft

One gradient is recorded per optimiser step; ``--set train.minibatch_size=64`` makes it the whole
step's (``docs/toy_rl_study.md`` section 18 compares ``--set train.group_noise=true`` so).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def batch_gradients(overrides: list[str], batches: int, recipe: str) -> list[torch.Tensor]:
    """One flattened gradient per independent rollout batch, all at the initial weights."""
    from genalign.trainers.config import load_recipe
    from genalign.trainers.trainer import build_trainer

    config = load_recipe(
        recipe, ["logging.run_dir=/tmp/genalign-snr/{name}", "logging.progress=false", *overrides]
    )
    trainer = build_trainer(config, base_dir=Path(recipe).parent)
    gradients: list[torch.Tensor] = []

    def record() -> None:  # replaces the optimiser step: keep the gradient, change no weight
        flat = [
            p.grad.detach().flatten() if p.grad is not None else torch.zeros(p.numel())
            for p in trainer.parameters
        ]
        gradients.append(torch.cat(flat).clone())
        for parameter in trainer.parameters:
            parameter.grad = None

    trainer._optimizer_step = record
    for step in range(batches):
        trainer.train_step(step)  # steps draw different prompts' seeds: independent batches
    return gradients


def signal_fraction(gradients: list[torch.Tensor]) -> dict[str, float]:
    """Mean and spread of the pairwise cosine similarities of the batch gradients, and their total
    variance ``sum_i |g_i - mean|^2 / (n - 1)`` (the expected squared noise of one batch gradient,
    which a variance-reduction option such as ``train.group_noise`` should lower)."""
    stacked = torch.stack(gradients).double()
    spread = ((stacked - stacked.mean(0)) ** 2).sum(1)
    cosines = [
        float(torch.nn.functional.cosine_similarity(a, b, dim=0))
        for a, b in itertools.combinations(gradients, 2)
    ]
    return {
        "cosine_mean": statistics.fmean(cosines),
        "cosine_stderr": statistics.stdev(cosines) / len(cosines) ** 0.5
        if len(cosines) > 1
        else float("nan"),
        "gradient_norm": statistics.fmean(float(g.norm()) for g in gradients),
        "variance": float(spread.sum() / (len(gradients) - 1)) if len(gradients) > 1 else float("nan"),
        "pairs": len(cosines),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default=str(ROOT / "configs" / "toy" / "demo.yaml"))
    parser.add_argument("--prompts", default=None, help="one caption to train on (default: the recipe's)")
    parser.add_argument("--oracle", action="store_true", help="the verifier's 0/1 score as the reward")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--set", action="append", default=[], help="recipe override key=value")
    parser.add_argument("--label", default="")
    args = parser.parse_args(argv)
    overrides = list(args.set)
    if args.prompts:
        overrides.append(f"prompts.prompts={json.dumps([args.prompts])}")
    if args.oracle:
        overrides += ["reward.name=shapes_eval", "reward.kwargs={}"]
    result = signal_fraction(batch_gradients(overrides, args.batches, args.recipe))
    print(json.dumps({"label": args.label, "overrides": overrides, **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
