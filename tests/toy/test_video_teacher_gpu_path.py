"""The pieces that let toy-ar-video's teacher train on another machine (a GPU box without the SVG
rasteriser): the compressed video pack, the noise drawn on the latents' device, the cosine that
ends with a time budget, and the CLI's --videos / --eval-per-prompt 0 / toy-ar-video-card."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest
import torch

from genalign.toy.generators.video import build_video_transformer, build_video_vae
from genalign.toy.generators.video_train import VIDEO_DATA_SEED_OFFSET, diffusion_forcing_loss
from genalign.toy.training import step_schedule
from genalign.toy.video.data import load_video_pack, save_video_pack, toy_video_dataset

ROOT = Path(__file__).resolve().parents[2]
TOY_CLIP = ROOT / "assets" / "models" / "toy-clip"


def _tiny_vae_and_pack(tmp_path: Path) -> Path:
    """A tiny seeded autoencoder in ``tmp_path/vae`` (as video-vae writes it) and a 4-video pack;
    returns the pack's path."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = build_video_vae(z_dim=4, base_dim=4).eval()
    vae.save_pretrained(tmp_path / "vae")
    (tmp_path / "vae" / "training.json").write_text(json.dumps({"commands": ["video-vae ..."]}))
    pack = tmp_path / "pack.xz"
    save_video_pack(pack, *toy_video_dataset(4, seed=5))
    return pack


def test_a_video_pack_round_trips_exactly_and_compresses(tmp_path):
    videos, captions = toy_video_dataset(12, seed=4)
    path = tmp_path / "pack.xz"
    save_video_pack(path, videos, captions)
    loaded, loaded_captions = load_video_pack(path)
    assert torch.equal(loaded, videos) and loaded.dtype == torch.uint8
    assert loaded_captions == captions
    assert path.stat().st_size * 10 < videos.numel()  # toy videos compress well over 10x


def test_a_bad_pack_fails_naming_the_file(tmp_path):
    videos, captions = toy_video_dataset(3, seed=1)
    with pytest.raises(ValueError, match="uint8 videos"):
        save_video_pack(tmp_path / "x.xz", videos.float(), captions)
    with pytest.raises(ValueError, match="2 captions"):
        save_video_pack(tmp_path / "x.xz", videos, captions[:2])
    junk = tmp_path / "junk.xz"
    junk.write_bytes(b"not lzma at all")
    with pytest.raises(ValueError, match="junk.xz: not a toy video pack"):
        load_video_pack(junk)
    short = tmp_path / "short.xz"
    save_video_pack(short, videos, captions)
    with lzma.open(short) as f:
        header, data = f.readline(), f.read()
    with lzma.open(short, "wb") as f:
        f.write(header + data[:-10])
    with pytest.raises(ValueError, match="short.xz: truncated"):
        load_video_pack(short)
    other = tmp_path / "other.xz"
    with lzma.open(other, "wb") as f:
        f.write(json.dumps({"format": "something else"}).encode() + b"\n")
    with pytest.raises(ValueError, match="other.xz: not a toy video pack"):
        load_video_pack(other)


def test_the_noise_generator_draws_the_loss_noise_and_nothing_else():
    """With ``noise_generator`` the loss equals the loss on noise drawn from a generator in that
    state, the timesteps still coming from ``generator``; without it, from ``generator`` as before."""
    torch.manual_seed(0)
    transformer = build_video_transformer(16, 4, width=32, num_layers=1, head_dim=16)
    latents, embeds = torch.randn(3, 4, 4, 4, 4), torch.randn(3, 5, 16)
    with_gen = diffusion_forcing_loss(
        transformer, latents, embeds, torch.Generator().manual_seed(1),
        noise_generator=torch.Generator().manual_seed(2),
    )  # fmt: skip
    noise = torch.randn(latents.shape, generator=torch.Generator().manual_seed(2))
    explicit = diffusion_forcing_loss(
        transformer, latents, embeds, torch.Generator().manual_seed(1), noise=noise
    )
    assert torch.allclose(with_gen, explicit)
    one = diffusion_forcing_loss(transformer, latents, embeds, torch.Generator().manual_seed(1))
    assert not torch.allclose(one, with_gen)  # the default draws its noise from generator 1


def test_a_timed_schedule_reaches_the_bottom_of_its_cosine_when_the_minutes_run_out(monkeypatch):
    import genalign.toy.training as training

    now = [1000.0]
    monkeypatch.setattr(training.time, "time", lambda: now[0])
    timed, plain = step_schedule(10, 100_000, minutes=2.0), step_schedule(10, 100_000)
    assert timed(0) == plain(0) == pytest.approx(0.1)  # warm-up: (0 + 1) / 10
    now[0] += 60.0  # half the time, a tiny fraction of the steps
    assert timed(50) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + 0.0))  # cos(pi / 2) = 0: 0.55
    assert plain(50) > 0.999
    now[0] += 120.0  # past the budget
    assert timed(60) == pytest.approx(0.1)
    assert plain(60) > 0.999


