"""A pair judge: P(two images show the same objects), for ``svg_fidelity``'s ``judge`` term.

Not in RLRF. RLRF's terms (pixels, edges, DreamSim, length) pay a near miss almost as much as an
exact reconstruction; a reward with a step for the exact answer is what moved the toy writer
(docs/language.md sections 5.5-5.6). DreamSim's thresholded distance gives such a step but fires
on a few percent of misses, which RL finds. A classifier trained on the decision itself
("same objects or not", as a two-image VQA judge would answer) is the learned form of that step.

:class:`PairJudge` is a small siamese CNN: a shared encoder maps each image to a feature map,
sum- and max-pooled over positions (a multiset of objects is a sum over objects, wherever they
are), and a head reads ``[|a - b|, a * b]``, so the logit is symmetric in its two images. It is
trained by :mod:`genalign.toy.reward_models.scene_judge` on the toy world; a folder holds
``config.json`` (the constructor's arguments) and ``model.safetensors``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class PairJudge(nn.Module):
    """Siamese same-content classifier (module docstring). ``forward(a, b)`` -> logits ``[B]``."""

    def __init__(self, width: int = 32, embed: int = 128, hidden: int = 256) -> None:
        super().__init__()
        self.config = {"width": width, "embed": embed, "hidden": hidden}
        w = width
        self.encoder = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(w, 2 * w, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv2d(2 * w, 2 * w, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(2 * w, embed, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv2d(embed, embed, 3, padding=1),
        )
        self.head = nn.Sequential(nn.Linear(4 * embed, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` in [0, 1] -> ``[B, 2 * embed]`` (mean- and max-pooled feature map)."""
        features = self.encoder(images.float() * 2.0 - 1.0).flatten(2)  # (B, C, HW)
        return torch.cat([features.mean(-1), features.amax(-1)], dim=-1)

    def compare(self, ea: torch.Tensor, eb: torch.Tensor) -> torch.Tensor:
        """Logits ``[B]`` from two embeddings ``[B, 2 * embed]`` (symmetric in the two)."""
        return self.head(torch.cat([(ea - eb).abs(), ea * eb], dim=-1)).squeeze(-1)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.compare(self.embed(a), self.embed(b))

    @torch.no_grad()
    def probability(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """P(same objects) ``[B]``; images are resized to the judge's training size when given."""
        size = self.config.get("image_size")
        if size is not None:
            a, b = (_resize(x, int(size)) for x in (a, b))
        return torch.sigmoid(self(a, b))

    def save(self, folder: str | Path, extra: dict[str, Any] | None = None) -> Path:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_NAME).write_text(json.dumps({**self.config, **(extra or {})}, indent=2) + "\n")
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / WEIGHTS_NAME))
        return folder


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
    if images.shape[-2:] == (size, size):
        return images
    return F.interpolate(
        images.float(), size=(size, size), mode="bilinear", antialias=True, align_corners=False
    )


def load_pair_judge(folder: str | Path) -> PairJudge:
    """A :class:`PairJudge` from ``folder`` (``local-dir:`` prefix accepted), in eval mode; a
    missing or broken folder raises a one-line error naming the file."""
    from safetensors.torch import load_file

    folder = Path(str(folder).removeprefix("local-dir:"))
    config_path, weights_path = folder / CONFIG_NAME, folder / WEIGHTS_NAME
    for path in (config_path, weights_path):
        if not path.is_file():
            raise FileNotFoundError(f"pair judge: {path} not found")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"pair judge: {config_path} is not valid JSON ({error})") from None
    judge = PairJudge(**{k: config[k] for k in ("width", "embed", "hidden") if k in config})
    judge.config.update({k: v for k, v in config.items() if k not in judge.config})
    judge.load_state_dict(load_file(str(weights_path)))
    return judge.eval()
