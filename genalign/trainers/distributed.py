"""Sharded training with PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``).

Under ``train.fsdp: true`` (or an ``accelerate`` config with ``distributed_type: FSDP``) and more
than one process, the trainer shards the denoiser's (a ``language`` policy's: the model's)
parameters, gradients and optimiser state across processes (:func:`shard_policy`).
``fully_shard`` converts modules in place, so the pipeline keeps the same denoiser object and
every policy works unchanged; parameters become ``DTensor`` s.

Contract with the trainer (``Trainer.train_step``):

* every process runs the same sequence of forward and backward passes (a process with no sample
  in a minibatch runs a zero-weighted pass), since each pass all-gathers parameters and each
  backward reduce-scatters gradients;
* FSDP averages gradients over processes while the trainer's per-process loss is scaled by its
  share of the minibatch (a sum over processes), so the loss is multiplied by the process count;
* checkpoints and exported weights hold full (unsharded) tensors, gathered on every process and
  written by the main one; resuming re-shards them.

FSDP2 needs one dtype per sharded group: keep the denoiser in fp32 when training LoRA adapters
under FSDP, or train it fully in one dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# Block classes wrapped as their own FSDP units (one all-gather per block in the forward);
# the root module is always wrapped last.
DEFAULT_WRAP_CLASSES: tuple[str, ...] = (
    "BasicTransformerBlock",
    "ResnetBlock2D",
    "JointTransformerBlock",
    "FluxTransformerBlock",
    "FluxSingleTransformerBlock",
    "SanaTransformerBlock",
    "PixArtTransformerBlock",
)


def fsdp_available() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return torch.distributed.is_available()


def shard_module(
    module: torch.nn.Module,
    wrap_classes: Sequence[str] = DEFAULT_WRAP_CLASSES,
    extra_units: Sequence[torch.nn.Module] = (),
) -> int:
    """Apply ``fully_shard`` to every submodule whose class name is in ``wrap_classes``, then to
    each of ``extra_units``, then to ``module`` itself; return the number of FSDP units made.
    Needs an initialised process group."""
    dtypes = sorted(
        {str(p.dtype).removeprefix("torch.") for p in module.parameters() if p.is_floating_point()}
    )
    if len(dtypes) > 1:
        raise ValueError(
            f"train.fsdp: the model to shard holds parameters in {' and '.join(dtypes)} (LoRA's fp32 adapters "
            "on a lower-precision model, or layers a model keeps in fp32), and FSDP2 shards one dtype per "
            "unit: load it with model.dtype=float32"
        )
    if not fsdp_available():
        raise RuntimeError("train.fsdp needs torch.distributed.fsdp.fully_shard (PyTorch >= 2.6)")
    if not torch.distributed.is_initialized():
        raise RuntimeError(
            "train.fsdp needs an initialised process group (launch with accelerate or torchrun)"
        )
    from torch.distributed.fsdp import fully_shard

    wanted = set(wrap_classes)
    units = 0
    for submodule in list(module.modules())[1:]:
        if type(submodule).__name__ in wanted:
            fully_shard(submodule)
            units += 1
    for submodule in extra_units:
        fully_shard(submodule)
    fully_shard(module)
    if extra_units:  # FSDP2 makes the first unit to run forward the root: settle it as `module` now
        module._get_fsdp_state()._lazy_init()  # (generate may run an encoder unit before it)
    return units + len(extra_units) + 1


def shard_policy(policy: Any, wrap_classes: Sequence[str] = ()) -> int:
    """Shard what a policy trains, and its frozen reference copy if it keeps one: a diffusion
    policy's denoiser (units: ``wrap_classes``, default :data:`DEFAULT_WRAP_CLASSES`), or a
    ``language`` policy's model (units: ``wrap_classes``, default the model's own
    ``_no_split_modules``, its decoder layers and vision blocks, as accelerate's FSDP wraps them).
    A language policy then generates with ``synced_gpus``: every process runs forward passes until
    the longest completion on any process ends, since each pass gathers parameters from all.
    Returns the trained module's (``policy.trained_module``'s) number of FSDP units. A joint
    policy (PromptRL's rewriter and generator) shards each member so, its units their own."""
    members = getattr(policy, "policies", None)
    if isinstance(members, dict):
        return sum(shard_policy(member, wrap_classes) for member in members.values())
    module, reference = policy.trained_module, policy.reference_module
    if hasattr(policy, "denoiser"):
        wrap = list(wrap_classes) or list(DEFAULT_WRAP_CLASSES)
    else:
        wrap = list(wrap_classes) or list(getattr(module, "_no_split_modules", None) or [])
        policy.synced_generation = True
    units = shard_module(module, wrap, encoder_units(module))
    if reference is not None:
        shard_module(reference, wrap, encoder_units(reference))
    return units


def encoder_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """A VLM's image encoder parts (its base model's children other than the language model:
    Qwen-VL's ``visual``, LLaVA's ``vision_tower`` and ``multi_modal_projector``), made FSDP units
    of their own: ``generate`` runs them through ``get_image_features``, outside the root module's
    forward, so parameters left in the root unit would not be gathered. None for other models."""
    if getattr(getattr(model, "config", None), "vision_config", None) is None:
        return []
    base = getattr(model, "base_model", model)
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict)
    return [
        child
        for name, child in base.named_children()
        if name != "language_model"
        and not isinstance(child, containers)
        and any(True for _ in child.parameters())
    ]


