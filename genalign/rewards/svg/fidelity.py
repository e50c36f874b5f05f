"""``svg_fidelity``: the rendering-feedback reward of RLRF for image-to-SVG generation.

Rodriguez et al., "Rendering-Aware Reinforcement Learning for Vector Graphics Generation"
(RLRF), 2025, Sec. 3.2 ("Rewards"). Each sampled SVG is rendered and compared with the input
image ``I``; with ``Î`` the render, the reward is a weighted combination of:

- **image** (pixel reconstruction): both images normalised per channel to zero mean and unit
  variance, ``R_img = clip(1 - (1/N) ||norm(I) - norm(Î)||², -1, 1)``, N = 3HW. With
  population statistics ``(1/N)||z - ẑ||² = 2 (1 - ρ)`` (ρ: Pearson correlation averaged over
  channels), so R_img = 2ρ - 1: invariant to global brightness/contrast, 1 for a perfect match.
- **edge**: the same normalised-L2 reward on edge maps. RLRF uses Canny edges, dilated (3x3)
  and blurred (13x13 Gaussian) so that near misses still earn partial credit; here a colour Canny
  (Gaussian σ=1, Sobel, non-maximum suppression, hysteresis; per pixel the RGB channel with the
  largest gradient), 3x3 dilation, 13x13 Gaussian with σ = 2.3 (OpenCV's σ for that size).
- **semantic**: ``1 - 2 d`` with ``d = 1 - cos(e(I), e(Î))`` the embedding distance, i.e. RLRF's
  DreamSim reward form; the embedder is any callable ``images [B,3,H,W] -> [B,D]`` (e.g. a CLIP
  image tower via ``embedder="clip"``). Off unless an embedder is given.
- **match** (not in the paper; off unless weighted): 1 when the embedding distance ``d`` is below
  ``match_threshold``, else 0, i.e. the embedder's same-image decision. The semantic term pays a
  near miss almost as much as an exact render; this term gives the exact render a step, as the
  toy world's oracle does (docs/language.md section 5.6). Needs the embedder.
- **judge** (not in the paper; off unless weighted): ``2 p - 1`` with ``p`` a pair judge's
  probability that the render shows the same objects as the target
  (:class:`~genalign.rewards.svg.judge.PairJudge`, or any callable ``(renders, targets) -> [B]``
  in [0, 1]): the learned form of the oracle's step for the exact answer (docs/language.md
  section 5.10). ``judge_log_floor=L`` grades the misses instead: ``1 + 2 max(log p, -L) / L``,
  1 for a sure match, -1 at ``p <= e^-L``, so a near miss the judge doubts less scores higher.
- **length** (code efficiency): ``R_len = 1 - ((1/L_ref) max(0, L - L_ref/2))²`` with L the
  length of the SVG and L_ref that of the ground-truth SVG: free up to half the reference, then
  a quadratic penalty (0.75 at L = L_ref, 0 at 1.5 L_ref). RLRF leaves it unbounded below; here it
  is clipped at ``min_reward`` (default -1) so that every term lives in [-1, 1]
  (``clip_length=False`` restores the paper's form). Lengths are characters by default;
  ``length_tokenizer`` (a tokenizer folder or hub id, a recipe key) counts that tokenizer's tokens
  as the paper does, and ``length_fn`` takes any counter. Off unless
  ``reference_svgs`` or ``reference_lengths`` are given. ``length_margin=m`` (not in the paper)
  moves the free zone up to ``(1 + m) L_ref``: ``R_len = 1 - ((1/L_ref) max(0, L - (1+m) L_ref))²``,
  so only SVGs longer than the reference by more than the margin are penalised and shortening
  below the reference earns nothing (the paper's term pays 0.25 for halving a reference-length SVG).

The score is ``Σ w_k R_k / Σ w_k`` over the active terms (the paper's weighted sum, normalised
so that scores stay in [-1, 1]). An SVG that is rejected by the sanitiser, does not render, times
out, or renders blank (a uniform image, e.g. all white) gets ``min_reward`` for every term and the
score; the reason is in ``details["failure"]``. A blank render is never compared with the target,
so a white canvas cannot score as a near match of a mostly-white icon.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from genalign.rewards.base import Reward, RewardOutput, register_reward, validate_images
from genalign.rewards.svg.length_unit import length_function
from genalign.rewards.svg.pool import SVGRenderPool, render_batch
from genalign.rewards.svg.sanitize import RenderLimits

logger = logging.getLogger(__name__)

TERMS = ("image", "edge", "semantic", "length", "match", "judge")
DEFAULT_WEIGHTS = {"image": 1.0, "edge": 1.0, "semantic": 1.0, "length": 1.0, "match": 0.0, "judge": 0.0}


# -- the terms (pure functions on tensors) ---------------------------------------------------------


def normalize_per_channel(images: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """``[B, C, H, W]`` -> per image and channel zero mean, unit (population) std.

    A channel flatter than ``eps`` (std) normalises to exactly 0 instead of amplifying rounding
    noise, e.g. the red channel of red shapes on white.
    """
    mean = images.mean(dim=(-2, -1), keepdim=True)
    std = images.std(dim=(-2, -1), keepdim=True, unbiased=False)
    return torch.where(std > eps, (images - mean) / std.clamp_min(eps), torch.zeros_like(images))


def normalized_l2_reward(
    predictions: torch.Tensor, targets: torch.Tensor, low: float = -1.0, high: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLRF Sec. 3.2 pixel reward: ``clip(1 - mean((norm(I) - norm(Î))²), -1, 1)``.

    Args:
        predictions, targets: ``[B, C, H, W]``.

    Returns:
        ``(reward [B], mse [B])``.
    """
    mse = (normalize_per_channel(predictions) - normalize_per_channel(targets)).pow(2).mean(dim=(1, 2, 3))
    return (1.0 - mse).clamp(low, high), mse


