"""``genalign reno`` and ``genalign rlg`` on tiny models, end to end."""

from __future__ import annotations

import pytest
from diffusers import StableDiffusionPipeline
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

from genalign.cli import main
from genalign.tiny.clip import clip_model
from genalign.tiny.diffusion import sd_pipeline


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


@pytest.mark.parametrize(
    "model, extra",
    [
        ("tiny:lcm", ["--guidance-scale", "1.5"]),
        ("tiny:sdxl", []),
        ("tiny:flux", ["--height", "32", "--width", "32", "--guidance-scale", "3.5"]),
        ("tiny:pixart", []),
    ],
)
def test_reno_cli(model, extra, tmp_path, capsys):
    clip_model(seed=0, save_to=tmp_path / "clip")
    args = ["reno", model, "--prompt", "a red circle", "--out", str(tmp_path / "out"), *extra]
    args += ["--reward", "clip=2.0", "--iterations", "3", "--device", "cpu"]
    for option in ("backend=transformers", f"model={tmp_path / 'clip'}", "convention=cosine"):
        args += ["--reward-arg", f"clip.{option}"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "best" in printed and (tmp_path / "out" / "grid.png").is_file()
    assert (tmp_path / "out" / "sample-0000.png").is_file()


def test_reno_cli_refuses_non_differentiable(tmp_path, capsys):
    args = ["reno", "tiny:lcm", "--prompt", "x", "--out", str(tmp_path), "--reward", "jpeg_compressibility=1"]
    assert main([*args, "--device", "cpu"]) == 2
    assert "not differentiable" in capsys.readouterr().err


def test_rlg_cli(tmp_path, capsys):
    pipe = sd_pipeline(seed=0)
    pipe.unet.add_adapter(LoraConfig(r=4, target_modules=["to_q", "to_v"], init_lora_weights=False))
    StableDiffusionPipeline.save_lora_weights(
        tmp_path / "lora", unet_lora_layers=get_peft_model_state_dict(pipe.unet)
    )
    args = ["rlg", "tiny:sd", "--rl-lora", str(tmp_path / "lora"), "--rlg-scale", "1.5"]
    args += ["--prompt", "a red circle", "--out", str(tmp_path / "out"), "--steps", "2", "--device", "cpu"]
    assert main(args) == 0
    assert "rlg_scale=1.5" in capsys.readouterr().out
    assert (tmp_path / "out" / "grid.png").is_file()