def test_toy_ar_video_trains_on_a_pack_skips_evaluation_and_refuses_two_sources(tmp_path, capsys):
    from genalign.toy.generators.cli import main

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = build_video_vae(z_dim=4, base_dim=4).eval()
    (tmp_path / "vae").mkdir()
    vae.save_pretrained(tmp_path / "vae")
    (tmp_path / "vae" / "training.json").write_text(json.dumps({"commands": ["video-vae ..."]}))
    pack = tmp_path / "pack.xz"
    assert main(["video-pack", "--out", str(pack), "--num-videos", "6", "--seed", "2"]) == 0
    videos, captions = load_video_pack(pack)
    expected, expected_captions = toy_video_dataset(6, seed=2 + VIDEO_DATA_SEED_OFFSET)
    assert torch.equal(videos, expected) and captions == expected_captions  # the recipe's data

    base = ["toy-ar-video", "--vae", str(tmp_path / "vae"), "--clip-text", str(TOY_CLIP), "--steps", "2"]
    base += ["--batch-size", "2", "--width", "32", "--layers", "1"]
    with pytest.raises(SystemExit):
        main([*base, "--videos", str(pack), "--num-videos", "6", "--out", str(tmp_path / "m0")])
    assert "not both" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--videos", str(tmp_path / "missing.xz"), "--out", str(tmp_path / "m0")])
    err = capsys.readouterr().err
    assert "--videos" in err and "missing.xz" in err
    out = tmp_path / "m"
    args = [*base, "--videos", str(pack), "--device", "cpu", "--eval-per-prompt", "0", "--out", str(out)]
    assert main([*args, "--patch-size", "2"]) == 0
    config = json.loads((out / "transformer" / "config.json").read_text())
    assert config["patch_size"] == [1, 2, 2]
    card = json.loads((out / "card.json").read_text())
    assert card["steps"] == 2 and card["device"] == "cpu" and "evals" not in card
    assert not (out / "README.md").exists()  # the card is finished by toy-ar-video-card
    assert (out / "transformer").is_dir()
    with pytest.raises(SystemExit):
        main(["toy-ar-video-card", "--out", str(tmp_path / "nowhere")])
    assert "card.json not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --device belongs to toy-ar-video only
        main(["video-pack", "--out", str(pack), "--num-videos", "2", "--device", "cuda"])
    assert "--device is an option of the toy-ar-video command only" in capsys.readouterr().err


def test_toy_ar_video_continues_a_folder_from_its_weights_and_keeps_its_record(tmp_path, capsys):
    from diffusers import SkyReelsV2Transformer3DModel

    from genalign.toy.generators.cli import main

    pack = _tiny_vae_and_pack(tmp_path)
    base = ["toy-ar-video", "--clip-text", str(TOY_CLIP), "--steps", "2", "--batch-size", "2"]
    base += ["--videos", str(pack), "--eval-per-prompt", "0"]
    first = tmp_path / "first"
    assert (
        main([*base, "--vae", str(tmp_path / "vae"), "--width", "32", "--layers", "1", "--out", str(first)])
        == 0
    )

    # lr 0: the continued run's saved (averaged) weights are the folder's, whatever it was built with
    second = tmp_path / "second"
    assert main([*base, "--init", str(first), "--lr", "0", "--seed", "3", "--out", str(second)]) == 0
    before = SkyReelsV2Transformer3DModel.from_pretrained(str(first / "transformer")).state_dict()
    after = SkyReelsV2Transformer3DModel.from_pretrained(str(second / "transformer")).state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    # and a run that learns moves them (so the equality above is the init's, not a no-op's)
    third = tmp_path / "third"
    assert (
        main(
            [
                *base,
                "--init",
                str(first),
                "--lr",
                "1e-2",
                "--ema-decay",
                "0",
                "--first-block-prob",
                "0.5",
                "--out",
                str(third),
            ]
        )
        == 0
    )
    moved = SkyReelsV2Transformer3DModel.from_pretrained(str(third / "transformer")).state_dict()
    assert any(not torch.equal(before[k], moved[k]) for k in before)

    card, previous = (json.loads((f / "card.json").read_text()) for f in (second, first))
    assert card["commands"][:-1] == previous["commands"] and len(card["commands"]) == 3  # vae, first, this
    assert card["steps"] == 4 and card["stage_steps"] == 2 and card["vae"] == previous["vae"]
    assert card["train_seconds"] > previous["train_seconds"]

    for extra, message in (
        (["--init", str(tmp_path / "vae")], "no card.json"),
        (["--init", str(first), "--patch-size", "2"], "drop --patch-size"),
        (["--init", str(first), "--vae", str(tmp_path / "vae")], "drop --vae"),
    ):
        with pytest.raises(SystemExit):
            main([*base, *extra, "--out", str(tmp_path / "bad")])
        assert message in capsys.readouterr().err


