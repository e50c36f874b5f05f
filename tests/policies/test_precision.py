"""Rollout precision backends: NVFP4 arithmetic against an independent reference, layer selection,
int8 accuracy, and each backend's rollouts against full precision on the tiny flow models."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from genalign.policies import LoRASpec, load_policy
from genalign.policies.precision import (
    merged_copy,
    nvfp4_fake_quantize,
    quantize_denoiser,
    round_to_e2m1,
    select_linear_layers,
    swapped_denoiser,
)

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


# ---- an independent scalar reference of NVFP4 -----------------------------------------------------
def ref_e2m1(value: float) -> float:
    """Nearest E2M1 value by exhaustive search; a tie goes to the even code (index in E2M1)."""
    magnitude = min(abs(value), 6.0)
    best = min(range(8), key=lambda i: (abs(magnitude - E2M1[i]), i % 2))
    return math.copysign(E2M1[best], value)


def ref_e4m3(value: float) -> float:
    """Round a non-negative float to FP8 E4M3 (bias 7, 3 mantissa bits, max 448), ties to even."""
    if value == 0:
        return 0.0
    value = min(value, 448.0)
    exponent = max(
        math.frexp(value)[1] - 1, -6
    )  # value = m * 2^exponent with m in [1, 2); subnormal below 2^-6
    quantum = 2.0 ** (exponent - 3)
    steps = value / quantum
    lower = math.floor(steps)
    fraction = steps - lower
    rounded = lower + (1 if fraction > 0.5 or (fraction == 0.5 and lower % 2 == 1) else 0)
    return min(rounded * quantum, 448.0)


def ref_nvfp4(x: torch.Tensor) -> torch.Tensor:
    """NVFP4 quantise-dequantise along the last dim, element by element in Python floats."""
    rows = x.double().reshape(-1, x.shape[-1]).tolist()
    amax = max(abs(v) for row in rows for v in row)
    tensor_scale = amax / (448.0 * 6.0)
    out = []
    for row in rows:
        new_row = []
        for start in range(0, len(row), 16):
            block = row[start : start + 16]
            block_scale = ref_e4m3(max(abs(v) for v in block) / 6.0 / tensor_scale)
            scale = block_scale * tensor_scale
            new_row += [ref_e2m1(v / scale) * scale if scale > 0 else 0.0 for v in block]
        out.append(new_row)
    return torch.tensor(out, dtype=torch.float64).reshape(x.shape)


def test_e2m1_rounding_ties_go_to_the_even_code():
    values = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.75, -2.4, 0.3, 5.1])
    expected = torch.tensor([ref_e2m1(v) for v in values.tolist()])
    assert round_to_e2m1(values).tolist() == expected.tolist()
    assert expected.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -1.0, -2.0, 0.5, 6.0]


def test_reference_e4m3_matches_known_codes():
    # 448 is the largest E4M3 value; 2^-9 the smallest subnormal; 1.0625 lies halfway between 1 and 1.125
    assert ref_e4m3(448.0) == 448.0 and ref_e4m3(500.0) == 448.0
    assert ref_e4m3(2.0**-9) == 2.0**-9
    assert ref_e4m3(1.0625) == 1.0 and ref_e4m3(1.1875) == 1.25
    assert ref_e4m3(17.0) == 16.0 and ref_e4m3(19.0) == 20.0


@pytest.mark.parametrize("case", ["gaussian", "known", "outlier"])
def test_simulated_nvfp4_matches_an_independent_block_quantisation(case):
    generator = torch.Generator().manual_seed(3)
    if case == "gaussian":
        x = torch.randn(6, 64, generator=generator)
    elif case == "known":  # blocks of exact E2M1 multiples and a zero block
        x = torch.tensor([E2M1 * 2, [-v for v in E2M1] * 2, [0.0] * 16, [0.1 * i for i in range(16)]])
    else:  # one large value makes the other blocks' scales small (subnormal E4M3 scales)
        x = torch.randn(4, 32, generator=generator) * 1e-3
        x[0, 0] = 50.0
    got = nvfp4_fake_quantize(x)
    torch.testing.assert_close(got.double(), ref_nvfp4(x), rtol=1e-6, atol=1e-9)
    if case == "known":  # values on the grid with amax 6 come back exactly
        torch.testing.assert_close(got[:2], x[:2])


def test_nvfp4_needs_blocks_of_16():
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4_fake_quantize(torch.randn(2, 24))


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.x_embedder = nn.Linear(32, 64)
        self.block = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 256))
        self.norm_out = nn.Linear(256, 32)
        self.odd = nn.Linear(64, 40)


def test_layer_selection_follows_sol_rl_name_and_size_rules():
    model = Blocks()
    selected, skipped = select_linear_layers(model, skip_modules=["x_embedder", "norm_out"], min_dim=64)
    assert selected == ["block.2"]
    assert skipped == {
        "x_embedder": "name_pattern",
        "block.0": "small_dim(<=64)",
        "norm_out": "name_pattern",
        "odd": "small_dim(<=64)",
    }
    selected, skipped = select_linear_layers(model, min_dim=0, block=16)
    assert selected == ["x_embedder", "block.0", "block.2", "norm_out"]
    assert skipped == {"odd": "dims_not_multiple_of_16"}


def test_int8_layers_match_fp32_within_four_percent():
    model = Blocks().eval()
    x = torch.randn(8, 32)
    with torch.no_grad():
        reference = model.block(model.x_embedder(x))
    quantized, report = quantize_denoiser(model, "int8")
    assert report.backend == "torch.ao.int8_dynamic" and not report.simulated
    assert len(report.quantized) == 5
    with torch.no_grad():
        got = quantized.block(quantized.x_embedder(x))
    relative = (got - reference).norm() / reference.norm()
    # per-channel int8 weights, per-tensor dynamic int8 (7-bit on x86) activations: 1.8-2.4% measured
    assert relative < 0.04, relative
    assert relative > 0  # really quantised


def test_gpu_formats_on_cpu_raise_or_fall_back_clearly():
    with pytest.raises(RuntimeError, match="CUDA GPU with compute capability >= 8.9"):
        quantize_denoiser(Blocks(), "fp8")
    model, report = quantize_denoiser(Blocks(), "nvfp4")
    assert report.simulated and report.backend == "simulated_nvfp4"
    assert "SIMULATED" not in repr(model) and "simulated NVFP4" in repr(model)
    with pytest.raises(ValueError, match="unknown rollout precision"):
        quantize_denoiser(Blocks(), "int4")


@pytest.fixture(scope="module")
def sd3_policy(tmp_path_factory):
    import os

    os.environ["GENALIGN_TINY_CACHE"] = str(tmp_path_factory.getbasetemp() / "tiny-cache")
    policy = load_policy("flow", "tiny:sd3", lora=LoRASpec(rank=4))
    generator = torch.Generator().manual_seed(0)
    for name, parameter in policy.denoiser.named_parameters():
        if "lora_B" in name:  # a trained-looking adapter, so merging matters
            parameter.data = torch.randn(parameter.shape, generator=generator) * 0.05
    return policy


def test_merged_copy_computes_the_lora_policy(sd3_policy):
    kwargs = {"num_inference_steps": 3, "guidance_scale": 1.0, "mode": "ode"}
    seeds = torch.tensor([5, 6])
    reference = sd3_policy.rollout(["a red circle", "a cat"], seeds=seeds, **kwargs)
    copy = merged_copy(sd3_policy.denoiser)
    assert not any("lora" in name for name, _ in copy.named_parameters())
    with swapped_denoiser(sd3_policy, copy, torch.float32):
        merged = sd3_policy.rollout(["a red circle", "a cat"], seeds=seeds, **kwargs)
    torch.testing.assert_close(merged.images, reference.images, atol=1e-5, rtol=0)
    with sd3_policy.reference():  # and differs from the base model
        base = sd3_policy.rollout(["a red circle", "a cat"], seeds=seeds, **kwargs)
    assert (base.images - reference.images).abs().max() > 1e-3


# max |image difference| (images in [0, 1]) after 4 ODE steps on the tiny SD3 model: measured
# fp32 1e-6, fp16 6e-4, bf16 6e-3, int8 7e-3, simulated NVFP4 0.13 (mean 0.02).
TOLERANCES = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 3e-2, "int8": 3e-2, "nvfp4_simulated": 0.3}


@pytest.mark.parametrize("precision", list(TOLERANCES))
def test_preview_images_stay_close_to_full_precision(sd3_policy, precision):
    kwargs = {"num_inference_steps": 4, "guidance_scale": 1.0, "mode": "ode"}
    prompts, seeds = ["a red circle", "a blue square"], torch.tensor([11, 12])
    noise = sd3_policy.rollout(prompts, seeds=seeds, num_inference_steps=1, guidance_scale=1.0).latents[:, 0]
    reference = sd3_policy.rollout(prompts, seeds=seeds, latents=noise, **kwargs)
    model, report = quantize_denoiser(sd3_policy.denoiser, precision)
    with swapped_denoiser(sd3_policy, model, report.compute_dtype):
        preview = sd3_policy.rollout(prompts, seeds=seeds, latents=noise, **kwargs)
    assert sd3_policy.model_dtype == torch.float32  # restored
    difference = (preview.images - reference.images).abs()
    assert difference.max() < TOLERANCES[precision], (precision, float(difference.max()))
    if precision == "nvfp4_simulated":
        assert difference.mean() < 0.05
        assert report.simulated
    if precision != "fp32":
        assert difference.max() > 0  # the backend really changed the computation


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_casting_a_preview_copy_logs_no_warning_a_user_cannot_act_on(sd3_policy, precision):
    """diffusers' ``ModelMixin.to(dtype)`` warns to use ``torch_dtype`` in ``from_pretrained`` on
    every cast; the preview copy is made in memory, so that advice cannot be followed."""
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    diffusers_logger = logging.getLogger("diffusers")  # its handlers write to the stderr of import time
    diffusers_logger.addHandler(handler)
    try:
        copy, report = quantize_denoiser(sd3_policy.denoiser, precision)
    finally:
        diffusers_logger.removeHandler(handler)
    assert not [r.getMessage() for r in records if "float32" in r.getMessage()]
    assert {p.dtype for p in copy.parameters()} == {report.compute_dtype}
    assert sd3_policy.denoiser.dtype == torch.float32  # the policy's own denoiser is untouched


# ---- fp8 on a GPU: zero rows must not become NaN (seen on an H200 with torchao 0.18) ---------------
class _RecordingTorchao:
    """Stands in for torchao where it is absent (CPU CI): records the config and the layers that
    ``quantize_denoiser`` asks torchao's float8 path to quantise."""

    def __init__(self, with_floor: bool = True) -> None:
        import dataclasses
        import types

        @dataclasses.dataclass
        class Config:
            granularity: object = None
            if with_floor:
                activation_value_lb: float | None = None

        self.calls: list[tuple[object, list[str]]] = []
        quantization = types.ModuleType("torchao.quantization")
        quantization.Float8DynamicActivationFloat8WeightConfig = Config
        quantization.PerRow = lambda: "per-row"

        def quantize_(model, config, filter_fn):
            self.calls.append((config, [n for n, m in model.named_modules() if filter_fn(m, n)]))

        quantization.quantize_ = quantize_
        self.modules = {"torchao": types.ModuleType("torchao"), "torchao.quantization": quantization}


