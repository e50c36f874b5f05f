"""Several policies trained in one run, and the joint record of their rollouts.

PromptRL (arXiv 2602.01382; UniRL's ``GenEvalJointGRPOTrainer``) trains a prompt rewriter (a
language model) and the image generator that draws its rewrites together: one reward per final
image, one advantage per sample shared by both models, one AdamW with a parameter group (and a
learning rate) per model. :class:`JointPolicy` is what the trainer sees of such a pair: the named
policies, their trainable parameters (named ``<policy>.<parameter>`` in checkpoints) and a
reference context that holds for all of them. :class:`JointTrajectory` holds each policy's
rollouts of the same B samples; its ``primary`` part (the generator) is what the trainer's step
bookkeeping and the reward see.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["JointPolicy", "JointTrajectory"]


class JointPolicy(torch.nn.Module):
    """Named policies trained together (each keeps its own LoRA or full fine-tuning and reference).

    Args:
        policies: name -> policy (a :class:`~genalign.policies.DiffusionPolicy` or
            :class:`~genalign.policies.LanguagePolicy`), e.g. ``{"generator": ..., "rewriter": ...}``.
            Names become the optimiser's parameter groups and the checkpoint's name prefixes.
    """

    family = "joint"

    def __init__(self, policies: dict[str, Any]) -> None:
        super().__init__()
        if len(policies) < 2:
            raise ValueError(f"a joint policy needs at least two policies, got {list(policies)}")
        for name in policies:
            if not name or "." in name:
                raise ValueError(f"policy names must be non-empty and hold no '.', got {name!r}")
        self.policies = dict(policies)
        self.device = next(iter(self.policies.values())).device
        self.lora = None  # per policy: see each one's ``lora``

    def __getitem__(self, name: str) -> Any:
        return self.policies[name]

    def names(self) -> list[str]:
        return list(self.policies)

    @property
    def trained_module(self) -> torch.nn.ModuleDict:
        """Every policy's trained network, by name."""
        return torch.nn.ModuleDict({name: p.trained_module for name, p in self.policies.items()})

    def parameter_groups(self) -> dict[str, list[torch.nn.Parameter]]:
        """Each policy's trainable parameters: one optimiser parameter group per policy."""
        return {name: p.trainable_parameters() for name, p in self.policies.items()}

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [parameter for group in self.parameter_groups().values() for parameter in group]

    def named_trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        return {
            f"{name}.{key}": parameter
            for name, policy in self.policies.items()
            for key, parameter in policy.named_trainable_parameters().items()
        }

    @contextlib.contextmanager
    def reference(self) -> Iterator[JointPolicy]:
        """Every policy is its reference model within this context."""
        with contextlib.ExitStack() as stack:
            for policy in self.policies.values():
                stack.enter_context(policy.reference())
            yield self


@dataclass
class JointTrajectory:
    """The same B samples as each policy rolled them out (row ``b`` of every part is sample ``b``).

    Attributes:
        parts: policy name -> that policy's trajectory of the B samples.
        primary: the part whose steps the trainer schedules and whose outputs the reward scores
            (the generator); the other parts are trained on every call of the loss.
        prompts: the B prompts the reward is given (PromptRL: the original prompts, not rewrites).
        group_ids / seeds: ``[B]`` the prompt groups and the sample seeds.
        outputs_from: the part whose outputs the reward and monitors score (None: ``primary``);
            PromptRL with the generator frozen schedules the rewriter but scores the images.
    """

    parts: dict[str, Any]
    primary: str
    prompts: list[str]
    group_ids: torch.Tensor
    seeds: torch.Tensor
    extras: dict[str, Any] = field(default_factory=dict)
    outputs_from: str | None = None

    def __post_init__(self) -> None:
        for key in ("primary", "outputs_from"):
            name = getattr(self, key)
            if name is not None and name not in self.parts:
                raise ValueError(f"{key} part {name!r} is not one of {list(self.parts)}")
        sizes = {name: part.batch_size for name, part in self.parts.items()}
        if len(set(sizes.values())) != 1 or len(self.prompts) != self.batch_size:
            raise ValueError(f"the parts must hold the same B samples as the prompts, got {sizes}")

    @property
    def batch_size(self) -> int:
        return self.parts[self.primary].batch_size

    @property
    def num_steps(self) -> int:
        return self.parts[self.primary].num_steps

    @property
    def outputs(self) -> Any:
        return self.parts[self.outputs_from or self.primary].outputs

    @property
    def images(self) -> Any:
        return self.parts[self.outputs_from or self.primary].images

    def stochastic_steps(self) -> torch.Tensor:
        return self.parts[self.primary].stochastic_steps()

    def select(self, index: torch.Tensor | list[int] | slice) -> JointTrajectory:
        """The sub-batch at ``index`` of every part."""
        positions = list(range(self.batch_size))[index] if isinstance(index, slice) else index
        if torch.is_tensor(positions) and positions.dtype == torch.bool:
            positions = positions.nonzero().flatten()
        positions = [int(i) for i in (positions.tolist() if torch.is_tensor(positions) else positions)]
        rows = torch.tensor(positions, dtype=torch.long)
        return JointTrajectory(
            parts={name: part.select(positions) for name, part in self.parts.items()},
            primary=self.primary,
            prompts=[self.prompts[i] for i in positions],
            group_ids=self.group_ids[rows.to(self.group_ids.device)],
            seeds=self.seeds[rows.to(self.seeds.device)],
            extras=dict(self.extras),
            outputs_from=self.outputs_from,
        )