def gaussian_blur(images: torch.Tensor, sigma: float, kernel_size: int | None = None) -> torch.Tensor:
    """Separable Gaussian blur of ``[B, C, H, W]`` with reflect padding."""
    if kernel_size is None:
        kernel_size = 2 * math.ceil(3 * sigma) + 1
    radius = kernel_size // 2
    x = torch.arange(kernel_size, dtype=images.dtype, device=images.device) - radius
    kernel = torch.exp(-0.5 * (x / sigma) ** 2)
    kernel = kernel / kernel.sum()
    channels = images.shape[1]
    mode = "reflect" if min(images.shape[-2:]) > radius else "replicate"
    padded = F.pad(images, (radius, radius, radius, radius), mode=mode)
    horizontal = kernel.view(1, 1, 1, -1).expand(channels, 1, 1, kernel_size)
    vertical = kernel.view(1, 1, -1, 1).expand(channels, 1, kernel_size, 1)
    return F.conv2d(F.conv2d(padded, horizontal, groups=channels), vertical, groups=channels)


def canny_edges(
    images: torch.Tensor, low: float = 0.04, high: float = 0.1, sigma: float = 1.0
) -> torch.Tensor:
    """Colour Canny edge detector on ``[B, 3, H, W]`` in [0, 1]; returns binary ``[B, 1, H, W]``.

    Canny (1986): Gaussian smoothing, Sobel gradients (scaled by 1/8, so ``magnitude`` is in
    intensity per pixel; a sharp step of contrast c peaks near 0.38c after σ=1 smoothing),
    non-maximum suppression along the gradient direction quantised to 0/45/90/135 degrees, and
    hysteresis: pixels above ``high`` seed edges that grow through 8-connected pixels above
    ``low``. Per pixel the RGB channel with the largest gradient is used, so a yellow shape on
    white (low luminance contrast) still has edges.
    """
    batch, _, height, width = images.shape
    smooth = gaussian_blur(images.float(), sigma)
    # Sobel / 8 by shifted differences: [1, 2, 1] smoothing across, [-1, 0, 1] difference along
    p = F.pad(smooth, (1, 1, 1, 1), mode="replicate")  # (B, 3, H + 2, W + 2)
    across_rows = p[..., :-2, :] + 2 * p[..., 1:-1, :] + p[..., 2:, :]  # (B, 3, H, W + 2)
    across_cols = p[..., :, :-2] + 2 * p[..., :, 1:-1] + p[..., :, 2:]  # (B, 3, H + 2, W)
    grad_x = (across_rows[..., 2:] - across_rows[..., :-2]) / 8.0
    grad_y = (across_cols[..., 2:, :] - across_cols[..., :-2, :]) / 8.0
    gradients = torch.stack([grad_x, grad_y], dim=2)  # (B, 3, 2, H, W)
    magnitude_all = gradients.pow(2).sum(2).sqrt()  # (B, 3, H, W)
    magnitude, channel = magnitude_all.max(dim=1, keepdim=True)  # (B, 1, H, W)
    index = channel.unsqueeze(2).expand(batch, 1, 2, height, width)
    gx, gy = gradients.gather(1, index).squeeze(1).unbind(1)  # (B, H, W) each

    # non-maximum suppression: compare with the two neighbours along the gradient direction
    angle = torch.rad2deg(torch.atan2(gy, gx)) % 180.0
    sector = (((angle + 22.5) // 45.0) % 4).long().unsqueeze(1)  # 0: 0°, 1: 45°, 2: 90°, 3: 135°
    offsets = [(0, 1), (1, 1), (1, 0), (1, -1)]  # (row, column) step along each direction
    padded_magnitude = F.pad(magnitude, (1, 1, 1, 1))
    is_max = torch.zeros_like(magnitude, dtype=torch.bool)
    for k, (dy, dx) in enumerate(offsets):
        ahead = padded_magnitude[..., 1 + dy : 1 + dy + height, 1 + dx : 1 + dx + width]
        behind = padded_magnitude[..., 1 - dy : 1 - dy + height, 1 - dx : 1 - dx + width]
        is_max |= (sector == k) & (magnitude >= ahead) & (magnitude >= behind)
    weak = is_max & (magnitude >= low)
    edges = is_max & (magnitude >= high)

    return hysteresis(weak, edges).float()


def hysteresis(weak: torch.Tensor, strong: torch.Tensor) -> torch.Tensor:
    """Keep the 8-connected components of ``weak`` that contain a ``strong`` pixel. ``[B, 1, H, W]`` bool.

    Connected-component labelling (scipy, on CPU) instead of iterated dilation: an edge chain of
    length n would need n dilation steps.
    """
    from scipy import ndimage

    weak_np, strong_np = weak.cpu().numpy(), strong.cpu().numpy()
    kept = np.zeros_like(weak_np)
    structure = np.ones((3, 3), dtype=bool)
    for index in np.ndindex(*weak_np.shape[:2]):
        labels, count = ndimage.label(weak_np[index], structure=structure)
        if count:
            seeds = np.unique(labels[strong_np[index]])
            kept[index] = np.isin(labels, seeds[seeds > 0])
    return torch.from_numpy(kept).to(weak.device)


def edge_map(images: torch.Tensor, low: float = 0.04, high: float = 0.1) -> torch.Tensor:
    """RLRF's edge image: Canny, 3x3 dilation, 13x13 Gaussian (σ 2.3). ``[B,3,H,W] -> [B,1,H,W]``."""
    edges = canny_edges(images, low=low, high=high)
    dilated = F.max_pool2d(edges, 3, stride=1, padding=1)
    return gaussian_blur(dilated, sigma=2.3, kernel_size=13)


def length_reward(
    lengths: torch.Tensor,
    reference_lengths: torch.Tensor,
    low: float | None = -1.0,
    free_fraction: float = 0.5,
) -> torch.Tensor:
    """RLRF Sec. 3.2 length reward ``1 - ((1/L_ref) max(0, L - f L_ref))²``, clipped below at ``low``.

    ``lengths``, ``reference_lengths``: ``[B]``. ``f = free_fraction`` is the length, as a fraction
    of the reference, below which the reward is 1: the paper's 1/2; ``1 + margin`` for the
    one-sided, margin-based variant (only SVGs longer than the reference by the margin lose).
    """
    lengths, reference = lengths.double(), reference_lengths.double().clamp_min(1.0)
    excess = (lengths - free_fraction * reference).clamp_min(0.0)
    reward = 1.0 - (excess / reference) ** 2
    return (reward if low is None else reward.clamp_min(low)).float()


def absolute_length_reward(
    lengths: torch.Tensor, reference_lengths: torch.Tensor, margin: float = 0.0, low: float | None = -1.0
) -> torch.Tensor:
    """RLRF's code-efficiency reward as the project page writes it, ``R_eff = -|len(y_hat) - len(y)|``,
    normalised by the reference and shifted to 1 at the reference length:
    ``1 - max(0, |L - L_ref| - m L_ref) / L_ref``, clipped below at ``low``. Two-sided and linear:
    an SVG one shape longer or shorter than the reference loses that shape's share of the reference
    whatever else it holds, where the quadratic Sec. 3.2 form charges an excess of fraction x only
    x²; within ``m`` of the reference (a fraction) the length is free."""
    lengths, reference = lengths.double(), reference_lengths.double().clamp_min(1.0)
    excess = ((lengths - reference).abs() - margin * reference).clamp_min(0.0)
    reward = 1.0 - excess / reference
    return (reward if low is None else reward.clamp_min(low)).float()


def embedding_reward(
    encode: Callable[[torch.Tensor], torch.Tensor], predictions: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``1 - 2 (1 - cos)`` between embeddings (RLRF's DreamSim reward form); returns (reward, cos)."""
    cosine = F.cosine_similarity(encode(predictions).float(), encode(targets).float(), dim=-1)
    return (2.0 * cosine - 1.0).clamp(-1.0, 1.0), cosine


# -- the reward ------------------------------------------------------------------------------------


def _resolve_embedder(embedder: Any, embedder_kwargs: Mapping[str, Any] | None) -> Any:
    if embedder is None:
        return None
    if isinstance(embedder, str):
        if embedder != "clip":
            raise ValueError(f"embedder must be None, 'clip' or a callable, got {embedder!r}")
        from genalign.rewards.base import load_reward

        reward = load_reward("clip", **dict(embedder_kwargs or {}))
        embedder = getattr(reward, "embedder", reward)
    if not (hasattr(embedder, "encode_images") or callable(embedder)):
        raise TypeError(
            f"embedder must have encode_images(images) or be callable, got {type(embedder).__name__}"
        )
    return embedder


def _resolve_judge(judge: Any) -> Any:
    if judge is None:
        return None
    if isinstance(judge, (str, Path)):
        from genalign.rewards.svg.judge import load_pair_judge

        return load_pair_judge(judge)
    if not callable(judge):
        raise TypeError(f"svg_fidelity judge must be a folder or a callable, got {type(judge).__name__}")
    return judge


@register_reward("svg_fidelity")
class SVGFidelityReward(Reward):
    """RLRF rendering-feedback reward (Rodriguez et al. 2025, Sec. 3.2); see the module docstring.

    Call: ``reward(svgs, prompts=None, targets=..., reference_svgs=..., reference_lengths=...)``
    with ``svgs`` a list of B SVG strings and

    - ``targets``: ``[B, 3, H, W]`` in [0, 1], the images to reconstruct (renders are made at
      H x W); if omitted, ``reference_svgs`` are rendered at ``render_size`` and used instead.
    - ``reference_svgs``: B ground-truth SVGs (length reference, and targets when none given).
    - ``reference_lengths``: B reference lengths (override the ones measured on reference_svgs).

    Args:
        weights: per-term weights, keys from :data:`TERMS`; missing keys keep their default
            (1.0; ``match`` and ``judge`` 0.0); a 0 weight switches a term off.
        embedder: None (semantic term off), ``"clip"`` (``load_reward("clip", **embedder_kwargs)``
            and its image tower), an object with ``encode_images(images) -> [B, D]``, or any
            callable ``images [B, 3, H, W] in [0, 1] -> [B, D]``.
        embedder_kwargs: keyword arguments for ``load_reward("clip", ...)``.
        backend: SVG renderer, "cairosvg" (reference) or "skia" (fast).
        limits: sanitisation caps and the per-render timeout.
        workers: render processes (shared pool); ``pool`` gives an explicit
            :class:`~genalign.rewards.svg.pool.SVGRenderPool`.
        render_size: ``(H, W)`` for rendering ``reference_svgs`` when no ``targets`` are given.
        length_fn: SVG text -> length (default: characters; pass a token counter for tokens).
        length_tokenizer: a tokenizer folder or hub id: lengths in its tokens (RLRF's unit), for
            recipes, which cannot pass a callable; not with ``length_fn``.
        clip_length: clip the length reward below at ``min_reward`` (the paper does not).
        length_margin: None for the paper's length term (free up to half the reference); a
            margin m >= 0 makes it one-sided: free up to ``(1 + m)`` times the reference length,
            so shortening an SVG below the reference is never rewarded (not in the paper).
        min_reward: the value of every term, and of the score, for an SVG that fails.
        edge_thresholds: Canny ``(low, high)`` hysteresis thresholds on gradient magnitude.
        match_threshold: the ``match`` term's embedding distance ``1 - cos`` below which a render
            counts as the target (in (0, 2)).
        judge: the ``judge`` term's pair judge: a folder (``local-dir:`` accepted) of a
            :class:`~genalign.rewards.svg.judge.PairJudge`, or a callable ``(renders, targets)``
            -> P(same) ``[B]``; needed when ``weights["judge"] > 0``.
        judge_log_floor: None for the term ``2p - 1``; L > 0 for ``1 + 2 max(log p, -L) / L``.

    Scores: ``[B]`` in ``[min_reward, 1]``; not differentiable (rendering is not).
    Details: the active terms' rewards (``[B]`` each, named as in :data:`TERMS`), raw
    ``"image_mse"``, ``"edge_mse"``, ``"cosine"``, ``"judge_probability"``, ``"length_ratio"`` (``[B]``, NaN
    where the SVG failed), ``"failure"`` (B reason codes or None), ``"failure_count"``,
    ``"render_backend"`` (B renderer names), ``"weights"`` (active terms and their weights).
    """

    input_kind = "svg"
    differentiable = False

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        embedder: Any = None,
        embedder_kwargs: Mapping[str, Any] | None = None,
        backend: str = "cairosvg",
        limits: RenderLimits | None = None,
        workers: int | None = None,
        pool: SVGRenderPool | None = None,
        render_size: tuple[int, int] = (224, 224),
        length_fn: Callable[[str], int] | None = None,
        length_tokenizer: str | None = None,
        clip_length: bool = True,
        length_margin: float | None = None,
        min_reward: float = -1.0,
        edge_thresholds: tuple[float, float] = (0.04, 0.1),
        match_threshold: float = 0.05,
        judge: Any = None,
        judge_log_floor: float | None = None,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        unknown = set(weights or {}) - set(TERMS)
        if unknown:
            raise ValueError(f"unknown svg_fidelity weight(s) {sorted(unknown)}; terms are {TERMS}")
        self.weights = {**DEFAULT_WEIGHTS, **dict(weights or {})}
        if any(w < 0 for w in self.weights.values()):
            raise ValueError(f"svg_fidelity weights must be >= 0, got {self.weights}")
        self.embedder = _resolve_embedder(embedder, embedder_kwargs)
        self.judge = _resolve_judge(judge)
        if (
            self.weights["image"]
            + self.weights["edge"]
            + (self.weights["semantic"] if self.embedder is not None else 0)
            + (self.weights["judge"] if self.judge is not None else 0)
            <= 0
        ):
            raise ValueError(
                "svg_fidelity needs a positive weight on 'image', 'edge', 'semantic' (with an embedder) "
                "or 'judge' (with a judge)"
            )
        if self.weights["match"] > 0 and self.embedder is None:
            raise ValueError(
                "svg_fidelity: the 'match' term needs an embedder (embedder: clip or a callable)"
            )
        if not 0 < match_threshold < 2:
            raise ValueError(f"svg_fidelity match_threshold must be in (0, 2), got {match_threshold}")
        self.match_threshold = float(match_threshold)
        if judge_log_floor is not None and not (math.isfinite(judge_log_floor) and judge_log_floor > 0):
            raise ValueError(f"svg_fidelity judge_log_floor must be None or > 0, got {judge_log_floor}")
        self.judge_log_floor = None if judge_log_floor is None else float(judge_log_floor)
        if self.weights["judge"] > 0 and self.judge is None:
            raise ValueError(
                "svg_fidelity: the 'judge' term needs a judge (a PairJudge folder or a callable)"
            )
        if length_margin is not None and not (math.isfinite(length_margin) and length_margin >= 0):
            raise ValueError(f"svg_fidelity length_margin must be None or >= 0, got {length_margin}")
        if not -1.0 <= min_reward <= 0.0:
            raise ValueError(f"min_reward must be in [-1, 0], got {min_reward}")
        low, high = edge_thresholds
        if not 0 < low <= high:
            raise ValueError(f"edge_thresholds must satisfy 0 < low <= high, got {edge_thresholds}")
        self.backend = backend
        self.limits = limits or RenderLimits()
        self.workers = workers
        self.pool = pool
        self.render_size = tuple(render_size)
        self.length_fn = length_function(length_tokenizer, length_fn, "svg_fidelity")
        self.clip_length = clip_length
        self.length_margin = None if length_margin is None else float(length_margin)
        self.min_reward = float(min_reward)
        self.edge_thresholds = (float(low), float(high))

    # -- inputs ------------------------------------------------------------------------------------
    def _render(self, svgs: Sequence[Any], height: int, width: int) -> list:
        return render_batch(svgs, width, height, self.backend, self.limits, self.workers, pool=self.pool)

    def _targets(self, batch: int, targets: Any, reference_svgs: Sequence[str] | None) -> torch.Tensor:
        if targets is None:
            if reference_svgs is None:
                raise ValueError("svg_fidelity needs metadata `targets` [B, 3, H, W] or `reference_svgs`")
            height, width = self.render_size
            results = self._render(reference_svgs, height, width)
            failed = [(i, r.error, r.detail) for i, r in enumerate(results) if not r.ok]
            if failed:
                raise ValueError(f"svg_fidelity: reference SVGs failed to render: {failed[:3]}")
            targets = torch.stack([r.image for r in results])
        if validate_images(targets) != batch:
            raise ValueError(f"svg_fidelity: got {batch} SVGs but {targets.shape[0]} targets")
        return targets.detach().float()

    def _reference_lengths(
        self, batch: int, reference_svgs: Sequence[str] | None, reference_lengths: Any
    ) -> torch.Tensor | None:
        if reference_lengths is None and reference_svgs is None:
            return None
        if reference_lengths is None:
            reference_lengths = [self.length_fn(svg) for svg in reference_svgs]
        lengths = torch.as_tensor(reference_lengths, dtype=torch.float64).flatten()
        if lengths.numel() != batch:
            raise ValueError(f"svg_fidelity: got {batch} SVGs but {lengths.numel()} reference lengths")
        if (lengths <= 0).any():
            raise ValueError("svg_fidelity: reference lengths must be positive")
        return lengths

    # -- scoring -----------------------------------------------------------------------------------
    def _judge_term(self, renders: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The judge's P(same) ``[b]`` and the ``judge`` term (module docstring) for ``b`` renders."""
        judge = getattr(self.judge, "probability", self.judge)
        if isinstance(self.judge, torch.nn.Module):  # a judge's own device, whatever the renders'
            device = next(self.judge.parameters()).device
            renders, targets = renders.to(device), targets.to(device)
        with torch.no_grad():
            probability = judge(renders, targets).float().flatten()
        if probability.numel() != renders.shape[0] or not torch.isfinite(probability).all():
            raise ValueError("svg_fidelity: the judge must return one finite probability per render")
        probability = probability.clamp(0.0, 1.0)
        if self.judge_log_floor is None:
            return probability, 2.0 * probability - 1.0
        log_p = probability.double().clamp_min(1e-300).log().clamp_min(-self.judge_log_floor)
        return probability, (1.0 + 2.0 * log_p / self.judge_log_floor).float()

    def score(
        self,
        images: Sequence[str],
        prompts: Sequence[str],
        targets: torch.Tensor | None = None,
        reference_svgs: Sequence[str] | None = None,
        reference_lengths: Sequence[float] | torch.Tensor | None = None,
        **metadata: Any,
    ) -> RewardOutput:
        svgs = list(images)
        batch = len(svgs)
        if reference_svgs is not None and len(reference_svgs) != batch:
            raise ValueError(f"svg_fidelity: got {batch} SVGs but {len(reference_svgs)} reference_svgs")
        targets = self._targets(batch, targets, reference_svgs)
        device = targets.device
        _, _, height, width = targets.shape
        reference = self._reference_lengths(batch, reference_svgs, reference_lengths)

        # 1. render (in worker processes, with timeouts); failures are reason codes
        results = self._render(svgs, height, width)
        failure = [r.error for r in results]
        ok = torch.tensor([r.ok for r in results], dtype=torch.bool, device=device)
        ok_index = ok.nonzero().flatten()  # (b,) on the targets' device

        # 2. the terms, on the renders that succeeded
        active = {k: w for k, w in self.weights.items() if w > 0}
        if self.embedder is None:
            active.pop("semantic", None)
            active.pop("match", None)
        if reference is None:
            active.pop("length", None)
        if self.judge is None:
            active.pop("judge", None)
        floor = self.min_reward
        terms = {name: torch.full((batch,), floor, device=device) for name in active}
        raw = {
            "image_mse": torch.full((batch,), math.nan, device=device),
            "edge_mse": torch.full((batch,), math.nan, device=device),
            "cosine": torch.full((batch,), math.nan, device=device),
            "judge_probability": torch.full((batch,), math.nan, device=device),
        }
        if len(ok_index):
            renders = torch.stack([results[i].image for i in ok_index.tolist()]).to(device)  # (b, 3, H, W)
            wanted = targets[ok_index]
            reward, mse = normalized_l2_reward(renders, wanted)
            raw["image_mse"][ok_index] = mse
            if "image" in active:
                terms["image"][ok_index] = reward
            low, high = self.edge_thresholds
            reward, mse = normalized_l2_reward(edge_map(renders, low, high), edge_map(wanted, low, high))
            raw["edge_mse"][ok_index] = mse
            if "edge" in active:
                terms["edge"][ok_index] = reward
            if self.embedder is not None:
                encode = getattr(self.embedder, "encode_images", self.embedder)
                reward, cosine = embedding_reward(encode, renders, wanted)
                raw["cosine"][ok_index] = cosine.to(device)
                if "semantic" in active:
                    terms["semantic"][ok_index] = reward.to(device)
                if "match" in active:
                    terms["match"][ok_index] = (1.0 - cosine < self.match_threshold).float().to(device)
            if self.judge is not None:
                probability, value = self._judge_term(renders, wanted)
                raw["judge_probability"][ok_index] = probability.to(device)
                if "judge" in active:
                    terms["judge"][ok_index] = value.to(device)
        lengths = torch.tensor(
            [self.length_fn(s) if isinstance(s, str) else 0 for s in svgs], dtype=torch.float64
        )
        if reference is not None:
            raw["length_ratio"] = (lengths / reference).float().to(device)
            raw["length_ratio"][~ok] = math.nan
            if "length" in active:
                free = 0.5 if self.length_margin is None else 1.0 + self.length_margin
                low = floor if self.clip_length else None
                value = length_reward(lengths, reference, low=low, free_fraction=free).to(device)  # (B,)
                terms["length"][ok_index] = value[ok_index]

        # 3. weighted average of the active terms (RLRF's weighted sum, normalised)
        total = sum(active.values())
        scores = sum(active[name] * terms[name] for name in active) / total
        scores = torch.where(ok, scores, torch.full_like(scores, floor))
        failures = [f for f in failure if f is not None]
        if failures:
            logger.debug(
                "svg_fidelity: %d of %d SVGs failed: %s", len(failures), batch, sorted(set(failures))
            )
        details: dict[str, Any] = {**terms, **raw}
        details.update(
            failure=failure,
            failure_count=len(failures),
            render_backend=[r.backend for r in results],
            weights=dict(active),
        )
        return RewardOutput(scores.float(), details)

    def extra_repr(self) -> str:
        margin = "" if self.length_margin is None else f", length_margin={self.length_margin}"
        match = f", match_threshold={self.match_threshold}" if self.weights["match"] > 0 else ""
        return (
            f"weights={self.weights}, backend={self.backend!r}, min_reward={self.min_reward}{margin}{match}"
        )
