"""Reward throughput: images/second batched vs one image at a time, measured side by side.

Every registered reward is built on its tiny model (``genalign.tiny.clip``), saved and loaded the
way users load the real ones, and scores the same images two ways in alternating rounds: one call
on the whole batch, and one call per image. The ratio of the two rates is what batching buys
(fixed per-call costs: Python, validation, tokenisation, kernel launches). Absolute rates on tiny
models say little about real ones; the ratio is the number to read.

    python benchmarks/rewards.py                       # CPU, batch 16, 64-px images, ~1 minute
    python benchmarks/rewards.py --device cuda --batch-size 64 --grad
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from genalign.rewards import AestheticMLP, Reward, load_reward
from genalign.tiny.clip import OPEN_CLIP_WEIGHTS_NAME, TINY_OPEN_CLIP_NAME, clip_model, open_clip_model

PROMPTS = ["a red circle", "two blue squares", "a green triangle", "a yellow star left of a purple square"]


def build_rewards(folder: Path, device: str) -> dict[str, Reward]:
    """Each reward on a tiny model saved under ``folder`` in its official layout."""
    hf = folder / "clip"
    model, _ = clip_model(seed=0, save_to=hf)
    open_clip, _, _, _ = open_clip_model(seed=1, save_to=folder / "open_clip")
    torch.save({"state_dict": open_clip.state_dict()}, folder / "hps.pt")
    torch.save(AestheticMLP(model.config.projection_dim).state_dict(), folder / "aesthetic.pth")
    weights = str(folder / "open_clip" / OPEN_CLIP_WEIGHTS_NAME)
    rewards = {
        "clip (open_clip)": load_reward("clip", model=TINY_OPEN_CLIP_NAME, pretrained=weights, device=device),
        "clip (transformers)": load_reward("clip", backend="transformers", model=str(hf), device=device),
        "pickscore": load_reward("pickscore", model=str(hf), processor=str(hf), device=device),
        "hpsv2": load_reward(
            "hpsv2", checkpoint=str(folder / "hps.pt"), model=TINY_OPEN_CLIP_NAME, device=device
        ),
        "aesthetic": load_reward(
            "aesthetic", checkpoint=str(folder / "aesthetic.pth"), model=str(hf), device=device
        ),
        "jpeg_compressibility": load_reward("jpeg_compressibility"),
    }
    rewards["ensemble (clip+hps+aesthetic)"] = load_reward(
        "ensemble",
        members=[
            {"reward": rewards["clip (open_clip)"]},
            {"reward": rewards["hpsv2"], "normalize": "batch"},
            {"reward": rewards["aesthetic"], "weight": 0.1},
        ],
    )
    return rewards


def timed(fn: Callable[[], object], device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(reward: Reward, images: torch.Tensor, prompts: list[str], rounds: int, grad: bool, device: str):
    """Seconds per batch, (whole batch in one call, one call per image), in alternating rounds.

    Returns the fastest time of each (the least disturbed by other processes) and the median of
    the per-round ratios (each round measures both back to back, so load changes cancel).
    """
    grad = grad and reward.differentiable

    def run(batch: torch.Tensor, batch_prompts: list[str]) -> None:
        batch = batch.detach().requires_grad_(grad)
        scores = reward(batch, batch_prompts).scores
        if grad:
            torch.autograd.grad(scores.sum(), batch)

    def batched() -> None:
        run(images, prompts)

    def single() -> None:
        for i in range(len(prompts)):
            run(images[i : i + 1], prompts[i : i + 1])

    batched(), single()  # warm-up
    batched_times, single_times = [], []
    for _ in range(rounds):
        batched_times.append(timed(batched, device))
        single_times.append(timed(single, device))
    ratios = [s / b for b, s in zip(batched_times, single_times)]
    return min(batched_times), min(single_times), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--grad", action="store_true", help="also backpropagate to the images (ReNO-style)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    torch.manual_seed(0)

    images = torch.rand(args.batch_size, 3, args.image_size, args.image_size, device=args.device)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.batch_size)]
    with tempfile.TemporaryDirectory() as folder:
        rewards = build_rewards(Path(folder), args.device)
        print(
            f"device={args.device} batch={args.batch_size} image={args.image_size}px "
            f"grad={args.grad} rounds={args.rounds} threads={torch.get_num_threads()}"
        )
        print("images/second, best of the rounds; ratio: median over rounds of batched/single rate")
        print(f"{'reward':32s} {'batched img/s':>14s} {'single img/s':>14s} {'ratio':>7s}")
        for name, reward in rewards.items():
            batched, single, ratio = measure(reward, images, prompts, args.rounds, args.grad, args.device)
            print(
                f"{name:32s} {args.batch_size / batched:14.1f} {args.batch_size / single:14.1f} {ratio:6.1f}x"
            )


if __name__ == "__main__":
    main()