def is_dtensor(tensor: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(tensor, DTensor)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a ``DTensor`` shard (a collective: every process must call it)."""
    return tensor.full_tensor() if is_dtensor(tensor) else tensor


def full_state(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full CPU copies of named (possibly sharded) tensors, in a fixed order on every process."""
    return {name: full_tensor(t.detach()).cpu().contiguous() for name, t in sorted(named.items())}


def shard_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` (a full tensor) sharded as ``like`` is; unchanged when ``like`` is not a DTensor."""
    if not is_dtensor(like):
        return value
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value.to(like.dtype), like.device_mesh, like.placements)


@torch.no_grad()
def load_full_into(parameters: dict[str, torch.nn.Parameter], saved: dict[str, torch.Tensor]) -> None:
    """Copy full tensors into (possibly sharded) parameters, re-sharding them as the parameter is."""
    for name, parameter in parameters.items():
        value = saved[name].to(parameter.dtype)
        if is_dtensor(parameter):
            parameter.copy_(shard_like(value.to(parameter.device_mesh.device_type), parameter))
        else:
            parameter.copy_(value.to(parameter.device))


def full_optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser's state with full tensors (FQN-keyed), the same on every process."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(
        module, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=False)
    )


def load_full_optimizer_state(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(module, optimizer, state, options=StateDictOptions(full_state_dict=True))


def sum_over_processes(
    sums: dict[str, float], count: int, device: torch.device | str = "cpu"
) -> tuple[dict[str, float], int]:
    """Each process's metric sums (each loss call's value times its rows) and their total weight,
    summed over the processes, so that an update's logged metrics (``approx_kl``, ``clipfrac``, ...)
    average every process's samples, not only the main one's. A collective (every process calls
    it); unchanged without a process group. A key some process lacks counts 0 there, as a call
    without it does on one process."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return sums, count
    names: list[list[str]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(names, sorted(sums))
    keys = sorted(set().union(*names))
    values = torch.tensor(
        [sums.get(k, 0.0) for k in keys] + [float(count)], dtype=torch.float64, device=device
    )
    dist.all_reduce(values)
    totals = values.tolist()
    return dict(zip(keys, totals[:-1])), int(totals[-1])


def release_process_group(accelerator: Any) -> None:
    """End a multi-process run's communication: a barrier, then destroy the default process group.

    Left to the interpreter's exit, gloo's process group was torn down with its threads still
    running and a rank could abort ("terminate called without an active exception", SIGABRT) after
    a finished run, which torchrun reports as a failed job (seen in CI on the FSDP resume test).
    PyTorch asks for ``destroy_process_group`` before exit. Single-process runs have no group: a
    no-op. Call it once nothing more is gathered (the trainer's ``train`` leaves the group up, so a
    script can still gather the trained weights)."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return
    accelerator.wait_for_everyone()
    accelerator.state.destroy_process_group()
