"""The command line: list, sample from every tiny family, clear errors."""

from __future__ import annotations

import pytest
from PIL import Image

from genalign.cli import main


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def test_list_shows_families_rewards_and_methods(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in (
        "sd",
        "flow",
        "consistency",
        "clip",
        "jpeg_compressibility",
        "ddpo",
        "flow_grpo",
        "ppo_clip",
    ):
        assert name in out


@pytest.mark.parametrize("name", ["sd", "sdxl", "sd3", "flux", "sana", "lcm"])
def test_sample_writes_images_and_a_grid(tmp_path, name, capsys):
    out = tmp_path / name
    args = [
        "sample",
        f"tiny:{name}",
        "--prompt",
        "a red circle",
        "--prompt",
        "a blue square",
        "--num-images",
        "2",
        "--steps",
        "2",
        "--out",
        str(out),
    ]
    if name == "flux":
        args += ["--height", "32", "--width", "32"]
    assert main(args) == 0
    pngs = sorted(out.glob("sample-*.png"))
    assert len(pngs) == 4
    assert (out / "grid.png").is_file()
    assert Image.open(pngs[0]).mode == "RGB"
    assert "wrote 4 images" in capsys.readouterr().out


def test_unknown_family_and_missing_folder_fail_with_a_message(tmp_path, capsys):
    assert main(["sample", "tiny:sd", "--family", "gan", "--prompt", "x", "--out", str(tmp_path)]) == 2
    assert "unknown policy family 'gan'" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_help_imports_no_heavy_package():
    """`genalign --help` (building the parser) must not import torch, diffusers or transformers:
    a --device default or a constant taken from a module that does made it take 18 s."""
    import subprocess
    import sys

    code = (
        "import sys; from genalign.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_overrides_may_follow_a_commands_options(capsys):
    from genalign.cli import build_parser, parse_command_line

    parser = build_parser()
    args = parse_command_line(parser, ["demo", "r.yaml", "a.b=1", "--eval-every", "5", "c=-2", "d=x"])
    assert (args.config, args.eval_every, args.overrides) == ("r.yaml", 5, ["a.b=1", "c=-2", "d=x"])
    args = parse_command_line(parser, ["train", "r.yaml", "a=1"])
    assert args.overrides == ["a=1"]
    for bad in (
        ["demo", "r.yaml", "--eval-every", "5", "--bogus"],
        ["demo", "r.yaml", "--eval-every", "5", "x"],
    ):
        with pytest.raises(SystemExit):
            parse_command_line(parser, bad)
        assert "unrecognized arguments" in capsys.readouterr().err
