from __future__ import annotations

import pytest
import torch

from genalign.trainers.checkpoint import load_checkpoint, save_checkpoint
from genalign.trainers.ema import ParameterEMA


def test_ema_hand_computed():
    parameter = torch.nn.Parameter(torch.tensor([1.0]))
    ema = ParameterEMA([parameter], decay=0.9, update_after_step=1)
    ema.step()  # first step copies: 1
    assert ema.shadow_params[0].item() == pytest.approx(1.0)
    with torch.no_grad():
        parameter.fill_(2.0)
    ema.step()  # 0.9 * 1 + 0.1 * 2 = 1.1
    assert ema.shadow_params[0].item() == pytest.approx(1.1)
    with torch.no_grad():
        parameter.fill_(3.0)
    ema.step()  # 0.9 * 1.1 + 0.1 * 3 = 1.29
    assert ema.shadow_params[0].item() == pytest.approx(1.29)
    assert ema.optimization_step == 3


def test_ema_without_warm_start_averages_from_the_initial_value():
    parameter = torch.zeros(2)
    ema = ParameterEMA([parameter], decay=0.75)
    parameter += 4.0
    ema.step()  # 0.75 * 0 + 0.25 * 4 = 1
    ema.step()  # 0.75 * 1 + 0.25 * 4 = 1.75
    torch.testing.assert_close(ema.shadow_params[0], torch.full((2,), 1.75))


def test_copy_to_and_swapped_restore_trained_weights():
    model = torch.nn.Linear(2, 2)
    ema = ParameterEMA(model.parameters(), decay=0.5)
    trained = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(2.0)
    ema.step()  # shadow = trained + 1
    with ema.swapped():
        for p, t in zip(model.parameters(), trained):
            torch.testing.assert_close(p, t + 1.0)
    for p, t in zip(model.parameters(), trained):
        torch.testing.assert_close(p, t + 2.0)

    with pytest.raises(RuntimeError, match="boom"), ema.swapped():
        raise RuntimeError("boom")
    for p, t in zip(model.parameters(), trained):
        torch.testing.assert_close(p, t + 2.0)  # restored despite the exception

    other = torch.nn.Linear(2, 2)
    ema.copy_to(other.parameters())
    for p, t in zip(other.parameters(), trained):
        torch.testing.assert_close(p, t + 1.0)


def test_low_precision_parameters_get_float32_shadows():
    parameter = torch.ones(4, dtype=torch.bfloat16)
    ema = ParameterEMA([parameter], decay=0.999)
    parameter += 1.0
    ema.step()
    assert ema.shadow_params[0].dtype == torch.float32
    # 1.001 is not representable in bf16 (spacing near 1 is 2^-7); the float32 shadow holds it
    assert ema.shadow_params[0][0].item() == pytest.approx(1.001)
    ema.copy_to()
    assert parameter.dtype == torch.bfloat16


def test_state_round_trip_through_checkpoint(tmp_path):
    parameters = [torch.randn(3), torch.randn(2, 2)]
    ema = ParameterEMA(parameters, decay=0.9, update_after_step=2)
    for _ in range(3):
        for p in parameters:
            p.add_(0.5)
        ema.step()
    path = save_checkpoint(tmp_path, 3, states={"ema": ema.state_dict()})

    restored = ParameterEMA([p.clone() for p in parameters], decay=0.5)
    restored.load_state_dict(load_checkpoint(path).states["ema"])
    assert (restored.decay, restored.update_after_step, restored.optimization_step) == (0.9, 2, 3)
    for p in parameters:
        p.add_(0.5)
    ema.step()
    restored.step(parameters)
    for a, b in zip(ema.shadow_params, restored.shadow_params):
        torch.testing.assert_close(a, b)


def test_mismatches_are_errors():
    ema = ParameterEMA([torch.zeros(2)], decay=0.9)
    with pytest.raises(ValueError, match="got 2 parameters for 1 EMA shadows"):
        ema.copy_to([torch.zeros(2), torch.zeros(2)])
    with pytest.raises(ValueError, match="shape"):
        ema.load_state_dict({**ema.state_dict(), "shadow_params": [torch.zeros(3)]})
    with pytest.raises(ValueError, match="decay"):
        ParameterEMA([torch.zeros(1)], decay=1.5)
