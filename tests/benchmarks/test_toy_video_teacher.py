"""benchmarks/toy_video_teacher.py: the teacher drawn from noise and from the true first block, on a
small random model of toy-ar-video's layout (the numbers are the verifier's; the wiring is tested)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genalign.policies.ar_video import ARVideoPolicy
from genalign.toy.generators.video import small_video_pipeline, video_latents
from genalign.toy.video import toy_video_dataset

TOY_CLIP = Path(__file__).resolve().parents[2] / "assets" / "models" / "toy-clip"


@pytest.fixture(scope="module")
def teacher():
    return ARVideoPolicy(small_video_pipeline(TOY_CLIP))


def test_motion_outcomes_by_hand(benchmark_module):
    bench = benchmark_module("toy_video_teacher")
    assert bench.motion_outcome({"motions": ["right", "static"]}, "right") == "right"
    assert bench.motion_outcome({"motions": ["static"]}, "left") == "static"
    assert bench.motion_outcome({"motions": ["oblique"]}, "left") == "other"
    assert bench.motion_outcome({"motions": []}, "left") == "absent"


def test_both_draws_share_the_noise_and_the_continuation_gets_the_true_first_block(
    benchmark_module, teacher, monkeypatch
):
    bench = benchmark_module("toy_video_teacher")
    from genalign.toy.generators import video_reflow

    calls = []
    real = video_reflow.ode_video_samples

    def spy(policy, noise, embeds, steps, guidance, negative, prefix=None):
        calls.append((noise.clone(), None if prefix is None else prefix.clone(), steps, guidance))
        return real(policy, noise, embeds, steps, guidance, negative, prefix=prefix)

    monkeypatch.setattr(video_reflow, "ode_video_samples", spy)
    row = bench.measure(teacher, per_category=2, data_seed=5, guidance=2.0, steps=1, batch_size=4)
    assert row["videos"] == 4 and set(row) >= {"from_noise", "from_first_block"}
    (noise_a, none, steps, guidance), (noise_b, prefix, _, _) = calls
    assert none is None and steps == 1 and guidance == 2.0
    assert torch.equal(noise_a, noise_b)  # the same noise for both draws
    videos, _ = toy_video_dataset(4, seed=5, categories=["single_motion", "one_moving"])
    expected = video_latents(teacher.pipeline.vae, videos)[:, :, : teacher.block_size]
    torch.testing.assert_close(prefix, expected)
    for name in ("from_noise", "from_first_block"):
        result = row[name]
        assert 0.0 <= result["accuracy"] <= 1.0 and 0.0 <= result["fraction"] <= 1.0
        assert set(result["per_category"]) >= {"single_motion", "one_moving"}
        assert sum(result["motion"].values()) <= 4


def test_the_split_scores_are_the_ode_evaluation(benchmark_module, teacher):
    bench = benchmark_module("toy_video_teacher")
    from genalign.toy.generators.video_eval import evaluate_video_generator

    out = bench.measure_splits(teacher, ("rl_train",), per_category=2, guidance=2.0, steps=1)
    direct = evaluate_video_generator(
        teacher, split="rl_train", per_category=2, steps=1, sampler="ode", guidance_scale=2.0
    )
    assert out["rl_train"]["accuracy"] == round(direct["overall"], 4)
    assert out["rl_train"]["fraction"] == round(direct["mean_fraction"], 4)
    assert out["rl_train"]["interval"] == direct["interval"]
    assert out["rl_train"]["sampler"] == direct["settings"]["sampler"] and "ODE" in out["rl_train"]["sampler"]


def test_the_rollout_scores_are_the_self_forcing_evaluation_without_guidance(
    benchmark_module, teacher, capsys
):
    bench = benchmark_module("toy_video_teacher")
    from genalign.toy.generators.video_eval import evaluate_video_generator

    out = bench.measure_splits(
        teacher, ("rl_heldout",), per_category=2, guidance=1.0, steps=2, sampler="self_forcing"
    )
    direct = evaluate_video_generator(teacher, split="rl_heldout", per_category=2, steps=2)
    assert out["rl_heldout"]["accuracy"] == round(direct["overall"], 4)
    assert out["rl_heldout"]["interval"] == direct["interval"]
    assert out["rl_heldout"]["sampler"] == direct["settings"]["sampler"]
    assert out["rl_heldout"]["sampler"].startswith("Self-Forcing")
    with pytest.raises(SystemExit):
        bench.main([str(TOY_CLIP), "--rollout-steps", "4"])
    assert "give --splits too" in capsys.readouterr().err
