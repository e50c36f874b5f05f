"""The toy world's verifier as an SVG reward: the oracle control run of RLRF on toy scenes.

ShapesEval (:mod:`genalign.toy.shapes_eval`) judges an *image* against its prompt's spec. For an
SVG writer the image is the render of its SVG: this reward renders each SVG with the same safe
pool as ``svg_fidelity`` (:func:`genalign.rewards.svg.render_batch`), then applies ShapesEval with
the scene's spec (``metadata["specs"]``, one dict per SVG: ``toy_svg_pool(specs=True)`` adds the
column and the ``svg`` strategy hands it over). It is the SVG counterpart of ``genalign demo
--oracle``: RL on the verifier itself bounds what any learned reward could give a recipe and a
budget, so a run that does not gain with it has a problem no reward can fix (issue #25). It is a
diagnostic, never the reward of a reported result: ``genalign eval-svg`` scores with the same
verifier.

Modes (as ``genalign.toy.demo.ORACLE_REWARDS``): ``correct`` (GenEval's 0/1), ``partial`` (the
fraction of atomic checks passed) and ``mixed`` (``correct + 0.5 * partial``: a correct render
always outscores a wrong one, and wrong ones are ranked by how close they came). An SVG that does
not render, or renders blank, scores ``min_reward`` and is counted in ``failure_count``.

``scene`` closes a hole the other modes leave open for image-to-SVG. ShapesEval asks for *at
least* ``count`` objects, as GenEval does, so a writer can pass more specs by adding shapes:
from a writer SFT'd on 256 labelled scenes, RL on ``mixed`` raised ShapesEval on held-out
scenes by 8 points while the renders gained 0.5 objects a scene and the share that reproduce the
target's objects fell from 11% to 2% (docs/language.md section 5.5). ``scene`` compares the
render with the target image too (``metadata["targets"]``, which the ``svg`` strategy hands over;
:func:`genalign.toy.detection.compare_objects`): ``correct * match + 0.5 * partial - 0.5 *
extra``, where ``match`` is 1 when the render holds exactly the target's objects and ``extra``
counts the objects it holds beyond them. A right render scores 1.5; a wrong one at most 0.5, and
an added object costs what a fully passed spec pays, so writing two candidate shapes where one is
wanted never beats a single wrong guess. (A first version paid ``0.25 (partial + object F1)`` and
was hedged that way: RL on it added 0.27 objects a scene.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from genalign.rewards.base import Reward, RewardOutput
from genalign.rewards.svg import RenderLimits, render_batch
from genalign.toy.detection import compare_objects, scene_objects
from genalign.toy.shapes_eval import ShapesEvalReward

__all__ = ["SVGVerifierReward"]

MODES = ("correct", "partial", "mixed", "scene")


class SVGVerifierReward(Reward):
    """ShapesEval on the render of each SVG (module docstring).

    Args:
        mode: ``correct``, ``partial``, ``mixed`` or ``scene`` (needs ``targets``).
        canvas: render size in pixels (the toy scenes' ``canvas``, 32).
        min_reward: the score of an SVG that fails to render or renders blank.
        backend, limits, workers, pool: the renderer's, as ``svg_fidelity``'s.

    Scores ``[B]``; ``details``: ``correct`` and ``partial`` ``[B]`` (0 for a failed render), in
    ``scene`` mode also ``scene_match`` and ``extra_objects`` ``[B]``,
    ``failure`` (reason codes or None) and ``failure_count``.
    """

    name = "toy_svg_verifier"
    input_kind = "svg"

    def __init__(
        self,
        mode: str = "mixed",
        canvas: int = 32,
        min_reward: float = -1.0,
        backend: str = "cairosvg",
        limits: RenderLimits | None = None,
        workers: int | None = None,
        pool: Any = None,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        if mode not in MODES:
            raise ValueError(f"toy_svg_verifier: mode must be one of {MODES}, got {mode!r}")
        if canvas <= 0:
            raise ValueError(f"toy_svg_verifier: canvas must be positive, got {canvas}")
        self.mode = mode
        self.canvas = int(canvas)
        self.min_reward = float(min_reward)
        self.backend = backend
        self.limits = limits or RenderLimits()
        self.workers = workers
        self.pool = pool
        self.verifier = ShapesEvalReward(partial=True)

    def score(
        self,
        images: Sequence[str],
        prompts: Sequence[str],
        specs: Sequence[Any] | None = None,
        targets: torch.Tensor | None = None,
        **metadata: Any,
    ) -> RewardOutput:
        svgs = list(images)
        if specs is None:
            raise ValueError(
                "toy_svg_verifier needs metadata `specs` (one ShapesEval spec per SVG): build the "
                "pool with genalign.toy.svg_tasks:toy_svg_pool and source_kwargs.specs: true"
            )
        if len(specs) != len(svgs):
            raise ValueError(f"toy_svg_verifier: got {len(svgs)} SVGs but {len(specs)} specs")
        if self.mode == "scene" and (targets is None or len(targets) != len(svgs)):
            raise ValueError(
                "toy_svg_verifier mode 'scene' needs metadata `targets` (one target image per SVG; "
                "the svg strategy passes each image-to-SVG input's image)"
            )
        results = render_batch(
            svgs, self.canvas, self.canvas, self.backend, self.limits, self.workers, pool=self.pool
        )
        ok = torch.tensor([r.ok for r in results], dtype=torch.bool)
        correct = torch.zeros(len(svgs))
        partial = torch.zeros(len(svgs))
        index = ok.nonzero().flatten().tolist()
        if index:
            renders = torch.stack([results[i].image for i in index])
            out = self.verifier(renders, [prompts[i] for i in index], specs=[specs[i] for i in index])
            correct[index] = out.details["correct"].float()
            partial[index] = out.details["partial"].float()
        details: dict[str, Any] = {"correct": correct, "partial": partial}
        if self.mode == "scene":
            match, extra = torch.zeros(len(svgs)), torch.zeros(len(svgs))
            pixels = targets.detach().float().cpu()
            wanted: dict[bytes, list] = {}  # a group's samples share one target: read it once
            for i in index:
                key = pixels[i].numpy().tobytes()
                if key not in wanted:
                    wanted[key] = scene_objects(pixels[i])
                comparison = compare_objects(scene_objects(results[i].image), wanted[key])
                match[i], extra[i] = float(comparison.match), float(comparison.extra)
            value = correct * match + 0.5 * partial - 0.5 * extra
            details |= {"scene_match": match, "extra_objects": extra}
        else:
            value = {"correct": correct, "partial": partial, "mixed": correct + 0.5 * partial}[self.mode]
        scores = torch.where(ok, value, torch.full_like(value, self.min_reward))
        failure = [r.error for r in results]
        details |= {"failure": failure, "failure_count": sum(f is not None for f in failure)}
        return RewardOutput(scores, details)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, canvas={self.canvas}, min_reward={self.min_reward}"
