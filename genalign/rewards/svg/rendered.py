"""``svg_render``: any image reward, scored on the render of each SVG (text-to-SVG rewards).

Text-to-SVG has no target image to compare a render with, so the rewards the field trains it on
score the render against the text: RLRF trains its text-to-SVG models on rendering feedback
(Rodriguez et al. 2025, arXiv 2505.20793, the Text2SVG experiments); SGP-GenBench's RL
(arXiv 2509.05208) gates on a valid render and then pays a text-image encoder's similarity (SigLIP);
Reason-SVG (arXiv 2505.24499) likewise pays a CLIP score of the render. This wrapper gives every
registered image reward that form::

    reward = load_reward("svg_render", reward="vlm_yes", kwargs={"model": "assets/models/toy-vlm"})
    out = reward(svgs, captions)      # svgs: a list of SVG strings
    out.scores                        # [B]: the image reward of each render, or min_reward

Each SVG is rendered by the same safe pool as ``svg_fidelity`` (sanitised, in worker processes,
with a per-render timeout; :func:`genalign.rewards.svg.render_batch`). An SVG that is rejected,
does not render, times out or renders blank scores ``min_reward`` and is never shown to the image
reward; the reason is in ``details["failure"]`` and the count in ``details["failure_count"]``
(DESIGN.md, "Rewards": bad input gets a defined penalty, never a crash). The image reward sees only
the renders that succeeded, with their prompts and the metadata rows named in ``metadata_keys``
(e.g. ``specs`` for the toy world's ``shapes_eval``).

A text-image judge does not mind objects the text did not ask for, and a writer can hedge by
drawing several candidates (a diamond in each colour for "a blue diamond"). RLRF's code-efficiency
term is the field's check on that, and the training data of text-to-SVG has the reference SVG it
needs: with ``length_weight`` w > 0 the score is ``image reward + w * R_len``, with RLRF's length
term ``R_len`` (:func:`genalign.rewards.svg.fidelity.length_reward`, in characters) in its
one-sided form: free up to ``(1 + length_margin)`` times the reference SVG's length (metadata
``reference_svgs``, which the ``svg`` strategy hands over), then a quadratic penalty, clipped at -1.
``length_form="absolute"`` uses the project page's form instead
(:func:`genalign.rewards.svg.fidelity.absolute_length_reward`): linear in the distance from the
reference length, on both sides, free within ``length_margin``; one extra shape then costs its
share of the reference however many objects the caption asks for.
A failed SVG then gets the floor of both parts, ``min_reward - w`` (as ``svg_fidelity`` gives a
failed SVG ``min_reward`` on every term), so no SVG that renders, however long, scores below one
that does not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from genalign.rewards.base import Reward, RewardOutput, load_image_reward, register_reward
from genalign.rewards.svg.fidelity import absolute_length_reward, length_reward
from genalign.rewards.svg.length_unit import length_function
from genalign.rewards.svg.pool import SVGRenderPool, render_batch
from genalign.rewards.svg.sanitize import RenderLimits

__all__ = ["SVGRenderedReward"]


def _rows(value: Any, index: list[int]) -> Any:
    """The rows ``index`` of a per-sample metadata value (a list or a tensor)."""
    if torch.is_tensor(value):
        return value[index]
    return [value[i] for i in index]


@register_reward("svg_render")
class SVGRenderedReward(Reward):
    """An image reward on the render of each SVG (module docstring).

    Args:
        reward: the image reward: a registered name, a ``Reward``, or ``{"name", "kwargs"}``.
        kwargs: keyword arguments of a reward given by name.
        canvas: the render's size in pixels, an int (square) or ``(height, width)``; the toy
            world's scenes are 32 px.
        min_reward: the score of an SVG that fails to render or renders blank. It should lie below
            every score the image reward gives (VQAScore and the toy verifier: 0 and up).
        metadata_keys: per-sample metadata handed to the image reward (its rows of the rendered
            SVGs); other metadata (the ``svg`` strategy's ``targets``, ``reference_svgs``) is not.
        length_weight: the weight of RLRF's one-sided length term (0: off; needs metadata
            ``reference_svgs``).
        length_margin: the term's free margin over the reference length (0.1: 10% longer is free;
            with ``length_form="absolute"``, 10% longer or shorter).
        length_form: ``"one_sided"`` (free up to ``1 + length_margin`` times the reference, then
            quadratic: Sec. 3.2's form with the free zone moved) or ``"absolute"`` (the project
            page's ``-|L - L_ref|``, normalised: linear on both sides).
        length_tokenizer: a tokenizer folder or hub id: lengths in its tokens, RLRF's unit
            (default: characters).
        backend, limits, workers, pool: the renderer's, as ``svg_fidelity``'s.

    ``details``: ``length`` ``[B]`` (the length term when weighted; -1 at the failed rows),
    ``rendered`` ``[B]`` (1.0 where the SVG rendered), ``failure`` (reason codes or None),
    ``failure_count``, and the image reward's per-sample tensors under ``image/<key>`` (0 at the
    failed rows).
    """

    input_kind = "svg"

    def __init__(
        self,
        reward: str | Reward | Mapping[str, Any],
        kwargs: Mapping[str, Any] | None = None,
        canvas: int | Sequence[int] = 32,
        min_reward: float = -1.0,
        metadata_keys: Sequence[str] = (),
        length_weight: float = 0.0,
        length_margin: float = 0.1,
        length_form: str = "one_sided",
        length_tokenizer: str | None = None,
        backend: str = "cairosvg",
        limits: RenderLimits | None = None,
        workers: int | None = None,
        pool: SVGRenderPool | None = None,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        image_reward = load_image_reward(reward, kwargs, "svg_render")
        size = (canvas, canvas) if isinstance(canvas, int) else tuple(canvas)
        if len(size) != 2 or any(not isinstance(s, int) or s <= 0 for s in size):
            raise ValueError(f"svg_render: canvas must be a positive int or (height, width), got {canvas!r}")
        if not math.isfinite(min_reward):
            raise ValueError(f"svg_render: min_reward must be finite, got {min_reward}")
        if not (math.isfinite(length_weight) and length_weight >= 0):
            raise ValueError(f"svg_render: length_weight must be >= 0, got {length_weight}")
        if not (math.isfinite(length_margin) and length_margin >= 0):
            raise ValueError(f"svg_render: length_margin must be >= 0, got {length_margin}")
        if length_form not in ("one_sided", "absolute"):
            raise ValueError(
                f"svg_render: length_form must be 'one_sided' or 'absolute', got {length_form!r}"
            )
        if isinstance(metadata_keys, str):
            metadata_keys = [metadata_keys]
        self.image_reward = image_reward
        self.height, self.width = size
        self.min_reward = float(min_reward)
        self.metadata_keys = tuple(metadata_keys)
        self.length_weight, self.length_margin = float(length_weight), float(length_margin)
        self.length_form = length_form
        self.length_fn = length_function(length_tokenizer, owner="svg_render")
        self.backend = backend
        self.limits = limits or RenderLimits()
        self.workers = workers
        self.pool = pool

    def score(self, images: Sequence[str], prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        svgs = list(images)
        missing = [key for key in self.metadata_keys if key not in metadata]
        if missing:
            raise ValueError(
                f"svg_render: metadata_keys {missing} are not in the call's metadata "
                f"(it has {sorted(metadata)})"
            )
        lengths = self._length_term(svgs, metadata.get("reference_svgs"))
        results = render_batch(
            svgs, self.width, self.height, self.backend, self.limits, self.workers, pool=self.pool
        )
        ok = torch.tensor([r.ok for r in results], dtype=torch.bool)
        scores = torch.full((len(svgs),), self.min_reward)
        details: dict[str, Any] = {}
        index = ok.nonzero().flatten().tolist()
        if index:
            renders = torch.stack([results[i].image for i in index]).float()
            extra = {key: _rows(metadata[key], index) for key in self.metadata_keys}
            out = self.image_reward(renders, [prompts[i] for i in index], **extra)
            scores[index] = out.scores.detach().float().cpu()
            for key, value in out.details.items():
                if torch.is_tensor(value) and value.shape == (len(index),):
                    full = torch.zeros(len(svgs), dtype=torch.float32)
                    full[index] = value.detach().float().cpu()
                    details[f"image/{key}"] = full
        if lengths is not None:  # a failed SVG gets the length term's floor too
            lengths = torch.where(ok, lengths, torch.full_like(lengths, -1.0))
            scores += self.length_weight * lengths
            details["length"] = lengths
        failure = [r.error for r in results]
        details |= {
            "rendered": ok.float(),
            "failure": failure,
            "failure_count": sum(f is not None for f in failure),
        }
        return RewardOutput(scores, details)

    def _length_term(self, svgs: list[str], reference_svgs: Sequence[str] | None) -> torch.Tensor | None:
        if self.length_weight == 0:
            return None
        if reference_svgs is None or len(reference_svgs) != len(svgs):
            raise ValueError(
                "svg_render: length_weight > 0 needs metadata `reference_svgs`, one per SVG (the svg "
                "strategy hands over the pool's)"
            )
        lengths = torch.tensor([float(self.length_fn(svg)) for svg in svgs])
        reference = torch.tensor([float(self.length_fn(svg)) for svg in reference_svgs])
        if self.length_form == "absolute":
            return absolute_length_reward(lengths, reference, margin=self.length_margin, low=-1.0)
        return length_reward(lengths, reference, low=-1.0, free_fraction=1.0 + self.length_margin)

    def extra_repr(self) -> str:
        return (
            f"reward={self.image_reward.name!r}, canvas=({self.height}, {self.width}), "
            f"min_reward={self.min_reward}"
        )
