"""Rollout precision backends: a low-precision copy of a denoiser for cheap exploration rollouts.

Sol-RL (2025, Sec. 3; official code NVlabs/Sana ``train_scripts/sol_rl``) explores with a
quantised copy of the policy's denoiser (NVFP4 linear layers, embedders and the final layer kept
in high precision) and trains only on samples regenerated at full precision. This module builds
that copy:

=====================  ===========================================================  ============
precision              what happens to the selected ``nn.Linear`` layers            where
=====================  ===========================================================  ============
``fp32``               nothing (a merged fp32 copy)                                  anywhere
``bf16`` / ``fp16``    the whole copy is cast                                        anywhere
``fp8``                torchao float8 dynamic activation + weight (E4M3)             CUDA SM >= 8.9
``nvfp4``              torchao NVFP4 (FP4 E2M1, E4M3 block scales of 16, fp32        CUDA SM >= 10.0
                       per-tensor scale); elsewhere the simulated path below
``nvfp4_simulated``    **simulated** NVFP4: weights and activations are quantised    anywhere
                       and dequantised in fp32 (fidelity studies only, no speedup)
``int8``               dynamic int8 quantisation (``torch.ao`` ``quantize_dynamic``:  CPU
                       per-channel int8 weights, per-batch int8 activations): a real CPU speedup
=====================  ===========================================================  ============

Layer selection follows Sol-RL's ``replace_linear_with_te``: a linear layer keeps full precision
when its qualified name contains one of ``skip_modules`` or when ``max(in, out) <= min_dim``
(``min_dim = 0`` disables the size rule). LoRA adapters are merged into the copy first (Sol-RL's
``sync_lora_to_inference``), so the copy computes the policy as it is when the copy is made.

NVFP4 as NVIDIA defines it (NVIDIA, "NVFP4" in the Blackwell/Transformer Engine docs): values in
FP4 E2M1 (``{0, 0.5, 1, 1.5, 2, 3, 4, 6}`` and negatives), one FP8 E4M3 decode scale per block of
16 consecutive elements along the reduction dimension, and one FP32 per-tensor scale
``amax / (448 * 6)``; a value decodes as ``e2m1 * e4m3_block_scale * fp32_tensor_scale``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "fp16", "fp8", "nvfp4", "nvfp4_simulated", "int8")
NVFP4_BLOCK = 16
FP4_E2M1_MAX = 6.0
FP8_E4M3_MAX = 448.0


@dataclass
class PrecisionReport:
    """What :func:`quantize_denoiser` did.

    Attributes:
        precision: the requested precision.
        backend: the implementation used (``"cast"``, ``"torch.ao.int8_dynamic"``,
            ``"torchao.float8"``, ``"torchao.nvfp4"``, ``"simulated_nvfp4"``).
        simulated: True when the numbers are emulated in fp32 (never a speedup).
        compute_dtype: the dtype the copy's inputs must have.
        quantized: qualified names of the linear layers in low precision.
        skipped: qualified name -> reason for the linear layers kept in high precision.
    """

    precision: str
    backend: str
    simulated: bool
    compute_dtype: torch.dtype
    quantized: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


# ---- layer selection -------------------------------------------------------------------------------
def select_linear_layers(
    module: nn.Module, skip_modules: Sequence[str] = (), min_dim: int = 0, block: int = 1
) -> tuple[list[str], dict[str, str]]:
    """Split the ``nn.Linear`` layers of ``module`` into (quantised names, {skipped name: reason}).

    Sol-RL's rule: skip when a pattern of ``skip_modules`` is a substring of the qualified name,
    or when ``min_dim > 0`` and ``max(in_features, out_features) <= min_dim``. ``block`` adds the
    format's own constraint: ``in_features`` must be a multiple of it (16 for NVFP4/FP8 kernels).
    """
    selected, skipped = [], {}
    for name, child in module.named_modules():
        if not isinstance(child, nn.Linear):
            continue
        if any(pattern in name for pattern in skip_modules):
            skipped[name] = "name_pattern"
        elif min_dim > 0 and max(child.in_features, child.out_features) <= min_dim:
            skipped[name] = f"small_dim(<={min_dim})"
        elif block > 1 and (child.in_features % block or child.out_features % block):
            skipped[name] = f"dims_not_multiple_of_{block}"
        else:
            selected.append(name)
    return selected, skipped


def merged_copy(denoiser: nn.Module) -> nn.Module:
    """A frozen deep copy of ``denoiser`` with its active LoRA adapters merged into plain layers."""
    clone = copy.deepcopy(denoiser)
    for name, child in list(clone.named_modules()):
        if not (hasattr(child, "base_layer") and hasattr(child, "merge")):
            continue
        if not getattr(child, "disable_adapters", False):
            child.merge()
        parent_name, _, attribute = name.rpartition(".")
        parent = clone.get_submodule(parent_name) if parent_name else clone
        setattr(parent, attribute, child.get_base_layer())
    for attribute in ("peft_config", "_hf_peft_config_loaded"):
        if hasattr(clone, attribute):
            with contextlib.suppress(AttributeError):
                delattr(clone, attribute)
    return clone.requires_grad_(False).eval()


def _cast(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``model.to(dtype)`` without diffusers' ``ModelMixin.to`` warning: that warning asks for
    ``torch_dtype`` in ``from_pretrained``, which a cast of an in-memory copy cannot follow, and it
    fires on every cast even when the model keeps no module in float32. The cast is the same one
    ``ModelMixin.to`` makes after warning (``nn.Module.to``)."""
    return nn.Module.to(model, dtype)


