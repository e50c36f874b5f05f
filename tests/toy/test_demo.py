"""The demo's pieces: the evaluation sets, the change's interval, the hacking check, the report."""

from __future__ import annotations

import json
import math
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from genalign.toy import heldout_prompts, is_heldout
from genalign.toy.captions import CATEGORIES
from genalign.toy.demo import (
    DEFAULT_RECIPE,
    HackingCheck,
    exported_weights,
    hacking_check,
    heldout_eval_set,
    trained_on_evaluation_prompts,
    write_report,
)
from genalign.toy.evaluation import (
    DEFAULT_EVAL_IMAGES,
    EVAL_SETS,
    RewardChange,
    SetEvaluation,
    eval_set,
    eval_set_for_images,
    paired_change_interval,
)
from genalign.toy.hacking import hacking_lines
from genalign.toy.prompts import RL_TRAIN_PROMPT_FILE, prompts_for


def test_heldout_eval_set_is_deterministic_and_heldout_only():
    items = heldout_eval_set(images_per_category=8, max_prompts_per_category=4, seed=3)
    assert items == heldout_eval_set(images_per_category=8, max_prompts_per_category=4, seed=3)
    assert items != heldout_eval_set(images_per_category=8, max_prompts_per_category=4, seed=4)
    assert all(is_heldout(prompt) for prompt, _ in items)
    categories = {p.category for p in heldout_prompts()}
    per_category = {c: [s for p, s in items if p.category == c] for c in categories}
    for category, seeds in per_category.items():
        # at least the asked-for images in every held-out category, never more than one prompt's worth extra
        assert len(seeds) >= 8, category
        assert len(set(seeds)) == len(seeds)
    # few-prompt categories get several seeds per prompt, many-prompt ones a subset of prompts
    assert len({p.caption for p, _ in items if p.category == "color_attr"}) == 4
    with pytest.raises(ValueError, match="positive"):
        heldout_eval_set(images_per_category=0)


@pytest.mark.parametrize("split", ["rl_heldout", "rl_train", "unseen_combinations"])
def test_eval_sets_have_exactly_the_asked_for_images_of_their_split(split):
    items = eval_set(split, images_per_category=27, seed=1)
    assert items == eval_set(split, images_per_category=27, seed=1)
    captions = {p.caption for p in prompts_for(split)}
    assert all(prompt.caption in captions for prompt, _ in items)
    counts = Counter(prompt.category for prompt, _ in items)
    assert set(counts.values()) == {27}
    assert len({(p.caption, seed) for p, seed in items}) == len(items)  # no (prompt, seed) pair twice
    # a category with fewer prompts than images uses every prompt, in turn
    assert {p.caption for p, _ in items if p.category == "position"} == {
        p.caption for p in prompts_for(split, "position")
    }


def test_rl_heldout_evaluation_has_at_least_160_images_over_six_categories():
    items = eval_set_for_images("rl_heldout", 160)
    assert len(items) == 162  # 27 per category
    assert Counter(p.category for p, _ in items) == dict.fromkeys(CATEGORIES, 27)
    assert len(eval_set_for_images("unseen_combinations", 96)) == 100  # 5 categories x 20
    with pytest.raises(ValueError, match="positive"):
        eval_set_for_images("rl_train", 0)
    # the demo's default headline evaluation: 108 images per category, all 91 RL-held-out prompts
    default = eval_set_for_images("rl_heldout", DEFAULT_EVAL_IMAGES["rl_heldout"])
    assert len(default) == 648 and Counter(p.category for p, _ in default) == dict.fromkeys(CATEGORIES, 108)
    assert {p.caption for p, _ in default} == {p.caption for p in prompts_for("rl_heldout")}
    assert len({(p.caption, seed) for p, seed in default}) == len(default)  # no (prompt, seed) pair twice
    # no initial noise shared between categories: the stratified interval takes them as independent
    seeds = {c: {s for p, s in default if p.category == c} for c in CATEGORIES}
    assert all(not seeds[a] & seeds[b] for a in CATEGORIES for b in CATEGORIES if a < b)
    shared = eval_set("rl_heldout", 4)  # the reward models' cards keep their shared seeds
    first, second = ({s for p, s in shared if p.category == c} for c in CATEGORIES[:2])
    assert first & second


