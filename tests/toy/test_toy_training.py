"""The toy recipes' shared training setup (genalign.toy.training), checked by hand on a tiny model."""

from __future__ import annotations

import pytest
import torch

from genalign.toy.training import AveragedTraining, TrainingLog, ema_warmup, snapshots


def _modules() -> list[torch.nn.Module]:
    torch.manual_seed(0)
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    return [frozen, torch.nn.Linear(2, 1)]


def test_the_optimiser_trains_what_requires_grad_and_the_ema_averages_everything():
    frozen, trained = _modules()
    training = AveragedTraining.of([frozen, trained], lr=1e-2, steps=10, ema_decay=0.9, max_warmup=2)
    assert [id(p) for p in training.params] == [id(p) for p in trained.parameters()]
    assert len(training.ema.shadow_params) == 4  # the frozen module's weight and bias too
    assert all(not p.requires_grad for m in training.averaged for p in m.parameters())
    assert training.optimizer.param_groups[0]["weight_decay"] == 0.01


def test_a_run_moves_the_weights_and_the_averages_follow_the_warm_ema_by_hand():
    frozen, trained = _modules()
    training = AveragedTraining.of([frozen, trained], lr=1e-2, steps=3, ema_decay=0.99, max_warmup=1)
    x, y = torch.ones(4, 2), torch.zeros(4, 1)
    shadow = [p.detach().clone() for p in trained.parameters()]
    history = []

    def loss_fn(step: int) -> torch.Tensor:
        return ((trained(frozen(x)) - y) ** 2).mean()

    def after_step(done: int) -> None:  # the EMA by hand: decay min(0.99, (1 + k) / (10 + k))
        decay = ema_warmup(0.99)(done - 1)
        for s, p in zip(shadow, trained.parameters()):
            s.mul_(decay).add_(p.detach(), alpha=1 - decay)
        history.append(done)

    done = training.run(loss_fn, 3, TrainingLog(10, 3, "test"), after_step=after_step)
    assert done == 3 and history == [1, 2, 3]
    _, averaged = training.averages()
    for mine, theirs in zip(shadow, averaged.parameters()):
        assert torch.allclose(mine, theirs, atol=1e-7)
    assert not torch.allclose(averaged.weight, trained.weight)  # an average, not the last weights


def test_a_constant_ema_when_not_warmed():
    training = AveragedTraining.of(_modules(), lr=1e-3, steps=2, ema_decay=0.5, max_warmup=1, warm_ema=False)
    assert training.ema_decay is None  # optimise leaves ParameterEMA's decay at 0.5


@pytest.mark.parametrize(("out", "every", "expected"), [("run", 2, [2, 4]), (None, 2, []), ("run", None, [])])
def test_snapshots_every_n_steps_under_out(tmp_path, out, every, expected):
    saved = []
    callback = snapshots(
        None if out is None else tmp_path / out, every, lambda folder, done: saved.append((folder, done))
    )
    for done in range(1, 5):
        callback(done)
    assert saved == [(tmp_path / "run" / "snapshot", d) for d in expected]
