"""The demo's pieces: the held-out evaluation set, the hacking check, the report."""

from __future__ import annotations

import json

import pytest
import torch

from genalign.toy import heldout_prompts, is_heldout
from genalign.toy.demo import hacking_check, heldout_eval_set


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
    result = run_demo(DEFAULT_RECIPE, overrides, images_per_category=2, eval_every=1)
    run_dir = tmp_path / "demo"
    assert result.run_dir == run_dir and result.report == run_dir / "report.md"
    for name in ("report.md", "curves.png", "before_after.png", "summary.json", "metrics.jsonl"):
        assert (run_dir / name).is_file() and (run_dir / name).stat().st_size > 0, name
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in history] == [0, 1]
    assert all(0.0 <= m["monitor_shapes_eval"] <= 1.0 for m in history)  # the verifier, as a monitor
    assert [step for step, _ in result.heldout_curve] == [0, 1, 2]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["heldout_before"] == result.before["overall"] == result.heldout_curve[0][1]
    assert summary["heldout_after"] == result.after["overall"] == result.heldout_curve[-1][1]
    report = (run_dir / "report.md").read_text()
    overall = f"**{result.before['overall']:.1%}** | **{result.after['overall']:.1%}**"
    assert overall in report and "Reward hacking check" in report
    assert "![before and after](before_after.png)" in report


def test_the_demo_refuses_the_verifier_as_reward_unless_asked_for_an_oracle_run(tmp_path):
    from genalign.toy.demo import DEFAULT_RECIPE, run_demo

    overrides = ["reward.name=shapes_eval", f"logging.run_dir={tmp_path / 'demo'}"]
    with pytest.raises(ValueError, match="shapes_eval is the verifier.*--oracle"):
        run_demo(DEFAULT_RECIPE, overrides)
    with pytest.raises(ValueError, match="oracle must be one of"):
        run_demo(DEFAULT_RECIPE, [f"logging.run_dir={tmp_path / 'demo'}"], oracle="verifier")
    assert not (tmp_path / "demo").exists()


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
    result = run_demo(DEFAULT_RECIPE, overrides, images_per_category=1, oracle="correct")
    assert result.run_dir == tmp_path / "toy-demo-grpo-vqascore-oracle-correct"
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
