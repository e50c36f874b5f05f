"""The record of a language rollout: prompt and completion tokens, masks and per-token log-probs.

A :class:`TokenTrajectory` is to the ``language`` family what :class:`~genalign.policies.Trajectory`
is to the diffusion families: everything needed to score the samples and to recompute their
log-probs under new weights. It presents the same small surface the trainer reads from a
trajectory (``batch_size``, ``num_steps``, ``stochastic_steps``, ``select``, ``prompts``,
``group_ids``, ``seeds``, ``outputs``), with the whole completion as one "step": the loss trains
every completion token of a sampled sequence at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from genalign.policies.trajectory import batch_positions

__all__ = ["TokenSettings", "TokenTrajectory"]


@dataclass(frozen=True)
class TokenSettings:
    """Sampling settings a token trajectory was drawn with; recomputation reuses them exactly.

    ``temperature``: the logits are divided by it before the softmax, in sampling and in every
    recomputed log-prob (``log_softmax(logits / T)``); ``max_new_tokens``: the completion budget
    (Dr. GRPO's constant normaliser); ``chat_template``: whether the prompt went through the
    tokenizer's chat template; ``system_prompt``: the system turn of the template, if any;
    ``top_k`` / ``top_p``: the truncation of the tempered softmax sampled from, replayed in every
    recomputed log-prob (:mod:`genalign.algorithms.token_truncation`; None: none).
    """

    temperature: float = 1.0
    max_new_tokens: int = 64
    chat_template: bool = True
    system_prompt: str | None = None
    top_k: int | None = None
    top_p: float | None = None


@dataclass
class TokenTrajectory:
    """A batch of B sampled completions, left-padded prompts of length P, completions of length L.

    Attributes:
        prompts: the B prompts as given (before any chat template), each group's repeated.
        group_ids: ``[B]`` long, the index of each sample's prompt group.
        seeds: ``[B]`` long, the seed of each sample's generator.
        input_ids: ``[B, P + L]`` long: the left-padded prompt then the completion; positions
            after a completion's first end-of-sequence token hold the pad id.
        attention_mask: ``[B, P + L]`` long: 1 on real prompt tokens and on completion tokens up
            to and including the first end-of-sequence token, 0 on padding.
        completion_mask: ``[B, L]`` long: 1 on the completion tokens that are trained on (up to
            and including the first end-of-sequence token), 0 after.
        log_probs: ``[B, L]`` fp32: ``log softmax(logits / T)`` of each completion token under the
            weights it was sampled with, recomputed by a forward pass (0 where the mask is 0).
        completions: the B decoded completions (special tokens removed), what a text reward scores.
        model_inputs: further per-sample forward inputs, each ``[B, ...]`` (a VLM's
            ``pixel_values``) or a list of B per-sample tensors (a Qwen-VL's packed
            ``pixel_values``, split by ``image_grid_thw``; concatenated again for a forward).
        images: ``[B, 3, H, W]`` the images a VLM was shown, in [0, 1] (a list of B ``[3, H, W]``
            when they were given so, sizes may differ), or ``[B, 0]`` when none.
        settings: the :class:`TokenSettings` used.
        extras: anything a strategy attaches.
    """

    prompts: list[str]
    group_ids: torch.Tensor
    seeds: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    log_probs: torch.Tensor
    completions: list[str]
    model_inputs: dict[str, Any] = field(default_factory=dict)
    images: Any = None
    settings: TokenSettings = field(default_factory=TokenSettings)
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.images is None:
            self.images = torch.zeros(self.batch_size, 0)

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def completion_length(self) -> int:
        """L, the padded completion length."""
        return self.completion_mask.shape[1]

    @property
    def prompt_length(self) -> int:
        """P, the padded prompt length."""
        return self.input_ids.shape[1] - self.completion_length

    @property
    def completion_ids(self) -> torch.Tensor:
        """``[B, L]`` the completion tokens."""
        return self.input_ids[:, self.prompt_length :]

    @property
    def outputs(self) -> list[str]:
        """What a reward scores: the decoded completions."""
        return self.completions

    @property
    def num_steps(self) -> int:
        """One "step": the whole completion is one action sequence trained at once."""
        return 1

    def stochastic_steps(self) -> torch.Tensor:
        """The trainable step indices: the one step ``[0]``."""
        return torch.zeros(1, dtype=torch.long)

    def select(self, index: torch.Tensor | list[int] | slice) -> TokenTrajectory:
        """The sub-batch at ``index`` (a slice, index list or boolean mask over B); the padded
        lengths P and L are kept, so every row's tensors are unchanged."""
        positions = batch_positions(index, self.batch_size)
        rows = torch.tensor(positions, dtype=torch.long)

        def take(value: Any) -> Any:
            if torch.is_tensor(value) and value.ndim > 0 and value.shape[0] == self.batch_size:
                return value[rows.to(value.device)]
            if isinstance(value, list) and len(value) == self.batch_size:
                return [value[i] for i in positions]
            return value

        changes = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                changes[f.name] = {k: take(v) for k, v in value.items()}
            elif f.name != "settings":
                changes[f.name] = take(value)
        return replace(self, **changes)
