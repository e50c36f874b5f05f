"""The CLI starts without third-party notices a user cannot act on (issue 23)."""

from __future__ import annotations

import logging
import subprocess
import sys

from genalign.utils.quiet import STARTUP_NOISE, silence_startup_noise


def test_only_the_listed_messages_are_dropped(caplog):
    silence_startup_noise()
    silence_startup_noise()  # idempotent
    for name, fragments in STARTUP_NOISE.items():
        logger = logging.getLogger(name)
        with caplog.at_level(logging.WARNING, logger=name):
            caplog.clear()
            logger.warning("X %s Y", fragments[0])
            logger.warning("something a user should see")
        assert [r.getMessage() for r in caplog.records] == ["something a user should see"], name


def test_importing_the_model_libraries_after_the_cli_prints_no_startup_notice():
    code = (
        "import genalign.cli as c; from genalign.utils.quiet import silence_startup_noise; "
        "silence_startup_noise(); import diffusers; from diffusers import StableDiffusionPipeline; "
        "from transformers import CLIPTextModel"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for fragments in STARTUP_NOISE.values():
        for fragment in fragments:
            assert fragment not in out.stderr, out.stderr


def test_importing_the_python_api_prints_no_startup_notice():
    """A library user (no CLI) who imports the trainer, which imports diffusers and transformers."""
    code = "import genalign.trainers.trainer; from genalign.pipelines import RLGPipeline"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for fragments in STARTUP_NOISE.values():
        for fragment in fragments:
            assert fragment not in out.stderr, out.stderr