def test_a_pack_of_chosen_categories_holds_only_them_and_the_default_draws_as_before(tmp_path, capsys):
    from genalign.toy.generators.cli import main
    from genalign.toy.video.captions import parse_video_caption

    everything = toy_video_dataset(12, seed=4)
    again = toy_video_dataset(12, seed=4, categories=None)
    assert torch.equal(everything[0], again[0]) and everything[1] == again[1]
    pack = tmp_path / "single.xz"
    args = ["video-pack", "--out", str(pack), "--num-videos", "12", "--seed", "1"]
    assert main([*args, "--categories", "single_motion,one_moving"]) == 0
    _, captions = load_video_pack(pack)
    assert {parse_video_caption(c)["tag"] for c in captions} == {"single_motion", "one_moving"}
    assert {parse_video_caption(c)["tag"] for c in everything[1]} > {"single_motion", "one_moving"}
    with pytest.raises(SystemExit):
        main([*args, "--categories", "single_motion,dancing"])
    assert "--categories" in (err := capsys.readouterr().err) and "dancing" in err


def _tiny_guided_teacher(tmp_path: Path) -> Path:
    """A two-step toy-ar-video trained with caption dropout and no evaluation (card without evals)."""
    from genalign.toy.generators.cli import main

    pack = _tiny_vae_and_pack(tmp_path)
    teacher = tmp_path / "teacher"
    args = ["toy-ar-video", "--clip-text", str(TOY_CLIP), "--steps", "2", "--batch-size", "2"]
    args += ["--videos", str(pack), "--eval-per-prompt", "0", "--caption-dropout", "0.5"]
    args += ["--vae", str(tmp_path / "vae"), "--width", "32", "--layers", "1", "--out", str(teacher)]
    assert main(args) == 0
    return teacher


def test_reflow_continues_a_teacher_trained_without_evaluation_and_can_skip_its_own(tmp_path, caplog):
    """A teacher trained with --eval-per-prompt 0 (a GPU box, or a long CPU run) has no ``evals`` in
    its card; the reflow stage reads it all the same, and with --eval-per-prompt 0 it writes its card
    without evaluating, for toy-ar-video-card to finish."""
    from genalign.toy.generators.cli import main

    teacher = _tiny_guided_teacher(tmp_path)
    assert "evals" not in json.loads((teacher / "card.json").read_text())

    student = tmp_path / "student"
    reflow = ["toy-ar-video-reflow", "--init", str(teacher), "--num-videos", "2", "--ode-steps", "1"]
    reflow += ["--ode-guidance", "2", "--steps", "2", "--batch-size", "2", "--eval-per-prompt", "0"]
    with caplog.at_level("INFO"):
        assert main([*reflow, "--out", str(student)]) == 0
    card, previous = (json.loads((f / "card.json").read_text()) for f in (student, teacher))
    assert "evals" not in card and "stage_1_evals" not in card
    assert card["reflow"]["steps"] == 2 and card["reflow"]["ode_guidance"] == 2.0
    assert (
        card["commands"][:-1] == previous["commands"] and len(card["commands"]) == 3
    )  # vae, teacher, reflow
    assert (student / "transformer").is_dir() and not (student / "README.md").exists()
    assert f"toy-ar-video-card --out {student}" in caplog.text


def test_guidance_distillation_is_a_stage_that_continues_a_teacher_and_records_itself(tmp_path, caplog):
    """``toy-ar-video-guidance --init TEACHER`` distils the guided teacher into a student folder whose
    card extends the teacher's (commands, training time) and records the stage and its evaluation
    steps (8 by default); with --eval-per-prompt 0 it leaves the evaluation to toy-ar-video-card."""
    from genalign.policies import load_policy
    from genalign.toy.generators.cli import main
    from genalign.toy.generators.video_cli import _guidance_line

    teacher = _tiny_guided_teacher(tmp_path)

    student = tmp_path / "student"
    stage = ["toy-ar-video-guidance", "--init", str(teacher), "--num-videos", "2", "--guidance", "2"]
    stage += ["--steps", "2", "--eval-per-prompt", "0", "--out", str(student)]
    with caplog.at_level("INFO"):
        assert main(stage) == 0
    card, previous = (json.loads((f / "card.json").read_text()) for f in (student, teacher))
    record = card["guidance_distillation"]
    assert record["steps"] == 2 and record["guidance_scale"] == 2.0 and record["num_videos"] == 2
    assert record["batch_size"] == 16  # the stage's own default, not the teacher's 64
    assert card["commands"][:-1] == previous["commands"] and len(card["commands"]) == 3  # vae, teacher, this
    assert card["train_seconds"] == pytest.approx(previous["train_seconds"] + record["train_seconds"])
    assert card["eval_steps"] == 8 and f"toy-ar-video-card --out {student}" in caplog.text
    assert "w = 2" in _guidance_line(card) and _guidance_line(previous) == ""
    moved = [
        float((a - b).abs().max())
        for a, b in zip(
            load_policy("ar_video", student, train=False).denoiser.parameters(),
            load_policy("ar_video", teacher, train=False).denoiser.parameters(),
            strict=True,
        )
    ]
    assert max(moved) > 0
    with pytest.raises(SystemExit):  # an option of another command is refused, naming it
        main([*stage[:-1], str(tmp_path / "other"), "--ode-steps", "2"])