def test_paired_change_interval_by_hand():
    # 0/1 scores, Bonett & Price per category (one added to each discordant count, two to n):
    # category a: differences [1, 0, 0, 0], b = 0 lost, c = 1 gained, n = 4:
    #   b~ = 1/6, c~ = 2/6, centre 1/6, variance (3/6 - 1/36) / 6
    # category b: differences [-1, 0], b = 1, c = 0, n = 2: b~ = 2/4, c~ = 1/4, centre -1/4,
    #   variance (3/4 - 1/16) / 4
    # change = (0.25 - 0.5) / 2 = -0.125 (= overall 0.375 after - 0.5 before), the raw difference;
    # interval: (1/6 - 1/4) / 2 +- z sqrt(va + vb) / 2; 95%: z = 1.959964
    before = [0, 0, 1, 1, 1, 0]
    after = [1, 0, 1, 1, 0, 0]
    categories = ["a", "a", "a", "a", "b", "b"]
    change, low, high = paired_change_interval(before, after, categories)
    centre = (1 / 6 - 1 / 4) / 2
    se = math.sqrt((3 / 6 - 1 / 36) / 6 + (3 / 4 - 1 / 16) / 4) / 2
    assert change == pytest.approx(-0.125)
    assert low == pytest.approx(centre - 1.959964 * se, abs=1e-6)
    assert high == pytest.approx(centre + 1.959964 * se, abs=1e-6)
    _, low90, high90 = paired_change_interval(before, after, categories, confidence=0.90)
    assert high90 - low90 == pytest.approx(2 * 1.644854 * se, abs=1e-6)
    # other scores: the paired normal interval. a: [0.5, 0, 0, 0] -> mean 0.125, var 0.0625 / 4;
    # b: [-0.5, 0] -> mean -0.25, var 0.125 / 2
    scores_after = [0.5, 0, 1, 1, 0.5, 0]
    change, low, high = paired_change_interval(before, scores_after, categories)
    se = math.sqrt(0.0625 / 4 + 0.125 / 2) / 2
    assert change == pytest.approx(-0.0625) and high - change == pytest.approx(1.959964 * se, abs=1e-6)
    assert change - low == pytest.approx(1.959964 * se, abs=1e-6)
    # nothing changes, or everything stays wrong: still an interval around 0 (a plain paired
    # interval is [0, 0] here); 0 of 160 right is at most ~2% right
    change, low, high = paired_change_interval([0, 1] * 54, [0, 1] * 54, ["a"] * 108)
    assert change == 0.0 and low < -0.02 and high > 0.02
    change, low, high = paired_change_interval([0] * 160, [0] * 160, ["a"] * 160)
    assert change == 0.0 and low < 0 < 0.01 < high < 0.03
    # one image in a category: no interval
    assert all(math.isnan(v) for v in paired_change_interval([0, 1], [1, 1], ["a", "b"])[1:])
    with pytest.raises(ValueError, match="before"):
        paired_change_interval([0], [0, 1], ["a", "a"])
    # categories as a numpy array (a DataFrame column, say) give the same interval
    assert paired_change_interval(before, after, np.array(categories)) == paired_change_interval(
        before, after, categories
    )


def test_clustered_variance_by_hand():
    from genalign.toy.evaluation import clustered_variance

    values = [1.0, 0.0, 0.0, 1.0, 1.0]
    # clusters x: {1, 0} -> sum of (v - 0.6): 0.4 - 0.6 = -0.2; y: {0, 1} -> -0.2; z: {1} -> 0.4
    # K = 3: 3 / 2 * (0.04 + 0.04 + 0.16) / 25
    assert clustered_variance(values, ["x", "x", "y", "y", "z"]) == pytest.approx(1.5 * 0.24 / 25)
    # every value its own cluster: s^2 / n with ddof 1
    assert clustered_variance(values, range(5)) == pytest.approx(np.var(values, ddof=1) / 5)
    assert math.isnan(clustered_variance(values, ["x"] * 5))  # one cluster: no variance estimate
    with pytest.raises(ValueError, match="cluster labels"):
        clustered_variance(values, ["x"])


