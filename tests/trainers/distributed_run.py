"""Helper of the multi-process trainer tests: train and save each rank's parameters.

``python distributed_run.py OUT [key=value ...]`` alone (one process) or under torchrun with
``--nproc_per_node 2``; the overrides (``train.fsdp=true``, ``model.lora=null``, ...) follow the
recipe's defaults below. A first override ``recipe=<path>`` trains that recipe instead, with only
the given overrides (the run's metrics are in ``OUT/run/metrics.jsonl``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import save_file

from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.distributed import release_process_group
from genalign.trainers.trainer_state import trainable_state

ROOT = Path(__file__).resolve().parents[2]


def main(out: str, overrides: list[str]) -> None:
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    recipe = ROOT / "configs" / "tiny" / "ddpo_jpeg.yaml"
    defaults = [
        "sampling.num_inference_steps=4",
        "train.num_steps=2",
        "train.prompts_per_step=2",
        "train.group_size=2",
        "train.minibatch_size=2",
        "train.timestep_fraction=0.5",
        "train.advantage=group",
        # Adam's first steps move a weight by about lr whatever its gradient's size; a weight whose
        # gradient is ~0 (summed in another order on two processes) could then move +-lr in one
        # run and -+lr in the other. An epsilon above such gradients keeps their steps small.
        "train.adam_epsilon=1e-4",
    ]
    if overrides and overrides[0].startswith("recipe="):
        recipe, defaults, overrides = ROOT / overrides[0][len("recipe=") :], [], overrides[1:]
    config = load_recipe(
        recipe, [*defaults, f"logging.run_dir={out}/run", "logging.progress=false", *overrides]
    )
    trainer = build_trainer(config, accelerator=accelerator)
    Path(out).mkdir(parents=True, exist_ok=True)
    state = trainable_state(trainer)  # full tensors, gathered from the shards under FSDP
    if accelerator.is_main_process:
        save_file(state, f"{out}/initial.safetensors")
    trainer.train()
    state = trainable_state(trainer)
    save_file(state, f"{out}/params-rank{accelerator.process_index}.safetensors")
    release_process_group(accelerator)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
