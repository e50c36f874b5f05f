"""``genalign convert-ar-video``: an official causal-Wan checkpoint (Wan2.1's original key layout
under the wrapper's ``model.`` prefix, in ``generator_ema``) becomes an ``ar_video`` folder whose
transformer holds exactly those weights, with the base folder's other components."""

from __future__ import annotations

import os

import pytest
import torch

from genalign.cli import main
from genalign.policies import load_policy
from genalign.policies.ar_video_convert import causal_wan_state_dict, convert_causal_wan

# diffusers' Wan names -> Wan2.1's original ones (the official repo's WanModel), written out here
# independently of diffusers' converter, in the order they must be applied
TO_ORIGINAL = [
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    ("attn1.", "self_attn."),
    ("attn2.", "cross_attn."),
    (".to_out.0.", ".o."),
    (".to_q.", ".q."),
    (".to_k.", ".k."),
    (".to_v.", ".v."),
    ("ffn.net.0.proj", "ffn.0"),
    ("ffn.net.2", "ffn.2"),
    (".norm2.", ".norm3."),  # diffusers' cross-attention norm is the original norm3
    ("proj_out", "head.head"),
]


def to_original(name: str) -> str:
    if name == "scale_shift_table":
        return "head.modulation"
    for new, old in TO_ORIGINAL:
        name = name.replace(new, old)
    return name.replace(".scale_shift_table", ".modulation")


@pytest.fixture(scope="module")
def base_and_source(tmp_path_factory):
    os.environ["GENALIGN_TINY_CACHE"] = str(tmp_path_factory.getbasetemp() / "tiny-cache")
    from genalign.tiny import ar_video_pipeline

    base = tmp_path_factory.mktemp("wan-base")
    pipe = ar_video_pipeline()
    pipe.save_pretrained(base)
    source = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    generator = torch.Generator().manual_seed(7)
    source = {k: torch.randn(v.shape, generator=generator) for k, v in source.items()}  # not the base's
    return base, source


def official_checkpoint(path, source, drop: str | None = None):
    ema = {f"model.{to_original(k)}": v for k, v in source.items() if k != drop}
    other = {k: torch.zeros_like(v) for k, v in ema.items()}
    torch.save({"generator": other, "generator_ema": ema, "step": torch.tensor(3)}, path)
    return path


def test_the_original_names_map_back_onto_diffusers(base_and_source):
    _, source = base_and_source
    original = {f"model.{to_original(k)}": v for k, v in source.items()}
    assert any(".self_attn.q." in k for k in original) and "model.head.head.weight" in original
    converted = causal_wan_state_dict({"generator_ema": original})
    assert sorted(converted) == sorted(source)
    assert all(torch.equal(converted[k], source[k]) for k in source)
    # a bare state dict under ComfyUI's prefix converts the same
    bare = {f"model.diffusion_model.{to_original(k)}": v for k, v in source.items()}
    assert sorted(causal_wan_state_dict(bare)) == sorted(source)


def test_convert_writes_an_ar_video_folder_with_the_checkpoint_weights(base_and_source, tmp_path):
    base, source = base_and_source
    checkpoint = official_checkpoint(tmp_path / "self_forcing_dmd.pt", source)
    out = convert_causal_wan(checkpoint, tmp_path / "model", base=base, num_frame_per_block=2)
    policy = load_policy("ar_video", str(out))
    loaded = policy.denoiser.state_dict()
    assert all(torch.equal(loaded[k], source[k]) for k in source)  # generator_ema, not generator
    assert policy.block_size == 2
    video = policy.rollout(["a red circle"], generator=0, num_frames=4, height=32, width=32).images
    assert video.shape[:2] == (1, 1 + 3 * policy.temporal_factor) and torch.isfinite(video).all()
    # framewise Causal Forcing: blocks of one latent frame
    framewise = load_policy(
        "ar_video", str(convert_causal_wan(checkpoint, tmp_path / "fw", base=base, num_frame_per_block=1))
    )
    assert framewise.block_size == 1
    video = framewise.rollout(["a red circle"], generator=0, num_frames=3, height=32, width=32).images
    assert video.shape[:2] == (1, 1 + 2 * framewise.temporal_factor) and torch.isfinite(video).all()
    # the plain generator on request
    out = convert_causal_wan(checkpoint, tmp_path / "raw", base=base, num_frame_per_block=2, key="generator")
    assert all(v.abs().sum() == 0 for v in load_policy("ar_video", str(out)).denoiser.state_dict().values())


def test_bad_checkpoints_are_one_line_errors_naming_what_is_wrong(base_and_source, tmp_path, capsys):
    base, source = base_and_source
    dropped = "blocks.1.ffn.net.2.weight"
    checkpoint = official_checkpoint(tmp_path / "partial.pt", source, drop=dropped)
    with pytest.raises(ValueError, match=f"missing \\['{dropped}'\\] \\(1\\)"):
        convert_causal_wan(checkpoint, tmp_path / "x", base=base, num_frame_per_block=2)
    with pytest.raises(ValueError, match="num_frame_per_block 0: a block holds at least one latent frame"):
        convert_causal_wan(checkpoint, tmp_path / "x", base=base, num_frame_per_block=0)
    torch.save({"optimizer": {"lr": 1.0}}, tmp_path / "empty.pt")
    code = main(
        ["convert-ar-video", str(tmp_path / "empty.pt"), "--out", str(tmp_path / "y"), "--base", str(base)]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "no generator weights" in err and "optimizer" in err
    code = main(["convert-ar-video", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "y")])
    assert code == 2 and "nope.pt: no such checkpoint file" in capsys.readouterr().err


def test_the_command_converts(base_and_source, tmp_path, capsys):
    base, source = base_and_source
    checkpoint = official_checkpoint(tmp_path / "longlive_base.pt", source)
    args = [
        "convert-ar-video",
        str(checkpoint),
        "--out",
        str(tmp_path / "m"),
        "--base",
        str(base),
        "--block",
        "2",
    ]
    assert main(args) == 0 and "wrote" in capsys.readouterr().out
    assert torch.equal(
        load_policy("ar_video", str(tmp_path / "m")).denoiser.proj_out.weight, source["proj_out.weight"]
    )
