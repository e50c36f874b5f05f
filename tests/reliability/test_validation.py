"""Validation gaps closed, each with the message a user needs (issue 23.7)."""

from __future__ import annotations

import pytest

from genalign.cli import main
from genalign.config import ConfigError
from genalign.trainers import load_recipe
from genalign.trainers.checkpoint import RecipeMismatchError

from .conftest import TINY_SD, make_trainer


@pytest.mark.parametrize(
    "override,message",
    [
        ("logging.keep_last=0", "logging.keep_last must be >= 1"),
        ("logging.keep_last=-2", "logging.keep_last must be >= 1"),
        ("logging.checkpoint_every=-1", "logging.checkpoint_every must be >= 0"),
        ("logging.sample_every=-5", "logging.sample_every must be >= 0"),
    ],
)
def test_impossible_logging_options_fail_at_load(override, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(TINY_SD, [override])


def test_editing_the_prompt_file_changes_the_fingerprint(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\na blue square\n")
    recipe = ["prompts.prompts=[]", f"prompts.file={prompts}", "train.num_steps=1"]
    first = make_trainer(tmp_path / "run", *recipe)
    first.train()
    prompts.write_text("a red circle\na green triangle\n")
    resumed = make_trainer(tmp_path / "run", *recipe, "logging.resume=latest")
    assert resumed.fingerprint != first.fingerprint
    with pytest.raises(RecipeMismatchError, match="another recipe"):
        resumed.train()


def test_sample_height_not_a_multiple_of_the_vae_factor(tmp_path, capsys, monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))
    argv = ["sample", "tiny:sd", "--prompt", "x", "--steps", "1", "--height", "33", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "height 33 is not a positive multiple of" in err and "use 32 or" in err
    assert not list(tmp_path.glob("*.png"))
