"""The ``iqa`` reward's expected readout, two ways side by side: one teacher-forced forward per
answer (the reward's path) against one next-token forward per digit (its fallback, and the path
before session 41).

The judge's answers are generated once and reused, so only the readout is timed; the two ways
alternate ``--repeats`` times and the medians are compared. Also the largest difference between
their scores (they must agree up to float rounding)::

    python benchmarks/iqa_readout.py runs/toy-q-hawkeye/final --data runs/toy-quality-heldout
    python benchmarks/iqa_readout.py tiny      # the tiny LLaVA with scripted answers, no trained judge

One JSON line: ``images``, ``answers_parsed``, ``forward_per_answer_s``, ``forward_per_digit_s``,
``speedup`` (per digit / per answer) and ``max_abs_difference``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCRIPTED = ["<think>sharp</think><answer>4.25</answer>", "<think>soft</think><answer>2.5</answer>"]


def judge_and_images(model: str, data: str, count: int, batch_size: int):
    """``(reward, images)``: a trained judge folder read with ``readout="expected"`` and the first
    ``count`` originals of a quality set, or (``tiny``) the tiny LLaVA with scripted answers."""
    from genalign.rewards import load_reward
    from genalign.rewards.iqa import VLMQualityReward

    if model == "tiny":
        from genalign.tiny.language import llava_vlm

        reward = VLMQualityReward(
            *llava_vlm(seed=0),
            preset="answer",
            question="Rate it.",
            readout="expected",
            batch_size=batch_size,
        )
        reward.judge.generate = lambda texts, *a, **k: (SCRIPTED * len(texts))[: len(texts)]
        return reward, torch.rand(count, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    from q_hawkeye_judge import load_set

    reward = load_reward("iqa", model=model, readout="expected", batch_size=batch_size)
    return reward, load_set(Path(data))[0][:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="a q_hawkeye run's final/ folder, or 'tiny'")
    parser.add_argument("--data", default=str(ROOT / "runs/toy-quality-heldout"))
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=48)
    args = parser.parse_args(argv)
    reward, images = judge_and_images(args.model, args.data, args.images, args.batch_size)
    reward.eval()
    generate, memo = reward.judge.generate, []

    def generate_once(*args, **kwargs):  # the judge answers once; both ways read those answers
        if not memo:
            memo.append(generate(*args, **kwargs))
        return memo[0]

    reward.judge.generate = generate_once
    ways = {"forward_per_answer": reward._digit_offsets, "forward_per_digit": lambda whole, prefixes: None}
    times: dict[str, list[float]] = {name: [] for name in ways}
    scores: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        parsed = float(reward(images, None).details["answer_parsed"].mean())  # generates; warms up
        for _ in range(args.repeats):
            for name, offsets in ways.items():
                reward._digit_offsets = offsets
                start = time.perf_counter()
                scores[name] = reward(images, None).scores
                times[name].append(time.perf_counter() - start)
    row = {
        "images": len(images),
        "answers_parsed": parsed,
        **{f"{name}_s": statistics.median(t) for name, t in times.items()},
    }
    row["speedup"] = row["forward_per_digit_s"] / row["forward_per_answer_s"]
    row["max_abs_difference"] = float(
        (scores["forward_per_answer"] - scores["forward_per_digit"]).abs().max()
    )
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