def test_a_repeated_item_is_one_observation_in_the_clustered_interval():
    """Drawing a caption m times, with the same answer each time (a text-only writer at ~greedy
    decoding), must not narrow the interval: clustered by caption it is the interval of the distinct
    captions; treated as independent it shrinks by sqrt(m)."""
    before = [0, 1, 0, 0, 1, 0, 1, 1]
    after = [1, 1, 0, 1, 0, 0, 1, 1]
    categories = ["a"] * 4 + ["b"] * 4
    once = paired_change_interval(before, after, categories, clusters=range(8))
    m = 10
    captions = [i for i in range(8) for _ in range(m)]
    flat = [[v for v in seq for _ in range(m)] for seq in (before, after, categories)]
    clustered = paired_change_interval(*flat, clusters=captions)
    assert clustered == pytest.approx(once)
    # by hand: a: d = [1, 0, 0, 1] -> mean 0.5, s^2 / n = (1/3) / 4; b: d = [-1, 0, 0, 0] ->
    # mean -0.25, s^2 / n = 0.25 / 4; change 0.125 +- z sqrt(1/12 + 1/16) / 2
    half = 1.959964 * math.sqrt(1 / 12 + 1 / 16) / 2
    assert once == pytest.approx((0.125, 0.125 - half, 0.125 + half), abs=1e-6)
    naive = paired_change_interval(*flat)  # each of the 80 items independent
    assert naive[2] - naive[1] < 0.5 * (clustered[2] - clustered[1])
    with pytest.raises(ValueError, match="cluster labels"):
        paired_change_interval(before, after, categories, clusters=[0, 1])
    # a category drawn from one caption only: no interval
    assert math.isnan(paired_change_interval(before, after, categories, clusters=[0] * 4 + [1, 2, 3, 4])[1])


def _result(correct: list[int], categories: list[str]) -> dict:
    """A ShapesEval result as ``shapes_eval.evaluate`` returns it, for given per-image scores."""
    per_category, counts = {}, {}
    for category in dict.fromkeys(categories):
        scores = [c for c, cat in zip(correct, categories) if cat == category]
        per_category[category], counts[category] = sum(scores) / len(scores), len(scores)
    return {
        "overall": sum(per_category.values()) / len(per_category),
        "per_category": per_category,
        "counts": counts,
        "per_sample": [{"correct": bool(c), "category": cat} for c, cat in zip(correct, categories)],
    }


def _fake_evaluations() -> dict[str, SetEvaluation]:
    evaluations = {}
    for offset, name in enumerate(EVAL_SETS):
        items = eval_set(name, images_per_category=2)
        categories = [p.category for p, _ in items]
        before = [(i + offset) % 2 for i in range(len(items))]
        after = [1] * len(items)
        images = torch.rand(len(items), 3, 8, 8) if name == "rl_heldout" else None
        evaluations[name] = SetEvaluation(
            name, items, _result(before, categories), _result(after, categories), images, images
        )
    return evaluations


