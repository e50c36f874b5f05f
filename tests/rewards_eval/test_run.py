"""Scoring, caching/resume, failure reporting and the end-to-end CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genalign.rewards.base import Reward, RewardOutput
from genalign.rewards.evaluation.data import load_eval_dataset
from genalign.rewards.evaluation.run import EvalConfig, RewardSpec, evaluate_rewards, parse_reward_specs

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "eval"


class BrightnessReward(Reward):
    """Mean pixel value; counts images scored; raises for prompts containing ``fail``."""

    name = "brightness"

    def __init__(self, interrupt_after: int | None = None) -> None:
        super().__init__()
        self.images_scored = 0
        self.calls = 0
        self.interrupt_after = interrupt_after

    def score(self, images, prompts, **metadata):
        self.calls += 1
        if self.interrupt_after is not None and self.calls > self.interrupt_after:
            raise KeyboardInterrupt
        if any("fail" in prompt for prompt in prompts):
            raise RuntimeError("cannot score this prompt")
        self.images_scored += images.shape[0]
        return RewardOutput(images.mean(dim=(1, 2, 3)), {})


def preference_file(image_dir: Path, n: int = 6, extra=()) -> Path:
    rows = [
        {
            "prompt": f"p{k}",
            "image_0": f"img{k % 5}.png",
            "image_1": f"img{k % 5 + 1}.png",
            "label": 1,
            "category": "ab"[k % 2],
        }
        for k in range(n)
    ]
    path = image_dir / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in [*rows, *extra]))
    return path


def test_resume_scores_only_uncached_samples(image_dir, tmp_path):
    dataset = load_eval_dataset(preference_file(image_dir), "preference")
    config = EvalConfig(batch_size=4, bootstrap=20, progress=False)
    spec = RewardSpec("brightness", {"level": 1})
    first = BrightnessReward(interrupt_after=1)  # dies on its second batch
    with pytest.raises(KeyboardInterrupt):
        evaluate_rewards(dataset, [spec], tmp_path / "out", config, reward_factory=lambda s: first)
    assert first.images_scored == 4
    cache = tmp_path / "out" / "cache" / f"{spec.key}.jsonl"
    assert len(cache.read_text().splitlines()) == 2
    second = BrightnessReward()
    summary = evaluate_rewards(dataset, [spec], tmp_path / "out", config, reward_factory=lambda s: second)
    assert second.images_scored == 12 - 4
    third = BrightnessReward()
    evaluate_rewards(dataset, [spec], tmp_path / "out", config, reward_factory=lambda s: third)
    assert third.calls == 0
    # brighter image_1 always wins and labels say image_1: every policy agrees fully
    assert summary["rewards"][spec.key]["metrics"]["accuracy_strict"]["value"] == 1.0
    # another configuration is another cache
    assert RewardSpec("brightness", {"level": 2}).key != spec.key


def test_failures_are_counted_reported_and_retried(image_dir, tmp_path):
    extra = [
        {"prompt": "missing", "image_0": "img0.png", "image_1": "gone.png", "label": 0},
        {"prompt": "fail here", "image_0": "img0.png", "image_1": "img1.png", "label": 0},
    ]
    (image_dir / "broken.png").write_bytes(b"not a png")
    extra.append({"prompt": "broken", "image_0": "broken.png", "image_1": "img1.png", "label": 1})
    dataset = load_eval_dataset(preference_file(image_dir, 4, extra), "preference")
    reward = BrightnessReward()
    out = tmp_path / "out"
    summary = evaluate_rewards(
        dataset,
        [RewardSpec("brightness")],
        out,
        EvalConfig(batch_size=16, bootstrap=10, progress=False),
        lambda s: reward,
    )
    entry = next(iter(summary["rewards"].values()))
    assert (entry["n_total"], entry["n_scored"], entry["n_failed"]) == (7, 4, 3)
    errors = {f["row"]: f["error"] for f in entry["failures"]}
    assert "image not found" in errors[4] and "RuntimeError: cannot score this prompt" in errors[5]
    assert "unreadable image" in errors[6]
    report = (out / "report.md").read_text()
    assert "| 4/7 |" in report and "3 of 7 samples not scored" in report and "gone.png" in report
    lines = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert len(lines) == 7 and sum(bool(line["errors"]) for line in lines) == 3
    # failures are not cached: a rerun retries exactly them
    retry = BrightnessReward()
    evaluate_rewards(
        dataset, [RewardSpec("brightness")], out, EvalConfig(bootstrap=0, progress=False), lambda s: retry
    )
    assert retry.images_scored == 0 and retry.calls == 1


def test_parse_reward_specs():
    specs = parse_reward_specs(
        ["jpeg_compressibility,clip"], ["clip.pretrained=null", "strict=true", "clip.w=2"]
    )
    assert [s.name for s in specs] == ["jpeg_compressibility", "clip"]
    assert specs[0].kwargs == {"strict": True}
    assert specs[1].kwargs == {"pretrained": None, "strict": True, "w": 2}
    with pytest.raises(ValueError, match="not in"):
        parse_reward_specs(["clip"], ["aesthetic.x=1"])


@pytest.fixture(scope="module")
def tiny_clip_folder(tmp_path_factory) -> Path:
    from genalign.tiny.clip import open_clip_model

    folder = tmp_path_factory.mktemp("tiny_open_clip")
    open_clip_model(seed=0, save_to=folder)
    return folder


@pytest.mark.parametrize(
    "task,data", [("preference", "preference/pairs.jsonl"), ("mos", "quality/mos.jsonl")]
)
def test_cli_end_to_end_on_the_shipped_samples(task, data, tiny_clip_folder, tmp_path, capsys):
    from genalign.cli import main

    out = tmp_path / task
    argv = [
        "eval-reward",
        "--reward", "jpeg_compressibility,clip",
        "--reward-arg", f"clip.model=local-dir:{tiny_clip_folder}",
        "--reward-arg", "clip.pretrained=null",
        "--data", str(ASSETS / data),
        "--task", task,
        "--out", str(out),
        "--bootstrap", "50",
        "--batch-size", "32",
        "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for name in (
        "scores.jsonl",
        "summary.json",
        "report.md",
        "score_histogram.png",
        "accuracy_per_category.png",
    ):
        assert (out / name).stat().st_size > 0, name
    if task == "mos":
        assert (out / "scatter_mos.png").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["rewards"]) == 2
    for entry in summary["rewards"].values():
        assert entry["n_failed"] == 0 and entry["per_category"]
        for name, stats in entry["metrics"].items():
            if not name.endswith("_fitted"):  # a refitted logistic can saturate on a resample
                assert stats["ci_low"] <= stats["value"] <= stats["ci_high"], name
    assert "| reward | scored |" in printed and "clip-" in printed


def test_ranking_task_with_categories(image_dir, tmp_path):
    rows = [
        {
            "prompt": "a",
            "image_path": ["img0.png", "img3.png", "img5.png"],
            "rank": [3, 2, 1],
            "category": "x",
        },
        {
            "prompt": "b",
            "image_path": ["img1.png", "img2.png", "img4.png"],
            "rank": [1, 2, 3],
            "category": "y",
        },
    ]
    (image_dir / "test.json").write_text(json.dumps(rows))
    dataset = load_eval_dataset(image_dir / "test.json", "ranking", preset="hpdv2")
    summary = evaluate_rewards(
        dataset,
        [RewardSpec("brightness")],
        tmp_path / "out",
        EvalConfig(bootstrap=20, progress=False),
        lambda s: BrightnessReward(),
    )
    entry = summary["rewards"][RewardSpec("brightness").key]
    # brightness agrees with prompt a's ranks (brighter = better) and inverts all of prompt b's
    assert entry["metrics"]["inversion_score"]["value"] == pytest.approx(0.5)
    assert entry["per_category"]["x"]["metrics"]["inversion_score"]["value"] == 1.0
    assert entry["per_category"]["y"]["metrics"]["inversion_score"]["value"] == 0.0
    assert entry["metrics"]["accuracy_imagereward"]["value"] == pytest.approx(0.5)  # 3 of 6 pairs
    assert entry["per_category"]["x"]["metrics"]["accuracy_imagereward"]["value"] == 1.0
    assert entry["per_category"]["y"]["metrics"]["accuracy_imagereward"]["value"] == 0.0
    assert (tmp_path / "out" / "accuracy_per_category.png").exists()
