"""benchmarks/promptrl_toy.py: the arms, the evaluation pipeline, the report, and a tiny end-to-end run."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench(benchmark_module):
    return benchmark_module("promptrl_toy")


def test_arms_share_the_recipe_and_the_image_budget(bench):
    from genalign.config import to_dict

    args = bench.parse_args(["--budget", "100"])
    built = {arm: bench.build_config(args, arm, 3, Path("/tmp/x")) for arm in bench.ARMS}
    assert {arm: c.train.prompt_rewrite.trains for arm, (c, _) in built.items()} == {
        "joint": "both",
        "generator-only": "generator",
        "lm-only": "rewriter",
    }
    for config, per_step in built.values():
        assert per_step == 16 and config.train.num_steps == 100 // 16  # 2 prompts x 8 rewrites, every arm
        assert config.model.path.endswith("toy-sd") and config.train.seed == 3
    plain = []
    for config, _ in built.values():
        data = to_dict(config)
        data["train"]["prompt_rewrite"].pop("trains")
        plain.append(data)
    assert plain[0] == plain[1] == plain[2]  # nothing else differs


def test_eval_items_are_paraphrases_of_rl_heldout_with_their_canonical_specs(bench):
    from genalign.toy.evaluation import eval_set
    from genalign.toy.prompts import prompts_for

    items = bench.eval_items(4)
    canonical = eval_set("rl_heldout", 4)
    assert len(items) == len(canonical) == 24
    for (para, seed), (prompt, canonical_seed) in zip(items, canonical, strict=True):
        assert seed == canonical_seed and para.canonical == prompt.caption and para.spec == prompt.spec
        assert para.text != prompt.caption
    assert not {p.canonical for p, _ in items} & {p.caption for p in prompts_for("rl_train")}
    assert [p.text for p, _ in bench.eval_items(4)] == [p.text for p, _ in items]  # fixed


class _Recorder:
    """A stand-in policy that records what it is asked to draw or rewrite."""

    def __init__(self, completions=None):
        self.calls, self.completions = [], completions

    def rollout(self, prompts, seeds=None, **kwargs):
        self.calls.append((list(prompts), seeds.tolist(), kwargs))
        if self.completions is not None:
            return SimpleNamespace(completions=[self.completions(p) for p in prompts])
        return SimpleNamespace(images=torch.zeros(len(prompts), 3, 64, 64))


def test_evaluation_draws_the_rewrites_from_fixed_seeds(bench):
    from genalign.algorithms.prompt_rewrite import GENEVAL_TEMPLATE

    args = bench.parse_args(["--eval-batch-size", "5"])
    config, _ = bench.build_config(args, "joint", 0, Path("/tmp/x"))
    items = bench.eval_items(2)
    answers = {GENEVAL_TEMPLATE.format(prompt=p.text): p.canonical for p, _ in items}
    # every other rewrite has no answer tag: the recipe's fallback draws the paraphrase itself
    untagged = {GENEVAL_TEMPLATE.format(prompt=p.text) for p, _ in items[1::2]}
    rewriter = _Recorder(lambda x: "no tag" if x in untagged else f"<answer>{answers[x]}</answer>")
    generator = _Recorder()
    sampling = {"num_inference_steps": 10, "num_sde_steps": 6}
    result = bench.evaluate_pipeline(rewriter, generator, items, sampling, config, args)
    asked = [p for call in rewriter.calls for p in call[0]]
    assert asked == [GENEVAL_TEMPLATE.format(prompt=p.text) for p, _ in items]
    assert rewriter.calls[0][2]["temperature"] == 1.0 and rewriter.calls[0][2]["max_new_tokens"] == 40
    drawn = [p for call in generator.calls for p in call[0]]
    expected = [p.canonical if i % 2 == 0 else p.text for i, (p, _) in enumerate(items)]
    assert drawn == expected
    seeds = [s for _, s in items]
    assert [s for call in rewriter.calls for s in call[1]] == seeds
    assert [s for call in generator.calls for s in call[1]] == seeds
    assert all(call[2] == sampling for call in generator.calls)
    assert result["answer_rate"] == pytest.approx(0.5) and result["canonical_rate"] == pytest.approx(0.5)
    assert result["heldout_overall"] == 0.0  # blank images pass nothing
    # a temperature for the evaluation rewrites replaces the recipe's
    greedy = bench.parse_args(["--rewrite-temperature", "0.01"])
    bench.evaluate_pipeline(rewriter, generator, items[:1], sampling, config, greedy)
    assert rewriter.calls[-1][2]["temperature"] == 0.01


def test_images_to_reach_interpolates_the_first_crossing(bench):
    xs = [0, 128, 256, 384]
    assert bench.images_to_reach(xs, [0.2, 0.3, 0.5, 0.45], 0.4) == pytest.approx(192.0)
    assert bench.images_to_reach(xs, [0.2, 0.3, 0.5, 0.45], 0.1) == 0.0
    assert bench.images_to_reach(xs, [0.2, 0.5, 0.3, 0.6], 0.45) == pytest.approx(128 * 25 / 30)
    assert math.isinf(bench.images_to_reach(xs, [0.2, 0.3, 0.5, 0.45], 0.6))


def _rows(arm, finals, mid=None):
    rows = []
    for seed, final in enumerate(finals):
        middle = (0.2 + final) / 2 if mid is None else mid[seed]
        for images, score in ((0, 0.2), (128, middle), (256, final)):
            rows.append({"arm": arm, "seed": seed, "images": images, "heldout_overall": score,
                         "canonical_rate": score / 2})  # fmt: skip
        rows[-1].update(task_reward_first=0.1, task_reward_last=0.3, cpu_seconds=10.0)
    return rows


def test_summary_reports_intervals_and_images_to_reach_the_generator_only_score(bench):
    rows = _rows("joint", [0.5, 0.6, 0.7]) + _rows("generator-only", [0.3, 0.3, 0.3], mid=[0.25] * 3)
    table = bench.summarise(rows)
    half = 4.3027 * 0.1 / 3**0.5 * 100  # t(2) quantile x sd / sqrt(3), in points
    assert f"| 256 | 60.0 ± {half:.1f} | 30.0 ± 0.0 |" in table
    assert f"| joint | 3 | 20.0 ± 0.0 | 60.0 ± {half:.1f} | +40.0 ± {half:.1f} |" in table
    assert "Target: generator-only's final score 30.0% (95% interval [30.0, 30.0]) at 256 images." in table
    # joint's mean curve: 0.2 -> 0.4 at 128 images, crossing 0.3 at 64; generator-only at 256
    assert "| joint | 64 | 64 / 64 | 85, 64, 51 | 4.00x |" in table
    assert "| generator-only | 256 | 256 / 256 | 256, 256, 256 | 1.00x |" in table
    # a baseline that ends where it started: every arm is there before training
    flat = bench.summarise(
        _rows("joint", [0.5, 0.6, 0.7]) + _rows("generator-only", [0.2] * 3, mid=[0.1] * 3)
    )
    assert "| joint | 0 | 0 / 0 | 0, 0, 0 | at the start |" in flat
    missing = bench.summarise(_rows("joint", [0.5, 0.6, 0.7]))
    assert "no generator-only runs" in missing


@pytest.mark.slow
def test_benchmark_runs_end_to_end_on_the_toy_models(tmp_path, bench):
    out = tmp_path / "prl"
    code = bench.main(
        [
            "--seeds", "0", "--budget", "16", "--eval-every", "8", "--eval-images-per-category", "1",
            "--set", "train.group_size=4", "train.minibatch_size=8", "sampling.num_inference_steps=4", "sampling.num_sde_steps=2",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["arm"], int(r["images"])) for r in rows] == [
        (arm, images)
        for arm in bench.ARMS
        for images in (0, 8, 16)  # 2 steps of 2 prompts x 4
    ]
    assert all(0.0 <= float(r["heldout_overall"]) <= 1.0 for r in rows)
    starts = [r for r in rows if int(r["images"]) == 0]
    assert len({r["heldout_overall"] for r in starts}) == 1  # the same weights and seeds in every arm
    assert starts[0]["no_rewriter_overall"] and starts[0]["canonical_caption_overall"]
    trained = {}  # which policies each arm updated, from the trainer's logged metrics
    for arm in bench.ARMS:
        first = json.loads((out / "runs" / f"{arm}-seed0" / "metrics.jsonl").read_text().splitlines()[0])
        trained[arm] = {name for name in ("generator", "rewriter") if f"{name}_policy_loss" in first}
    assert trained == {
        "joint": {"generator", "rewriter"},
        "generator-only": {"generator"},
        "lm-only": {"rewriter"},
    }
    summary = (out / "summary.md").read_text()
    assert "Target: generator-only's final score" in summary and (out / "promptrl_toy.png").stat().st_size > 0
    merged = tmp_path / "merged"
    assert (
        bench.main(
            ["--from-csv", str(out / "results.csv"), "--eval-images-per-category", "1", "--out", str(merged)]
        )
        == 0
    )
    assert (merged / "summary.md").read_text() == summary