@pytest.mark.parametrize("with_floor", [True, False])
def test_fp8_floors_the_activation_scale_and_keeps_zero_weight_rows_in_high_precision(
    monkeypatch, caplog, with_floor
):
    import sys

    from genalign.policies import precision

    fake = _RecordingTorchao(with_floor)
    for name, module in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(precision, "_cuda_capability", lambda model: (9, 0))
    model = Blocks()
    with torch.no_grad():
        model.block[0].weight[3].zero_()  # one all-zero output row
    _, report = quantize_denoiser(model, "fp8")
    ((config, layers),) = fake.calls
    assert "block.0" not in layers and report.skipped["block.0"] == "zero_weight_rows"
    assert layers == report.quantized == ["x_embedder", "block.2", "norm_out"]
    assert config.granularity == "per-row"
    if with_floor:
        assert config.activation_value_lb == precision.FP8_AMAX_FLOOR
    else:  # an older torchao: said once, in words a user can act on
        assert "upgrade torchao" in caplog.text


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run by benchmarks/gpu_checks.sh)"
)
def test_fp8_on_a_gpu_keeps_all_zero_rows_finite():
    pytest.importorskip("torchao")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability >= 8.9")
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).cuda()
    quantized, _ = quantize_denoiser(model, "fp8")
    x = torch.randn(8, 64, device="cuda")
    x[2:5] = 0  # e.g. absent text-encoder tokens
    with torch.no_grad():
        out = quantized(x.bfloat16()).float()
        reference = model(x)
    assert torch.isfinite(out).all()
    assert (out - reference).abs().max() < 0.1 * reference.abs().max()