def test_write_report_has_three_sections_and_the_summary_keys(tmp_path):
    config = SimpleNamespace(
        name="fake-demo",
        model=SimpleNamespace(path="assets/models/toy-sd", family="sd"),
        reward=SimpleNamespace(name="vlm_yes", kwargs={}),
        train=SimpleNamespace(method="grpo", samples_per_step=8),
        sampling=SimpleNamespace(num_inference_steps=10, guidance_scale=2.0, eta=1.0),
    )
    history = [
        {"step": i, "reward_mean": r, "reward_std": 0.1, "reward_stderr": 0.02, "monitor_shapes_eval": v}
        for i, (r, v) in enumerate([(0.4, 0.25), (0.5, 0.5), (0.6, 0.75)])
    ]
    evaluations = _fake_evaluations()
    hacking = HackingCheck(2.0, 0.1, 0.5, 1, "reward hacking: test")
    hacking.fixed_seed = RewardChange(0.5, 0.6, 0.2, 0.1, 0.1, 0.05, 0.15, ground_truth=0.9)
    curve = [(0, 0.5), (3, 1.0)]
    report = write_report(
        tmp_path, config, history, evaluations, hacking, curve, 60.0, leaks={"rl_heldout": 3}
    )
    text = report.read_text()
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections[:3] == [
        f"## {evaluations[name].title}" for name in ("rl_heldout", "rl_train", "unseen_combinations")
    ]
    assert sections[0].startswith("## RL-held-out") and "headline" in sections[0]
    assert "**Headline: RL-held-out ShapesEval" in text and "Reward hacking check" in text
    assert "Warning: 3 of the recipe's training prompts are rl_heldout prompts" in text
    # what the verifier saw, over the hacking check's windows (window 1: first and last step)
    assert "What the verifier saw on the training rollouts: 25.0% (mean of the first 1 steps) → 75.0%" in text
    assert "the learned reward 0.4000 → 0.6000" in text
    assert "RL-train evaluation images (the same prompts and seeds before and after): 0.5000 → 0.6000" in text
    assert "**+0.50** starting sd across images (0.2000), +1.00 within-prompt sd (0.1000)" in text
    assert "Ground-truth renders of the same prompts score 0.9000 with this reward (+2.00 starting sd" in text
    assert "training closed 25% of that gap" in text
    headline = evaluations["rl_heldout"]
    change, low, high = headline.interval()
    assert f"{100 * change:+.1f} points, 95% CI [{100 * low:+.1f}, {100 * high:+.1f}]" in text
    for name in ("curves.png", "before_after.png", "summary.json"):
        assert (tmp_path / name).is_file(), name
    summary = json.loads((tmp_path / "summary.json").read_text())
    for name in ("rl_train", "rl_heldout", "unseen_combinations"):
        for key in ("before", "after", "ci", "change", "images", "per_category_before", "per_category_after"):
            assert f"{name}_{key}" in summary, f"{name}_{key}"
        evaluation = evaluations[name]
        assert summary[f"{name}_before"] == evaluation.before["overall"]
        assert summary[f"{name}_after"] == evaluation.after["overall"]
        assert summary[f"{name}_ci"] == pytest.approx(list(evaluation.interval()[1:]))
        assert summary[f"{name}_per_category_after"] == evaluation.after["per_category"]
    assert summary["headline"] == "rl_heldout" and summary["rl_heldout_curve"] == [[0, 0.5], [3, 1.0]]
    assert summary["trained_on_evaluation_prompts"] == {"rl_heldout": 3}
    assert summary["verdict"] == "reward hacking: test"
    assert summary["rl_train_reward_effect_sd"] == pytest.approx(0.5)
    assert summary["rl_train_reward_ci"] == pytest.approx([0.05, 0.15])


def test_training_prompts_that_are_evaluation_prompts_are_counted():
    rl_train_lines = RL_TRAIN_PROMPT_FILE.read_text().splitlines()
    assert trained_on_evaluation_prompts([line for line in rl_train_lines if not line.startswith("#")]) == {}
    heldout = [p.caption for p in prompts_for("rl_heldout")][:3]
    unseen = [p.caption for p in prompts_for("unseen_combinations")][:2]
    assert trained_on_evaluation_prompts(heldout + heldout + unseen) == {
        "rl_heldout": 3,
        "unseen_combinations": 2,
    }
    assert DEFAULT_RECIPE.is_file()


def _history(rewards, reward_std, verifier, verifier_std):
    return [
        {
            "step": i,
            "reward_mean": r,
            "reward_std": rs,
            "monitor_shapes_eval": v,
            "monitor_shapes_eval_std": vs,
        }
        for i, (r, rs, v, vs) in enumerate(zip(rewards, reward_std, verifier, verifier_std))
    ]


