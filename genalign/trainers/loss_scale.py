"""Dynamic loss scaling for policies that compute in float16 (``model.dtype: float16`` or
``train.mixed_precision: fp16``).

The fp16 recipes (DDPO on SD-1.5, RLCM, B2-DiffuRL) train fp32 LoRA weights through a frozen fp16
denoiser. Backpropagated through fp16 activations, a gradient below fp16's smallest subnormal
(about 6e-8) becomes 0: at SD-1.5-like loss scales most LoRA gradients of the tiny model came out
exactly 0. The official codes train under accelerate's fp16 mixed precision, whose
``accelerator.backward`` and ``clip_grad_norm_`` apply a dynamic ``torch.amp.GradScaler``;
:class:`DynamicLossScale` has the same semantics, written for the trainer's own clip and
finiteness check (:meth:`Trainer._optimizer_step <genalign.trainers.trainer.Trainer>`):

1. the loss is multiplied by the scale before ``backward`` (:meth:`DynamicLossScale.scale_loss`);
2. the summed gradients are divided by it before clipping (:meth:`DynamicLossScale.unscale_`),
   so ``max_grad_norm`` and the logged ``grad_norm`` are in true units;
3. :meth:`DynamicLossScale.update`: a step whose unscaled gradient norm is not finite is an
   overflow: it is skipped and the scale halved; after ``growth_interval`` good steps in a row
   the scale doubles.

Gradients are summed across processes before the check, so every process sees the same
finiteness and keeps the same scale. fp32 and bf16 runs get no scaler (:func:`loss_scale_for`
returns None) and take the code path they always took.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch

from genalign.policies import JointPolicy

logger = logging.getLogger(__name__)

__all__ = ["DynamicLossScale", "computes_in_float16", "loss_scale_for"]


class DynamicLossScale:
    """The loss scale of ``torch.amp.GradScaler`` (same defaults), as plain Python state.

    Args:
        init_scale: the first scale (2**16).
        growth_factor: the scale's factor after ``growth_interval`` good steps in a row (2).
        backoff_factor: its factor after an overflow (0.5).
        growth_interval: good steps in a row before it grows (2000).

    The scale stays a power of two under the default factors, so scaling and unscaling are exact
    in fp32 (they move the exponent only).
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        if init_scale <= 0 or growth_factor <= 1 or not 0 < backoff_factor < 1 or growth_interval < 1:
            raise ValueError(
                "loss scale: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                f"growth_interval >= 1, got {init_scale}, {growth_factor}, {backoff_factor}, {growth_interval}"
            )
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.good_steps = 0  # GradScaler's growth tracker: good steps since the last change

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the scale: what ``backward`` is called on."""
        return loss * self.scale

    def unscale_(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Divide the gradients of ``parameters`` by the scale, in place (before clipping)."""
        grads = [p.grad for p in parameters if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, 1.0 / self.scale)

    def update(self, finite: bool) -> bool:
        """Record an optimizer step whose unscaled gradients were ``finite`` (or overflowed);
        return ``finite`` (whether the step is applied).

        An overflow halves the scale and restarts the count; ``growth_interval`` good steps in a
        row double it. A scale that falls below 1 means the gradients overflow even unscaled (a
        NaN or infinite loss rather than an fp16 range problem): that is warned about.
        """
        if not finite:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            logger.info("fp16 gradient overflow: optimizer step skipped, loss scale now %g", self.scale)
            if self.scale < 1.0 <= self.scale / self.backoff_factor:
                logger.warning(
                    "the gradients stay non-finite at loss scale %g: the loss itself is likely NaN "
                    "or infinite (steps are skipped, loss_scale_skips counts them)",
                    self.scale,
                )
            return False
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0
        return True

    def state_dict(self) -> dict[str, Any]:
        """The scale and the good-step count (with the factors), for checkpoints."""
        return {
            "scale": self.scale,
            "good_steps": self.good_steps,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values (a resumed run continues with the same scale)."""
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
        self.growth_factor = float(state.get("growth_factor", self.growth_factor))
        self.backoff_factor = float(state.get("backoff_factor", self.backoff_factor))
        self.growth_interval = int(state.get("growth_interval", self.growth_interval))


def computes_in_float16(policy: Any, mixed_precision: str = "no") -> bool:
    """Whether the trained network computes in float16: under fp16 autocast, or with a diffusion
    denoiser loaded as float16 (``model.dtype`` reaches the policy as ``policy.model_dtype``), or
    a language model holding float16 weights; a :class:`~genalign.policies.JointPolicy` when
    any member it trains does."""
    if mixed_precision == "fp16":
        return True
    if isinstance(policy, JointPolicy):
        trained = [name for name, parameters in policy.parameter_groups().items() if parameters]
        return any(computes_in_float16(policy[name]) for name in trained)
    dtype = getattr(policy, "model_dtype", None)
    if dtype is not None:
        return dtype == torch.float16
    return any(p.dtype == torch.float16 for p in policy.trained_module.parameters())


def loss_scale_for(policy: Any, mixed_precision: str = "no") -> DynamicLossScale | None:
    """A fresh :class:`DynamicLossScale` when ``policy`` computes in float16, else None (fp32 and
    bf16 need no scaling: bf16 has fp32's exponent range)."""
    return DynamicLossScale() if computes_in_float16(policy, mixed_precision) else None
