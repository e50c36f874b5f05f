"""genalign: align image, SVG and video generators with reward models.

A policy produces trajectories with log-probabilities; a reward scores what they produce; a
trainer turns scores into updates. See the README and DESIGN notes for the layout.
"""

from __future__ import annotations

__version__ = "0.1.0"

# Before any submodule imports diffusers / transformers: drop the two torchao start-up notices a
# user cannot act on (genalign.utils.quiet says which), for the Python API as for the CLI.
from genalign.utils.quiet import silence_startup_noise as _silence_startup_noise  # noqa: E402

_silence_startup_noise()