def _replace(module: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attribute = name.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    setattr(parent, attribute, new)


# ---- NVFP4 arithmetic ------------------------------------------------------------------------------
def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest FP4 E2M1 value, ties to the even code, saturating at +-6.

    The positive E2M1 values are 0, 0.5, 1, 1.5 (spacing 0.5), 2, 3 (spacing 1), 4, 6 (spacing 2);
    ``torch.round`` rounds halves to even, which on each spacing is the even code.
    """
    a = x.abs().clamp(max=FP4_E2M1_MAX)
    q = torch.where(a < 2, torch.round(a * 2) / 2, torch.where(a < 4, torch.round(a), torch.round(a / 2) * 2))
    return torch.copysign(q.clamp(max=FP4_E2M1_MAX), x)


def nvfp4_fake_quantize(x: torch.Tensor, block_size: int = NVFP4_BLOCK) -> torch.Tensor:
    """Quantise ``x`` to NVFP4 along its last dimension and dequantise it again (fp32 result).

    Per tensor: ``s = amax(|x|) / (448 * 6)`` (fp32). Per block of ``block_size`` elements:
    ``d = e4m3(amax_block / 6 / s)``; each element becomes ``e2m1(x / (d * s)) * d * s``.
    """
    if x.shape[-1] % block_size:
        raise ValueError(f"NVFP4 needs the last dimension ({x.shape[-1]}) to be a multiple of {block_size}")
    data = x.float()
    amax = data.abs().amax()
    if amax == 0 or not torch.isfinite(amax):
        return data.clone() if amax == 0 else data
    tensor_scale = amax / (FP8_E4M3_MAX * FP4_E2M1_MAX)
    blocks = data.reshape(*data.shape[:-1], -1, block_size)
    block_amax = blocks.abs().amax(dim=-1, keepdim=True)
    block_scale = (block_amax / FP4_E2M1_MAX / tensor_scale).clamp(max=FP8_E4M3_MAX)
    block_scale = block_scale.to(torch.float8_e4m3fn).float()
    scale = block_scale * tensor_scale
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.where(scale > 0, round_to_e2m1(blocks / safe), torch.zeros_like(blocks))
    return (codes * scale).reshape(data.shape)


class SimulatedNVFP4Linear(nn.Module):
    """An ``nn.Linear`` whose weight and inputs are NVFP4 quantise-dequantised (W4A4), in fp32.

    SIMULATED: the matmul runs in fp32 on the dequantised values, so this measures NVFP4's effect
    on the samples, not its speed (it is slower than the original layer).
    """

    simulated = True

    def __init__(self, linear: nn.Linear, quantize_activations: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.quantize_activations = quantize_activations
        self.register_buffer("weight", nvfp4_fake_quantize(linear.weight.detach()))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = nvfp4_fake_quantize(x) if self.quantize_activations else x.float()
        return nn.functional.linear(x, self.weight, self.bias).to(dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, simulated NVFP4"


# ---- backends --------------------------------------------------------------------------------------
# The smallest activation amax a float8 scale is computed from. torchao's per-row scale is
# amax / 448 with no floor on its torch path (used where its fbgemm/mslk kernel is absent), so an
# all-zero row (SD3's missing T5 tokens, padding) gets scale 0 and quantises 0 / 0 = NaN: seen on
# an H200 (torchao 0.18, torch 2.11), where every fp8 preview of an SD3-shaped transformer was NaN.
# torchao's float8 training clamps amax at the same 1e-12.
FP8_AMAX_FLOOR = 1e-12


def _fp8_scale_floor(config_class: type) -> dict[str, float]:
    """``activation_value_lb`` for torchao's float8 config, where the installed version has it."""
    fields = getattr(config_class, "__dataclass_fields__", {})
    if "activation_value_lb" not in fields:
        logger.warning(
            "this torchao's float8 config has no activation_value_lb: all-zero activation rows will "
            "quantise to NaN; upgrade torchao"
        )
        return {}
    return {"activation_value_lb": FP8_AMAX_FLOOR}


def _without_zero_weight_rows(model: nn.Module, selected: list[str], skipped: dict[str, str]) -> list[str]:
    """Keep in high precision the selected layers with an all-zero weight row (a zero-initialised
    output layer, a pruned unit): a per-row weight scale of 0 turns that row into NaN."""
    kept = []
    for name in selected:
        weight = model.get_submodule(name).weight
        if bool((weight.detach().abs().amax(dim=1) == 0).any()):
            skipped[name] = "zero_weight_rows"
        else:
            kept.append(name)
    return kept


def _cuda_capability(module: nn.Module) -> tuple[int, int] | None:
    parameter = next(module.parameters(), None)
    if parameter is None or parameter.device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(parameter.device)


def _require(precision: str, capability: tuple[int, int] | None, needed: tuple[int, int], gpu: str) -> None:
    if capability is None:
        raise RuntimeError(
            f"precision {precision!r} needs the denoiser on a CUDA GPU with compute capability "
            f">= {needed[0]}.{needed[1]} ({gpu}) and torchao; the denoiser is not on a CUDA device "
            f"(use 'int8' for a CPU speedup or 'nvfp4_simulated' for a fidelity study)"
        )
    if capability < needed:
        raise RuntimeError(
            f"precision {precision!r} needs compute capability >= {needed[0]}.{needed[1]} ({gpu}); "
            f"this GPU has {capability[0]}.{capability[1]}"
        )
    try:
        import torchao  # noqa: F401
    except ImportError as error:
        raise RuntimeError(
            f"precision {precision!r} needs torchao: pip install 'genalign[quantization]'"
        ) from error


def quantize_denoiser(
    denoiser: nn.Module,
    precision: str,
    skip_modules: Sequence[str] = (),
    min_dim: int = 0,
) -> tuple[nn.Module, PrecisionReport]:
    """A frozen copy of ``denoiser`` (LoRA merged) in ``precision``; see the module docstring."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown rollout precision {precision!r}; choose one of {list(PRECISIONS)}")
    model = merged_copy(denoiser)
    if precision in ("fp32", "bf16", "fp16"):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        return _cast(model, dtype), PrecisionReport(precision, "cast", False, dtype)

    capability = _cuda_capability(model)
    if precision == "nvfp4" and (capability is None or capability < (10, 0)):
        logger.warning(
            "NVFP4 kernels need a Blackwell GPU (compute capability >= 10.0, got %s): using SIMULATED "
            "NVFP4 (quantise-dequantise in fp32) - a fidelity study, not a speedup",
            "no CUDA device" if capability is None else f"{capability[0]}.{capability[1]}",
        )
        precision_used = "nvfp4_simulated"
    else:
        precision_used = precision

    if precision_used == "int8":
        selected, skipped = select_linear_layers(model, skip_modules, min_dim)
        if capability is not None:
            raise RuntimeError(
                "precision 'int8' is torch's CPU dynamic quantisation: move the denoiser to the CPU, "
                "or use 'fp8' / 'nvfp4' on a GPU"
            )
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        model = model.float()
        qconfig = dict.fromkeys(selected, per_channel_dynamic_qconfig)
        with warnings.catch_warnings():
            # torch >= 2.10 deprecates its quantised tensor types; nothing a user can change here.
            # The path works until torch removes them; torchao's int8 is the successor.
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            model = quantize_dynamic(model, qconfig_spec=qconfig, dtype=torch.qint8)
        report = PrecisionReport(precision, "torch.ao.int8_dynamic", False, torch.float32, selected, skipped)
    elif precision_used == "nvfp4_simulated":
        selected, skipped = select_linear_layers(model, skip_modules, min_dim, block=NVFP4_BLOCK)
        model = model.float()
        for name in selected:
            _replace(model, name, SimulatedNVFP4Linear(model.get_submodule(name)))
        report = PrecisionReport(precision, "simulated_nvfp4", True, torch.float32, selected, skipped)
    elif precision_used == "fp8":
        _require("fp8", capability, (8, 9), "Ada or Hopper")
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

        selected, skipped = select_linear_layers(model, skip_modules, min_dim, block=16)
        selected = _without_zero_weight_rows(model, selected, skipped)
        chosen = set(selected)
        model = _cast(model, torch.bfloat16)
        quantize_(
            model,
            Float8DynamicActivationFloat8WeightConfig(
                granularity=PerRow(), **_fp8_scale_floor(Float8DynamicActivationFloat8WeightConfig)
            ),
            filter_fn=lambda module, fqn: isinstance(module, nn.Linear) and fqn in chosen,
        )
        report = PrecisionReport(precision, "torchao.float8", False, torch.bfloat16, selected, skipped)
    else:  # real NVFP4
        _require("nvfp4", capability, (10, 0), "Blackwell")
        from torchao.prototype.mx_formats import NVFP4DynamicActivationNVFP4WeightConfig
        from torchao.quantization import quantize_

        selected, skipped = select_linear_layers(model, skip_modules, min_dim, block=NVFP4_BLOCK)
        selected = _without_zero_weight_rows(model, selected, skipped)
        chosen = set(selected)
        model = _cast(model, torch.bfloat16)
        quantize_(
            model,
            NVFP4DynamicActivationNVFP4WeightConfig(),
            filter_fn=lambda module, fqn: isinstance(module, nn.Linear) and fqn in chosen,
        )
        report = PrecisionReport(precision, "torchao.nvfp4", False, torch.bfloat16, selected, skipped)
    logger.info(
        "rollout precision %s (%s%s): %d linear layers quantised, %d kept in high precision",
        precision,
        report.backend,
        ", SIMULATED" if report.simulated else "",
        len(report.quantized),
        len(report.skipped),
    )
    return model.requires_grad_(False).eval(), report


@contextlib.contextmanager
def swapped_denoiser(policy: Any, module: nn.Module, compute_dtype: torch.dtype) -> Iterator[Any]:
    """Within this context ``policy`` samples with ``module`` (inputs cast to ``compute_dtype``)."""
    trained, dtype = policy.denoiser, policy.model_dtype
    policy._swap_denoiser(module)
    policy.model_dtype = compute_dtype
    try:
        yield policy
    finally:
        policy._swap_denoiser(trained)
        policy.model_dtype = dtype
