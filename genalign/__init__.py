"""genalign: align image, SVG and video generators with reward models.

A policy produces trajectories with log-probabilities; a reward scores what they produce; a
trainer turns scores into updates. See the README and DESIGN notes for the layout.
"""

from __future__ import annotations

__version__ = "0.1.0"
