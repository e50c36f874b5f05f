"""SVG rewards: safe rendering and the RLRF rendering-feedback reward.

- :mod:`~genalign.rewards.svg.sanitize` -- hardened parsing and the reference / size policy.
- :mod:`~genalign.rewards.svg.render` -- cairosvg (reference) and skia (fast) rasterisation.
- :mod:`~genalign.rewards.svg.pool` -- rendering in worker processes with per-render timeouts.
- :mod:`~genalign.rewards.svg.extract` -- the SVG document inside a model's completion (fences,
  trailing text, a root never closed).
- :mod:`~genalign.rewards.svg.fidelity` -- ``svg_fidelity``: RLRF's image, edge, semantic and
  length rewards (Rodriguez et al. 2025, Sec. 3).
- :mod:`~genalign.rewards.svg.rendered` -- ``svg_render``: any image reward on each SVG's render
  (text-to-SVG rewards).
"""

from __future__ import annotations

from genalign.rewards.svg.extract import SVGExtraction, extract_svg, extract_svg_details
from genalign.rewards.svg.fidelity import SVGFidelityReward, canny_edges, length_reward, normalized_l2_reward
from genalign.rewards.svg.pool import SVGRenderPool, render_batch, render_svg, shared_pool
from genalign.rewards.svg.render import BACKENDS, RenderResult, render_local
from genalign.rewards.svg.rendered import SVGRenderedReward
from genalign.rewards.svg.sanitize import RenderLimits, SanitizedSVG, SVGRejected, sanitize_svg

__all__ = [
    "BACKENDS",
    "RenderLimits",
    "RenderResult",
    "SVGExtraction",
    "SVGFidelityReward",
    "SVGRejected",
    "SVGRenderPool",
    "SVGRenderedReward",
    "SanitizedSVG",
    "canny_edges",
    "extract_svg",
    "extract_svg_details",
    "length_reward",
    "normalized_l2_reward",
    "render_batch",
    "render_local",
    "render_svg",
    "sanitize_svg",
    "shared_pool",
]