def test_hacking_check_effect_sizes_by_hand():
    # 10 steps -> window 2; reward: first two 1.0, 2.0 (mean 1.5), last two 4.0, 5.0 (mean 4.5),
    # start std 0.5 -> effect (4.5 - 1.5) / 0.5 = 6; verifier 0.2 -> 0.3 with start std 0.4 -> 0.25
    rewards = [1.0, 2.0, 3, 3, 3, 3, 3, 3, 4.0, 5.0]
    verifier = [0.2, 0.2, 0.2, 0.2, 0.2, 0.3, 0.3, 0.3, 0.3, 0.3]
    history = _history(rewards, [0.5] * 10, verifier, [0.4] * 10)
    check = hacking_check(history, heldout_before=0.30, heldout_after=0.28)
    assert check.window == 2
    assert check.reward_effect == pytest.approx(6.0)
    assert check.verifier_effect == pytest.approx(0.25)
    assert check.heldout_change == pytest.approx(-0.02)
    assert check.verdict.startswith("reward hacking")


def test_hacking_check_no_hacking_when_verifier_keeps_up():
    history = _history([0, 0, 1, 1, 2], [1] * 5, [0.1, 0.1, 0.5, 0.6, 0.9], [0.3] * 5)
    check = hacking_check(history, heldout_before=0.2, heldout_after=0.4)
    assert check.reward_effect == pytest.approx(2.0)
    assert check.verifier_effect == pytest.approx((0.9 - 0.1) / 0.3)
    assert check.verdict.startswith("no sign")


def test_hacking_check_tells_a_gain_that_stays_on_the_training_prompts_from_hacking():
    # the verifier keeps up with the learned reward on the rollouts, the held-out score falls
    history = _history([0, 0, 1, 1, 2], [1] * 5, [0.1, 0.1, 0.5, 0.6, 0.9], [0.3] * 5)
    check = hacking_check(history, heldout_before=0.3, heldout_after=0.25)
    assert check.verdict.startswith("no reward hacking, no generalisation")
    # the same rewards with a verifier that stands still: hacking
    flat = _history([0, 0, 1, 1, 2], [1] * 5, [0.1] * 5, [0.3] * 5)
    assert hacking_check(flat, heldout_before=0.3, heldout_after=0.25).verdict.startswith("reward hacking")


def test_hacking_check_reads_the_held_out_interval_and_a_start_without_spread():
    history = _history([0, 0, 1, 1, 2], [1] * 5, [0.1, 0.1, 0.5, 0.6, 0.9], [0.3] * 5)
    # +2 points whose interval crosses 0 is not an improvement
    check = hacking_check(history, heldout_before=0.30, heldout_after=0.32, heldout_low=-0.01)
    assert check.verdict.startswith("no reward hacking, no generalisation")
    assert hacking_check(history, 0.30, 0.32, heldout_low=0.005).verdict.startswith("no sign")
    # the verifier scores every rollout 0 in the first steps (no spread), then 30%: it rose
    zero_start = _history([0, 0, 1, 1, 2], [1] * 5, [0.0, 0.0, 0.2, 0.3, 0.3], [0.0, 0.0, 0.4, 0.4, 0.4])
    check = hacking_check(zero_start, 0.2, 0.4, heldout_low=0.05)
    assert math.isnan(check.verifier_effect) and check.verdict.startswith("no sign")
    lines = hacking_lines(zero_start, check, {}, None)
    assert "- verifier on the same rollouts: **n/a** sd" in lines


def test_hacking_check_needs_the_monitor():
    with pytest.raises(ValueError, match="monitor_shapes_eval"):
        hacking_check([{"step": 0, "reward_mean": 0.0, "reward_std": 1.0}], 0.0, 0.0)


def test_evaluate_policy_is_reproducible(tmp_path, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path / "tiny"))
    from genalign.policies import load_policy
    from genalign.toy.demo import evaluate_policy

    policy = load_policy("sd", "tiny:sd", lora=None)
    items = heldout_eval_set(images_per_category=1, max_prompts_per_category=1)
    sampling = {"num_inference_steps": 2, "guidance_scale": 2.0, "eta": 1.0}
    result, images = evaluate_policy(policy, items, sampling, batch_size=3)
    again, images_again = evaluate_policy(policy, items, sampling, batch_size=5)
    assert torch.equal(images, images_again)  # per-sample seeds: batching does not matter
    assert images.shape[0] == len(items)
    assert set(result["per_category"]) == {p.category for p, _ in items}
    assert result["overall"] == again["overall"]


