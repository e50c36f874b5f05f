"""How much image quality can a judge built on toy-vlm see? Bounds for the toy Q-Hawkeye judge (#27).

Held-out SRCC against MOS on the toy quality set (``genalign.toy.quality``: the renders the judge
RL trains on, ``train`` split, 48 scenes, seed 0, and the held-out set, 24 scenes of held-out
captions, seed 1; 288 images), per degradation kind and overall, of

1. **toy-vlm as a Q-Align judge** (the RL's starting point and the target to beat);
2. **a ridge probe on toy-vlm's last hidden state at the answer position** (after Q-Align's
   question and answer prefix), fitted on the train renders: what a linear readout of what the LM
   already computes can rank (the ridge's alpha is picked on the held-out set, so an optimistic
   bound);
3. **a ridge probe on the frozen vision features** (the projector's output, all image tokens):
   what the image tokens carry linearly;
4. **a small CNN trained on the same train renders' MOS** from the pixels the processor gives the
   vision tower (48 px): how much quality information the images hold at that size.

Prints one line per bound; ``--seeds`` CNN seeds (mean and range). About 3 CPU-minutes::

    python benchmarks/q_hawkeye_perception.py --seeds 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from genalign.rewards import load_reward  # noqa: E402
from genalign.toy.quality import quality_renders  # noqa: E402

KINDS = ("blur", "jpeg", "noise")


def srcc(pred: np.ndarray, mos: np.ndarray, kinds: list[str]) -> str:
    """Overall and per-kind SRCC as one string."""
    parts = [f"all {spearmanr(pred, mos)[0]:.3f}"]
    for kind in KINDS:
        index = [i for i, k in enumerate(kinds) if k == kind]
        parts.append(f"{kind} {spearmanr(pred[index], mos[index])[0]:.3f}")
    return ", ".join(parts)


def ridge(train: np.ndarray, target: np.ndarray, alpha: float):
    """A standardised ridge regression in its dual form (more features than samples is fine)."""
    mean, std = train.mean(0), train.std(0) + 1e-6
    z = (train - mean) / std
    coef = np.linalg.solve(z @ z.T + alpha * np.eye(len(z)), target - target.mean())
    weights = z.T @ coef
    return lambda x: ((x - mean) / std) @ weights + target.mean()


def toy_vlm_features(model_path: str, images: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(Q-Align scores [N], last hidden state at the answer position [N, D], image tokens [N, T*D])``."""
    reward = load_reward("iqa", model=model_path, preset="qalign", batch_size=48).eval()
    captured: dict[str, list[torch.Tensor]] = {"last": [], "image": []}
    language_model = reward.judge.model.model
    hooks = [
        language_model.language_model.norm.register_forward_hook(
            lambda m, i, o: captured["last"].append(o[:, -1].detach().float())
        ),
        language_model.multi_modal_projector.register_forward_hook(
            lambda m, i, o: captured["image"].append(o.detach().float().flatten(1))
        ),
    ]
    with torch.no_grad():
        scores = reward(images, [""] * len(images)).scores.float().numpy()
    for hook in hooks:
        hook.remove()
    return scores, torch.cat(captured["last"]).numpy(), torch.cat(captured["image"]).numpy()


def cnn_bound(
    train: torch.Tensor, target: np.ndarray, test: torch.Tensor, seed: int, epochs: int
) -> np.ndarray:
    """Predictions on ``test`` of a 3-layer CNN regressed on ``target`` (MSE, Adam 2e-3)."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.GELU(),
        torch.nn.Conv2d(32, 32, 3, padding=1),
        torch.nn.GELU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.GELU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 1),
    )
    optimizer = torch.optim.Adam(net.parameters(), 2e-3)
    y = torch.tensor(target, dtype=torch.float32)
    for _ in range(epochs):
        order = torch.randperm(len(train))
        for start in range(0, len(train), 64):
            batch = order[start : start + 64]
            loss = F.mse_loss(net(train[batch]).squeeze(-1), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        return net(test).squeeze(-1).numpy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(ROOT / "assets/models/toy-vlm"))
    parser.add_argument("--seeds", type=int, default=3, help="CNN seeds (0: the VLM's readings only)")
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--size", type=int, default=48, help="the CNN's input size (toy-vlm's processor: 48)")
    args = parser.parse_args(argv)
    train_images, train_mos, _ = quality_renders("train", 48, 0)
    test_images, test_mos, records = quality_renders("heldout", 24, 1)
    y_train, y_test = np.array(train_mos), np.array(test_mos)
    kinds = [r["category"] for r in records]

    train_scores, train_last, train_tokens = toy_vlm_features(args.model, train_images)
    test_scores, test_last, test_tokens = toy_vlm_features(args.model, test_images)
    print(
        f"{Path(args.model).name} Q-Align (train-split renders: {spearmanr(train_scores, y_train)[0]:.3f}): "
        f"{srcc(test_scores, y_test, kinds)}"
    )
    for name, train, test in (
        ("answer-position hidden state", train_last, test_last),
        ("image tokens", train_tokens, test_tokens),
    ):
        best = max(
            (spearmanr(ridge(train, y_train, a)(test), y_test)[0], a) for a in (1, 10, 100, 1000, 10000)
        )
        print(
            f"ridge on {Path(args.model).name}'s {name} (alpha {best[1]}, the best of 5 on the held-out set): "
            f"{srcc(ridge(train, y_train, best[1])(test), y_test, kinds)}"
        )

    def resize(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(
            x, size=(args.size, args.size), mode="bicubic", antialias=True, align_corners=False
        )

    values = []
    for seed in range(args.seeds):
        prediction = cnn_bound(resize(train_images), y_train, resize(test_images), seed, args.epochs)
        values.append(spearmanr(prediction, y_test)[0])
        print(f"CNN on {args.size} px pixels, seed {seed}: {srcc(prediction, y_test, kinds)}", flush=True)
    if values:  # --seeds 0 reads the VLM only
        print(f"CNN mean SRCC {np.mean(values):.3f} (min {min(values):.3f}, max {max(values):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
