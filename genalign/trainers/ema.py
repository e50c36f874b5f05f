"""Exponential moving average of parameters.

Evaluating (and shipping) an EMA of the weights smooths the noise of small-batch policy-gradient
updates; DDPO and Flow-GRPO both offer it. After each optimiser step::

    shadow <- decay * shadow + (1 - decay) * parameter

(the weight averaging of DDPM, Ho et al. 2020, app. B, and diffusers' ``EMAModel``). For the first ``update_after_step`` steps the shadow simply copies the parameters,
so the average starts from trained rather than initial weights.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["ParameterEMA"]


class ParameterEMA:
    """EMA copies ("shadows") of a list of parameters.

    Shadows of floating-point parameters are kept in float32 even when the parameters are bf16 or
    fp16: with ``decay = 0.999`` an update moves the average by 0.1% of the difference, below
    bf16's resolution, so a low-precision shadow would stop moving.

    Args:
        parameters: the tensors to average (kept by reference; :meth:`step` reads them).
        decay: weight of the old average, in ``[0, 1]``.
        update_after_step: number of initial :meth:`step` calls that copy the parameters instead of
            averaging.
    """

    def __init__(self, parameters: Iterable[torch.Tensor], decay: float, update_after_step: int = 0) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        if update_after_step < 0:
            raise ValueError(f"update_after_step must be non-negative, got {update_after_step}")
        self.parameters = list(parameters)
        self.decay = decay
        self.update_after_step = update_after_step
        self.optimization_step = 0
        self.shadow_params = [self._new_shadow(parameter) for parameter in self.parameters]

    @staticmethod
    def _new_shadow(parameter: torch.Tensor) -> torch.Tensor:
        shadow = parameter.detach().clone()
        return shadow.float() if shadow.is_floating_point() else shadow

    def _resolve(self, parameters: Iterable[torch.Tensor] | None) -> list[torch.Tensor]:
        resolved = self.parameters if parameters is None else list(parameters)
        if len(resolved) != len(self.shadow_params):
            raise ValueError(f"got {len(resolved)} parameters for {len(self.shadow_params)} EMA shadows")
        return resolved

    def current_decay(self) -> float:
        """The decay the next :meth:`step` applies: 0 (copy) during the first ``update_after_step`` steps."""
        return 0.0 if self.optimization_step < self.update_after_step else self.decay

    @torch.no_grad()
    def step(self, parameters: Iterable[torch.Tensor] | None = None) -> None:
        """Fold the current parameters into the average (call after each optimiser step)."""
        decay = self.current_decay()
        for shadow, parameter in zip(self.shadow_params, self._resolve(parameters)):
            if not shadow.is_floating_point():
                shadow.copy_(parameter)  # integer buffers cannot be averaged
                continue
            # shadow <- decay * shadow + (1 - decay) * parameter
            shadow.lerp_(parameter.detach().to(shadow.dtype), 1.0 - decay)
        self.optimization_step += 1

    @torch.no_grad()
    def copy_to(self, parameters: Iterable[torch.Tensor] | None = None) -> None:
        """Overwrite ``parameters`` (default: the tracked ones) with the averages."""
        for shadow, parameter in zip(self.shadow_params, self._resolve(parameters)):
            parameter.copy_(shadow.to(parameter.dtype))

    @contextlib.contextmanager
    def swapped(self, parameters: Iterable[torch.Tensor] | None = None) -> Iterator[None]:
        """Temporarily load the averages into ``parameters``, restoring the trained values on exit.

        >>> with ema.swapped():
        ...     images = policy.rollout(prompts)   # evaluated with EMA weights
        """
        parameters = self._resolve(parameters)
        with torch.no_grad():
            backup = [parameter.detach().clone() for parameter in parameters]
        self.copy_to(parameters)
        try:
            yield
        finally:
            with torch.no_grad():
                for parameter, saved in zip(parameters, backup):
                    parameter.copy_(saved)

    def state_dict(self) -> dict[str, Any]:
        """``{"decay", "update_after_step", "optimization_step", "shadow_params": [tensor, ...]}``.

        Pickle-free: :func:`genalign.trainers.checkpoint.save_checkpoint` stores it as a named state.
        """
        return {
            "decay": self.decay,
            "update_after_step": self.update_after_step,
            "optimization_step": self.optimization_step,
            "shadow_params": [shadow.detach().clone() for shadow in self.shadow_params],
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`, keeping the shadows' current devices."""
        shadows = list(state["shadow_params"])
        if len(shadows) != len(self.shadow_params):
            raise ValueError(
                f"state has {len(shadows)} shadow tensors, this EMA tracks {len(self.shadow_params)}"
            )
        for index, (current, saved) in enumerate(zip(self.shadow_params, shadows)):
            if current.shape != saved.shape:
                raise ValueError(
                    f"EMA shadow {index} has shape {list(saved.shape)} in the state, {list(current.shape)} here"
                )
            current.copy_(saved.to(device=current.device, dtype=current.dtype))
        self.decay = float(state["decay"])
        self.update_after_step = int(state["update_after_step"])
        self.optimization_step = int(state["optimization_step"])

    def to(self, device: torch.device | str) -> ParameterEMA:
        """Move the shadows (e.g. to the CPU to save accelerator memory)."""
        self.shadow_params = [shadow.to(device) for shadow in self.shadow_params]
        return self

    def __repr__(self) -> str:
        return (
            f"ParameterEMA(tensors={len(self.shadow_params)}, decay={self.decay}, "
            f"update_after_step={self.update_after_step}, optimization_step={self.optimization_step})"
        )
