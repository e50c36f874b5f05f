"""Dynamic loss scaling of fp16 runs (genalign/trainers/loss_scale.py): GradScaler's semantics,
gradients in true units after unscaling, overflow skips, growth, resume, and fp32 / bf16 runs on
the path they always took."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from genalign.trainers.loss_scale import DynamicLossScale, computes_in_float16

from .tiny_ddpo import make_trainer, params

FP16 = "model.dtype=float16"  # as configs/sd15/ddpo_aesthetic.yaml: a frozen fp16 UNet, fp32 LoRA


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def rows(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in lines]


# ---- the scaler on its own --------------------------------------------------------------------


def test_the_scale_follows_torch_gradscaler_step_for_step():
    # the same sequence of good and overflowing steps through torch.amp.GradScaler and ours
    events = [True, True, False, True, True, True, True, True, True, True, False, False, True, True, True]
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.0)
    reference = torch.amp.GradScaler("cpu", growth_interval=3)
    ours = DynamicLossScale(growth_interval=3)
    seen = set()
    assert ours.scale == reference.get_scale() == 2.0**16  # the defaults match
    for good in events:
        optimizer.zero_grad()
        loss = weight.sum() * (1.0 if good else math.inf)
        reference.scale(loss).backward()
        reference.step(optimizer)
        reference.update()
        ours.update(good)
        assert ours.scale == reference.get_scale()
        assert ours.good_steps == reference._get_growth_tracker()
        seen.add(ours.scale)
    assert seen == {2.0**15, 2.0**16, 2.0**17}  # it backed off and grew


def test_scale_and_unscale_are_exact_inverses_in_true_units():
    scaler = DynamicLossScale(init_scale=2.0**10)
    weight = torch.nn.Parameter(torch.tensor([0.5, -3.0]))
    scaler.scale_loss((weight * torch.tensor([1e-9, 2.0])).sum()).backward()
    assert torch.equal(weight.grad, torch.tensor([1e-9, 2.0]) * 2.0**10)
    scaler.unscale_([weight])
    assert torch.equal(weight.grad, torch.tensor([1e-9, 2.0]))


def test_state_dict_round_trips_and_bad_settings_fail():
    scaler = DynamicLossScale(growth_interval=5)
    for good in (True, True, False, True):
        scaler.update(good)
    fresh = DynamicLossScale()
    fresh.load_state_dict(json.loads(json.dumps(scaler.state_dict())))  # checkpoints store JSON
    assert (fresh.scale, fresh.good_steps, fresh.growth_interval) == (2.0**15, 1, 5)
    with pytest.raises(ValueError, match="backoff_factor"):
        DynamicLossScale(backoff_factor=1.0)


# ---- in the trainer ---------------------------------------------------------------------------


def test_fp16_gradients_are_scaled_then_logged_and_clipped_in_true_units(tmp_path, monkeypatch):
    scaled = make_trainer(tmp_path / "a", FP16)
    assert scaled.loss_scale is not None and scaled.loss_scale.scale == 2.0**16  # on by default
    seen = []
    unscale = DynamicLossScale.unscale_

    def spy(self, parameters):
        parameters = list(parameters)
        before = torch.cat([p.grad.flatten() for p in parameters]).norm()
        unscale(self, parameters)
        seen.append((float(before), float(torch.cat([p.grad.flatten() for p in parameters]).norm())))

    monkeypatch.setattr(DynamicLossScale, "unscale_", spy)
    torch.manual_seed(0)
    metrics = scaled.train_step(0)
    assert len(seen) == 2 and metrics["loss_scale"] == 2.0**16 and metrics["loss_scale_skips"] == 0
    for before, after in seen:  # backward saw the loss times 2**16; the clip saw true units
        assert before == pytest.approx(after * 2.0**16, rel=1e-5)
    assert metrics["grad_norm"] == pytest.approx(sum(a for _, a in seen) / 2, rel=1e-6)
    # the same step with a loss scale of 1: the same gradient, up to fp16 rounding
    unit = make_trainer(tmp_path / "b", FP16)
    unit.loss_scale = DynamicLossScale(init_scale=1.0)
    torch.manual_seed(0)
    plain = unit.train_step(0)
    assert plain["reward_mean"] == metrics["reward_mean"]  # the same rollouts
    assert metrics["grad_norm"] == pytest.approx(plain["grad_norm"], rel=0.1)


def test_an_overflowing_step_is_skipped_the_scale_halves_and_nothing_warns(tmp_path, monkeypatch, caplog):
    trainer = make_trainer(tmp_path, FP16)
    summed = trainer._sum_gradients_across_processes

    def overflow():  # an fp16 overflow reaches one entry of the summed gradient
        summed()
        trainer.parameters[0].grad.view(-1)[0] = math.inf

    monkeypatch.setattr(trainer, "_sum_gradients_across_processes", overflow)
    before = params(trainer)
    with caplog.at_level(logging.INFO, logger="genalign"):
        metrics = trainer.train_step(0)
    assert metrics["loss_scale_skips"] == 2 and metrics["nonfinite_grad_steps"] == 0
    assert metrics["loss_scale"] == trainer.loss_scale.scale == 2.0**14  # halved per skipped step
    assert trainer.optimizer_steps == 0 and "grad_norm" not in metrics
    after = params(trainer)
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert "loss scale now 32768" in caplog.text
    warned = [r for r in caplog.records if r.name.startswith("genalign") and r.levelno >= logging.WARNING]
    assert not warned  # an overflow is an expected event under fp16, not a user-facing problem
    assert all(p.grad is None for p in trainer.parameters)


def test_the_scale_grows_after_growth_interval_good_steps(tmp_path):
    trainer = make_trainer(tmp_path, FP16, "train.num_steps=2")
    trainer.loss_scale = DynamicLossScale(init_scale=2.0**10, growth_interval=3)
    history = trainer.train()
    # two optimizer steps per training step: the third one doubles the scale
    assert [row["loss_scale"] for row in history] == [2.0**10, 2.0**11]
    assert trainer.loss_scale.good_steps == 1 and trainer.optimizer_steps == 4
    assert all(row["loss_scale_skips"] == 0 for row in history)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fp32_and_bf16_runs_never_touch_the_scaler(tmp_path, monkeypatch, dtype):
    def refuse(*args, **kwargs):
        raise AssertionError("the loss scaler was used outside an fp16 run")

    for method in ("scale_loss", "unscale_", "update"):
        monkeypatch.setattr(DynamicLossScale, method, refuse)
    trainer = make_trainer(tmp_path / "a", f"model.dtype={dtype}", "train.num_steps=2")
    assert trainer.loss_scale is None and not computes_in_float16(trainer.policy)
    if dtype == "bfloat16":
        return  # the gate is what matters; the bf16 update is the fp32 one below
    history = trainer.train()
    assert not any("loss_scale" in key for row in history for key in row)
    # and the same weights as a run whose scaling is switched off by hand
    disabled = make_trainer(tmp_path / "b", "train.num_steps=2")
    disabled.loss_scale = None
    disabled.train()
    a, b = params(trainer), params(disabled)
    assert any(not torch.equal(a[name], p) for name, p in params(make_trainer(tmp_path / "c")).items())
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)


def test_an_fp16_run_resumes_with_its_loss_scale(tmp_path):
    def run(folder, *overrides):
        trainer = make_trainer(folder, FP16, *overrides)
        trainer.loss_scale = DynamicLossScale(growth_interval=3)  # the scale moves within 4 steps
        trainer.train()
        return trainer

    straight = run(tmp_path / "a", "train.num_steps=4")
    first = run(tmp_path / "b", "train.num_steps=2")
    assert (first.loss_scale.scale, first.loss_scale.good_steps) == (2.0**17, 1)
    resumed = run(tmp_path / "b", "train.num_steps=4", "logging.resume=latest")
    assert (resumed.loss_scale.scale, resumed.loss_scale.good_steps) == (2.0**18, 2)
    assert (straight.loss_scale.scale, straight.loss_scale.good_steps) == (2.0**18, 2)
    a, b = params(straight), params(resumed)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)
    assert rows(straight.metrics_path) == rows(resumed.metrics_path)
    assert [row["loss_scale"] for row in rows(resumed.metrics_path)] == [2.0**16, 2.0**17, 2.0**18, 2.0**18]