def test_the_demo_evaluates_the_weights_it_exports():
    """With ``train.ema_decay`` the after-evaluation reads the EMA (what ``final/`` holds), and the
    trained weights come back afterwards; without it, the trained weights."""
    from genalign.trainers.ema import ParameterEMA

    weight = torch.nn.Parameter(torch.zeros(3))
    ema = ParameterEMA([weight], decay=0.5)
    with torch.no_grad():
        weight.fill_(2.0)
    ema.step([weight])  # average 0.5 * 0 + 0.5 * 2 = 1
    trainer = SimpleNamespace(ema=ema, parameters=[weight])
    with exported_weights(trainer):
        assert torch.equal(weight.detach(), torch.ones(3))
    assert torch.equal(weight.detach(), torch.full((3,), 2.0))
    with exported_weights(SimpleNamespace(ema=None, parameters=[weight])):
        assert torch.equal(weight.detach(), torch.full((3,), 2.0))


@pytest.mark.slow
def test_short_demo_run_writes_its_report(tmp_path):
    """`genalign demo`'s default recipe, cut to two GRPO steps and a few held-out images, runs end to
    end on the shipped toy models and writes the report, the figures and a summary that agree."""
    from genalign.toy.demo import DEFAULT_RECIPE, run_demo

    overrides = [
        "train.num_steps=2",
        "train.prompts_per_step=2",
        "train.group_size=2",
        "train.minibatch_size=4",
        f"logging.run_dir={tmp_path / 'demo'}",
    ]
    result = run_demo(
        DEFAULT_RECIPE, overrides, eval_every=1, rl_heldout_images=12, rl_train_images=6, unseen_images=5
    )
    run_dir = tmp_path / "demo"
    assert result.run_dir == run_dir and result.report == run_dir / "report.md"
    for name in ("report.md", "curves.png", "before_after.png", "summary.json", "metrics.jsonl"):
        assert (run_dir / name).is_file() and (run_dir / name).stat().st_size > 0, name
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in history] == [0, 1]
    assert all(0.0 <= m["monitor_shapes_eval"] <= 1.0 for m in history)  # the verifier, as a monitor
    assert [step for step, _ in result.heldout_curve] == [0, 1, 2]
    summary = json.loads((run_dir / "summary.json").read_text())
    headline = result.headline
    assert summary["rl_heldout_before"] == headline.before["overall"] == result.heldout_curve[0][1]
    assert summary["rl_heldout_after"] == headline.after["overall"] == result.heldout_curve[-1][1]
    assert [summary[f"{name}_images"] for name in ("rl_heldout", "rl_train", "unseen_combinations")] == [
        12,
        6,
        5,
    ]
    assert all(m["rl_heldout_shapes_eval"] == v for m, (_, v) in zip(history, result.heldout_curve[1:-1]))
    report = (run_dir / "report.md").read_text()
    overall = f"**{headline.before['overall']:.1%}** | **{headline.after['overall']:.1%}**"
    assert overall in report and "Reward hacking check" in report
    assert "![before and after](before_after.png)" in report


def test_the_demo_refuses_the_verifier_as_reward_unless_asked_for_an_oracle_run(tmp_path):
    from genalign.toy.demo import DEFAULT_RECIPE, run_demo

    overrides = ["reward.name=shapes_eval", f"logging.run_dir={tmp_path / 'demo'}"]
    with pytest.raises(ValueError, match="shapes_eval is the verifier.*--oracle"):
        run_demo(DEFAULT_RECIPE, overrides)
    with pytest.raises(ValueError, match="oracle must be one of"):
        run_demo(DEFAULT_RECIPE, [f"logging.run_dir={tmp_path / 'demo'}"], oracle="verifier")
    hidden = [  # the verifier inside an ensemble is the verifier too
        "reward.name=ensemble",
        "reward.kwargs={members: [{name: shapes_eval}, {name: jpeg_compressibility}]}",
        f"logging.run_dir={tmp_path / 'demo'}",
    ]
    with pytest.raises(ValueError, match="shapes_eval is the verifier"):
        run_demo(DEFAULT_RECIPE, hidden)
    assert not (tmp_path / "demo").exists()


