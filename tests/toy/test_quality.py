"""The toy image-quality data for IQA judges (#27 items 6-7): renders at known levels, the judge's
pool with its format warm-start targets, and the held-out files whose ``pairs.jsonl`` gives
``genalign eval-reward`` the rate at which a reward scores an original above its degraded copy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import ImageFilter

from genalign.algorithms import format_reward, parse_answer_score
from genalign.rewards import load_reward
from genalign.rewards.base import RewardOutput
from genalign.rewards.evaluation import EvalConfig, evaluate_rewards, load_eval_dataset
from genalign.rewards.evaluation.run import RewardSpec
from genalign.toy.quality import (
    TOY_QUESTION,
    judge_answers,
    quality_renders,
    toy_quality_pool,
    write_quality_set,
)
from genalign.utils.degradations import degradation_pair

ROOT = Path(__file__).resolve().parents[2]
TOY_VLM = ROOT / "assets" / "models" / "toy-vlm"


def test_renders_cover_every_kind_and_level_and_repeat_with_the_seed():
    images, mos, records = quality_renders("heldout", scenes=2, seed=3)
    assert images.shape == (24, 3, 64, 64) and 0 <= images.min() and images.max() <= 1
    assert mos == [5.0 - r["level"] for r in records]
    assert {(r["category"], r["level"]) for r in records} == {
        (kind, level) for kind in ("blur", "jpeg", "noise") for level in range(4)
    }
    clean = [i for i, r in enumerate(records) if r["level"] == 0 and r["scene"] == 0]
    assert all(torch.equal(images[clean[0]], images[i]) for i in clean)  # level 0 is the clean render
    worst = [i for i, r in enumerate(records) if r["level"] == 3 and r["scene"] == 0]
    assert all(not torch.equal(images[clean[0]], images[i]) for i in worst)
    again, _, records_again = quality_renders("heldout", scenes=2, seed=3)
    assert torch.equal(images, again) and records == records_again
    assert records != quality_renders("heldout", scenes=2, seed=4)[2]
    with pytest.raises(ValueError, match="scenes must be in"):
        quality_renders("heldout", scenes=10_000)


def test_degrade_interpolates_between_whole_levels_and_keeps_the_tabled_ones():
    from PIL import Image

    from genalign.toy.eval_data import DEGRADATIONS, degrade

    base = Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    direct = {  # the tabled strengths, applied by hand
        "blur": base.filter(ImageFilter.GaussianBlur(radius=DEGRADATIONS["blur"][1])),
        "jpeg": jpeg(base, DEGRADATIONS["jpeg"][1]),
    }
    for kind, expected in direct.items():
        assert np.array_equal(
            np.asarray(degrade(base, kind, 2, np.random.default_rng(0))), np.asarray(expected)
        )
    # level 1.5 is the strength halfway between levels 1 and 2: blur radius 1.2, JPEG quality 27.5 -> 28
    halfway = degrade(base, "blur", 1.5, np.random.default_rng(0))
    assert np.array_equal(np.asarray(halfway), np.asarray(base.filter(ImageFilter.GaussianBlur(radius=1.2))))
    assert np.array_equal(
        np.asarray(degrade(base, "jpeg", 1.5, np.random.default_rng(0))), np.asarray(jpeg(base, 28))
    )
    # below level 1 the strength runs from level 0's (none; JPEG quality 100) to level 1's
    assert np.array_equal(
        np.asarray(degrade(base, "jpeg", 0.5, np.random.default_rng(0))), np.asarray(jpeg(base, 70))
    )
    noise = [
        np.abs(
            np.asarray(degrade(base, "noise", level, np.random.default_rng(1)), np.float32) - np.asarray(base)
        ).mean()
        for level in (0, 0.4, 1, 1.7, 2.5, 3)
    ]
    assert noise[0] == 0 and all(a < b for a, b in zip(noise, noise[1:]))
    assert np.array_equal(
        np.asarray(degrade(base, "jpeg", 4, np.random.default_rng(0))), np.asarray(jpeg(base, 2))
    )
    for bad in (-0.1, 4.2):
        with pytest.raises(ValueError, match="level must be in"):
            degrade(base, "blur", bad, np.random.default_rng(0))


def test_continuous_levels_give_one_real_valued_mos_per_quarter():
    images, mos, records = quality_renders("heldout", scenes=2, seed=3, levels="continuous")
    assert images.shape == (24, 3, 64, 64)
    assert mos == [round(5.0 - r["level"], 2) for r in records]
    for r in records:  # one level from each quarter of [0, 3]
        assert 0.75 * r["index"] <= r["level"] <= 0.75 * (r["index"] + 1)
    assert len(set(mos)) > 20  # real numbers, not four whole ones
    whole_images, whole_mos, whole_records = quality_renders("heldout", scenes=2, seed=3)
    assert [r["prompt"] for r in records] == [r["prompt"] for r in whole_records]  # the same scenes
    assert whole_mos == [5.0 - r["index"] for r in whole_records]
    again = quality_renders("heldout", scenes=2, seed=3, levels="continuous")
    assert torch.equal(images, again[0]) and mos == again[1]
    pool = toy_quality_pool("train", scenes=1, levels="continuous", mos_targets=True)
    assert pool.metadata["mos"].tolist() == pytest.approx(quality_renders("train", 1, levels="continuous")[1])
    assert all(
        c.endswith(f"<answer>{m:.2f}</answer>")
        for c, m in zip(pool.metadata["completions"], pool.metadata["mos"])
    )
    with pytest.raises(ValueError, match="levels must be one of"):
        quality_renders("heldout", scenes=1, levels="fine")


def test_five_levels_reach_mos_1_and_keep_the_four_level_scenes():
    images, mos, records = quality_renders("heldout", scenes=2, seed=3, num_levels=5)
    assert images.shape == (30, 3, 64, 64)
    assert sorted(set(mos)) == [1.0, 2.0, 3.0, 4.0, 5.0] and mos == [5.0 - r["level"] for r in records]
    four = quality_renders("heldout", scenes=2, seed=3)[2]
    assert [r["prompt"] for r in records[::15]] == [r["prompt"] for r in four[::12]]
    worst = [i for i, r in enumerate(records) if r["level"] == 4]
    assert all(not torch.equal(images[i], images[i - 1]) for i in worst)  # level 4 is not level 3
    _, fine, fine_records = quality_renders("heldout", scenes=1, seed=3, levels="continuous", num_levels=5)
    for r in fine_records:  # one level from each fifth of [0, 4]
        assert 0.8 * r["index"] <= r["level"] <= 0.8 * (r["index"] + 1)
    assert min(fine) < 2 and len(toy_quality_pool("train", scenes=1, num_levels=5)) == 15
    with pytest.raises(ValueError, match="num_levels must be 4"):
        quality_renders("heldout", scenes=1, num_levels=6)


def test_rated_kinds_add_darkening_at_its_tabled_brightness_and_keep_the_other_kinds():
    from PIL import Image, ImageEnhance

    from genalign.toy.eval_data import DEGRADATIONS, degrade

    images, mos, records = quality_renders(
        "heldout", scenes=2, seed=3, rated_kinds=("blur", "jpeg", "noise", "darken")
    )
    assert images.shape == (32, 3, 64, 64) and mos == [5.0 - r["level"] for r in records]
    assert [r["category"] for r in records[:16:4]] == ["blur", "jpeg", "noise", "darken"]
    three = quality_renders("heldout", scenes=2, seed=3)[0]
    # darkening draws no noise, so the three kinds' images are the default set's, scene by scene
    torch.testing.assert_close(torch.cat([images[:12], images[16:28]]), three)
    assert [r["level"] for r in records[12:16]] == [0, 1, 2, 3]  # scene 0's darkened renders
    means = [image.mean().item() for image in images[12:16]]
    assert all(a > b for a, b in zip(means, means[1:]))  # darker at each level
    base = Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    by_hand = ImageEnhance.Brightness(base).enhance(DEGRADATIONS["darken"][2])  # level 3's factor, 0.4
    assert np.array_equal(
        np.asarray(degrade(base, "darken", 3, np.random.default_rng(0))), np.asarray(by_hand)
    )
    assert np.array_equal(np.asarray(degrade(base, "darken", 0, np.random.default_rng(0))), np.asarray(base))
    assert len(toy_quality_pool("train", scenes=1, rated_kinds=("darken",))) == 4
    for bad in (("sepia",), (), ("blur", "blur")):
        with pytest.raises(ValueError, match="rated_kinds must be distinct kinds"):
            quality_renders("heldout", scenes=1, rated_kinds=bad)


def jpeg(image, quality):
    import io

    from PIL import Image

    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=int(quality))
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def test_the_pool_keeps_degraded_copies_and_mos():
    pool = toy_quality_pool("train", scenes=1, seed=0, prompt="rate", degradation_seed=5)
    assert list(toy_quality_pool("train", scenes=1)) == [TOY_QUESTION] * 12
    assert list(pool) == ["rate"] * 12
    torch.testing.assert_close(pool.metadata["mos"], torch.tensor([5.0, 4.0, 3.0, 2.0] * 3))
    copy, first, second = degradation_pair(pool.metadata["images"][7], 5 + 7)
    torch.testing.assert_close(pool.metadata["degraded_images"][7], copy)
    assert (pool.metadata["first_degradation"][7], pool.metadata["second_degradation"][7]) == (first, second)
    assert "completions" not in pool.metadata


def test_mos_targets_write_each_renders_label_in_the_answer_format():
    pool = toy_quality_pool("train", scenes=1, seed=0, mos_targets=True)
    mos = pool.metadata["mos"].tolist()
    assert mos == [5.0, 4.0, 3.0, 2.0] * 3
    targets = pool.metadata["completions"]
    assert targets[1] == "<think>The quality of the image is good</think><answer>4.00</answer>"
    assert [parse_answer_score(t) for t in targets] == mos
    assert all(format_reward(t) == 0.8 for t in targets)
    with pytest.raises(ValueError, match="either teacher"):
        toy_quality_pool("train", scenes=1, teacher=str(TOY_VLM), mos_targets=True)


def test_warm_start_targets_are_the_teachers_own_rating_in_the_answer_format():
    images, _, _ = quality_renders("train", scenes=1, seed=0)
    picked = images[[0, 3, 7]]  # clean, blur level 3, jpeg level 3
    answers = judge_answers(picked, str(TOY_VLM))
    assert all(len(row) == 1 for row in answers)
    teacher = load_reward("iqa", model=str(TOY_VLM), preset="qalign")(picked, None).scores
    for (answer,), score in zip(answers, teacher.tolist()):
        assert format_reward(answer) == 0.8
        assert parse_answer_score(answer) == pytest.approx(score, abs=0.005 + 1e-6)
        word = {5: "excellent", 4: "good", 3: "fair", 2: "poor", 1: "bad"}[min(5, max(1, round(score)))]
        assert answer.startswith(f"<think>The quality of the image is {word}</think><answer>")


def test_sampled_warm_start_targets_follow_the_teachers_word_distribution():
    images, _, _ = quality_renders("train", scenes=1, seed=0)
    picked = images[[0, 3]]  # clean, blur level 3
    words = {"excellent": 5.0, "good": 4.0, "fair": 3.0, "poor": 2.0, "bad": 1.0}
    answers = judge_answers(picked, str(TOY_VLM), samples=64, answer="word", seed=1)
    assert [len(row) for row in answers] == [64, 64]
    assert answers == judge_answers(picked, str(TOY_VLM), samples=64, answer="word", seed=1)
    teacher = load_reward("iqa", model=str(TOY_VLM), preset="qalign")(picked, None).scores
    for row, score in zip(answers, teacher.tolist()):
        levels = []
        for answer in row:
            word = answer.split("is ")[1].split("</think>")[0]
            assert format_reward(answer) == 0.8 and parse_answer_score(answer) == words[word]
            levels.append(words[word])
        assert sum(levels) / len(levels) == pytest.approx(score, abs=0.35)  # 64 draws of the expectation
    expected = judge_answers(picked, str(TOY_VLM), samples=3, answer="expected")
    assert {parse_answer_score(a) for a in expected[0]} == {round(teacher[0].item(), 2)}
    pool = toy_quality_pool("train", scenes=1, teacher=str(TOY_VLM), teacher_samples=3)
    assert len(pool) == 36 and len(pool.metadata["completions"]) == 36
    torch.testing.assert_close(pool.metadata["images"][0], pool.metadata["images"][2])
    with pytest.raises(ValueError, match="answer must be"):
        judge_answers(picked, str(TOY_VLM), answer="mode")


def test_the_held_out_files_give_eval_reward_the_original_above_degraded_rate(tmp_path):
    mos_path, pairs_path = write_quality_set(tmp_path / "set", "heldout", scenes=1, seed=1)
    rows = [json.loads(line) for line in pairs_path.read_text().splitlines()]
    assert len(rows) == 12 and all(row["label"] == 0.0 for row in rows)
    assert [json.loads(line)["image"] for line in mos_path.read_text().splitlines()] == [
        row["image_0"] for row in rows
    ]

    class MeanBrightness(torch.nn.Module):  # a reward with a known answer: brighter is better
        def forward(self, images, prompts, **metadata):
            return RewardOutput(images.mean(dim=(1, 2, 3)), {})

    data = load_eval_dataset(pairs_path, "preference")
    summary = evaluate_rewards(
        data,
        [RewardSpec("brightness")],
        tmp_path / "out",
        EvalConfig(bootstrap=50, tie_threshold=0.0, progress=False),
        reward_factory=lambda spec: MeanBrightness(),
    )
    from PIL import Image

    def brightness(name: str) -> float:
        return float(np.asarray(Image.open(tmp_path / "set" / name).convert("RGB"), np.float32).mean() / 255)

    higher = [brightness(row["image_0"]) > brightness(row["image_1"]) for row in rows]
    metrics = summary["rewards"][RewardSpec("brightness").key]["metrics"]
    assert metrics["accuracy_skip_ties"]["value"] == pytest.approx(np.mean(higher), abs=1e-6)


def test_the_command_writes_a_continuous_set_named_by_quarter(tmp_path, capsys):
    from genalign.toy.quality import main

    assert main(["--out", str(tmp_path), "--scenes", "1", "--levels", "continuous"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "mos.jsonl").read_text().splitlines()]
    assert [row["image"] for row in rows[:4]] == [f"images/scene0_blur{i}.png" for i in range(4)]
    assert [row["mos"] for row in rows] == quality_renders("heldout", 1, seed=1, levels="continuous")[1]
    assert all((tmp_path / row["image"]).exists() for row in rows)
    assert "wrote" in capsys.readouterr().out


def test_teacher_copies_add_each_renders_degraded_copy_with_the_teachers_target():
    pool = toy_quality_pool(
        "train", scenes=1, seed=0, degradation_seed=5, teacher=str(TOY_VLM), teacher_copies=True
    )
    plain = toy_quality_pool("train", scenes=1, seed=0, degradation_seed=5)
    images = pool.metadata["images"]
    assert len(pool) == 24 and torch.equal(images[:12], plain.metadata["images"])
    for index in (0, 7):  # the copies are the ones the plain pool pairs with each render
        torch.testing.assert_close(images[12 + index], plain.metadata["degraded_images"][index])
    assert pool.metadata["category"][12:] == ["copy"] * 12
    mos = pool.metadata["mos"]
    assert torch.equal(mos[:12], plain.metadata["mos"]) and torch.isnan(mos[12:]).all()
    teacher = load_reward("iqa", model=str(TOY_VLM), preset="qalign")(images[12:14], None).scores
    for answer, score in zip(pool.metadata["completions"][12:14], teacher.tolist()):
        assert format_reward(answer) == 0.8 and parse_answer_score(answer) == pytest.approx(score, abs=0.006)
    with pytest.raises(ValueError, match="teacher_copies needs a teacher"):
        toy_quality_pool("train", scenes=1, teacher_copies=True)