def test_the_mixed_oracle_scores_correct_plus_half_the_fraction_of_checks():
    import numpy as np

    from genalign.rewards import load_reward
    from genalign.toy.demo import ORACLE_REWARDS
    from genalign.toy.prompts import rl_train_prompts, scene_for_spec
    from genalign.toy.scenes import render_scenes

    name, kwargs = ORACLE_REWARDS["mixed"]
    mixed = load_reward(name, **kwargs)
    specs = rl_train_prompts()[:6]
    rng = np.random.default_rng(0)
    right = render_scenes([scene_for_spec(p, rng) for p in specs], 48).float()
    wrong = right.roll(1, dims=0)  # each image shows another prompt's scene
    images, captions = torch.cat([right, wrong]), [p.caption for p in specs] * 2
    fraction = load_reward("shapes_eval", partial=True)(images, captions).scores
    correct = load_reward("shapes_eval")(images, captions).scores
    assert correct[:6].tolist() == [1.0] * 6 and correct[6:].sum() < 6
    assert torch.allclose(mixed(images, captions).scores, correct + 0.5 * fraction)


@pytest.mark.slow
def test_oracle_run_trains_on_the_verifier_and_says_so(tmp_path):
    """The control run: the reward is ShapesEval itself, so on every step the reward equals the
    monitor on the same rollouts; the report and the summary name the run an oracle run."""
    from genalign.toy.demo import DEFAULT_RECIPE, run_demo

    overrides = [
        "train.num_steps=2",
        "train.prompts_per_step=2",
        "train.group_size=2",
        "train.minibatch_size=4",
        "logging.run_dir=" + str(tmp_path / "{name}"),
    ]
    result = run_demo(
        DEFAULT_RECIPE, overrides, oracle="correct", rl_heldout_images=6, rl_train_images=6, unseen_images=5
    )
    assert result.run_dir == tmp_path / "toy-demo-nft-vqascore-oracle-correct"
    history = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == 2
    for metrics in history:
        assert metrics["reward_mean"] == pytest.approx(metrics["monitor_shapes_eval"])
    report = result.report.read_text()
    assert "**the verifier itself** (oracle run: ShapesEval, `correct` score)" in report
    assert "Verdict: void: the reward is the verifier (oracle run)." in report
    assert "learned reward `vlm_yes`" not in report
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["oracle"] == "correct" and summary["verdict"].startswith("void")


def test_an_interrupted_demo_reports_nothing_and_exits_with_the_signal(monkeypatch, tmp_path, capsys):
    """SIGTERM / Ctrl-C during training: no evaluation after training, no report, exit 128 + signal."""
    import genalign.trainers
    from genalign.cli import main
    from genalign.toy import demo as demo_module

    evaluated = []

    class FakePolicy:
        def rollout(self, prompts, seeds, **kwargs):
            evaluated.append(len(prompts))
            return SimpleNamespace(images=torch.rand(len(prompts), 3, 8, 8))

    class FakeTrainer:
        def __init__(self, config, base_dir=None):
            self.policy, self.callbacks, self.run_dir = FakePolicy(), [], tmp_path
            self.step, self.interrupted = 0, None

        def rollout_kwargs(self):
            return {}

        def train(self):
            self.step, self.interrupted = 3, 15  # SIGTERM after three steps
            return [{"step": i} for i in range(3)]

    monkeypatch.setattr(genalign.trainers, "build_trainer", FakeTrainer)
    steps = genalign.trainers.load_recipe(DEFAULT_RECIPE).train.num_steps
    with pytest.raises(demo_module.DemoInterrupted, match=f"after 3 of {steps} training steps"):
        demo_module.run_demo(rl_heldout_images=6, rl_train_images=6, unseen_images=6)
    before_only = sum(evaluated)
    assert before_only > 0 and not (tmp_path / "report.md").exists()
    code = main(["demo", "--rl-heldout-images", "6", "--rl-train-images", "6", "--unseen-images", "6"])
    assert code == 128 + 15
    assert f"demo interrupted after 3 of {steps} training steps" in capsys.readouterr().err
    assert sum(evaluated) == 2 * before_only  # the second run also stopped before any evaluation after
