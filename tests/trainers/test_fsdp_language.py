"""FSDP2 for the ``language`` family on 2 CPU processes (gloo): the tiny Qwen2 and Qwen2.5-VL sharded
by their own ``_no_split_modules`` (with the frozen reference copy under full fine-tuning, and a
VLM's image encoder as units of its own), sampling with ``synced_gpus`` so that ranks whose
completions end early keep running the gathers. The ranks agree, the update equals one process's,
checkpoint + resume equals straight training, and the exported folder holds the full (gathered)
weights. A joint (PromptRL) run shards each of its two policies the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.trainers.test_trainer import _torchrun

SCRIPT = Path(__file__).with_name("distributed_run.py")
RECIPE = [
    "recipe=configs/toy/grpo_language.yaml",
    "train.num_steps=2",
    "train.prompts_per_step=2",
    "train.group_size=4",
    "train.minibatch_size=4",
    "sampling.language.max_new_tokens=8",
    "train.adam_epsilon=1e-4",  # see distributed_run.py: near-zero gradients summed in another order
    "reward.name=text_length",  # random tiny completions differ in length: rewards with spread
    "reward.kwargs={}",
]
LORA = ["model.lora={rank: 4, target_modules: [q_proj, k_proj, v_proj, o_proj]}"]  # KL: adapters off


QWEN25_VL = [  # Q-Hawkeye's recipe on the tiny Qwen2.5-VL: its vision tower runs in generate, outside
    "recipe=configs/qwen25vl/q_hawkeye_koniq.yaml",  # the root's forward (its own FSDP unit)
    "model.path=tiny:qwen25_vl",
    "model.dtype=float32",
    "train.mixed_precision=no",
    "train.num_steps=2",
    "train.prompts_per_step=2",
    "train.group_size=4",
    "train.minibatch_size=4",
    "train.gradient_accumulation_steps=2",
    "sampling.language.max_new_tokens=16",
    "prompts.source=genalign.toy.quality:toy_quality_pool",
    "prompts.source_kwargs={split: train, scenes: 1, seed: 0}",
    "train.adam_epsilon=1e-4",
]
CASES = {"qwen2-full": RECIPE, "qwen2-lora": RECIPE + LORA, "qwen25-vl-q-hawkeye": QWEN25_VL}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_fsdp_language_matches_one_process_and_resumes(tmp_path, case):
    from safetensors.torch import load_file

    from genalign.policies import load_policy
    from genalign.trainers.checkpoint import latest_checkpoint, load_checkpoint
    from genalign.trainers.run_folder import read_metrics

    recipe = CASES[case]  # full fine-tuning keeps (and shards) a reference copy for the KL
    _torchrun(SCRIPT, tmp_path / "fsdp", *recipe, "train.fsdp=true")
    _torchrun(SCRIPT, tmp_path / "one", *recipe, processes=1)
    _torchrun(SCRIPT, tmp_path / "resumed", *recipe, "train.fsdp=true", "train.num_steps=1")
    _torchrun(SCRIPT, tmp_path / "resumed", *recipe, "train.fsdp=true", "logging.resume=latest")
    rank0 = load_file(tmp_path / "fsdp" / "params-rank0.safetensors")
    rank1 = load_file(tmp_path / "fsdp" / "params-rank1.safetensors")
    single = load_file(tmp_path / "one" / "params-rank0.safetensors")
    resumed = load_file(tmp_path / "resumed" / "params-rank0.safetensors")
    initial = load_file(tmp_path / "one" / "initial.safetensors")
    assert rank0.keys() == single.keys() == resumed.keys() and rank0
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
        update = (single[name] - initial[name]).norm()
        assert (rank0[name] - single[name]).norm() <= 0.02 * update + 1e-6, name
        torch.testing.assert_close(resumed[name], rank0[name], atol=1e-5, rtol=1e-4)
    moved = [not torch.equal(single[n], initial[n]) for n in single]
    assert all(moved) if case.startswith("qwen2-") else any(moved)  # (Q-Hawkeye: no reward spread here)
    # the logged update metrics average every process's loss calls, as one process's do
    two, one = (read_metrics(tmp_path / run / "run" / "metrics.jsonl") for run in ("fsdp", "one"))
    assert [row["step"] for row in two] == [row["step"] for row in one] == [0, 1]
    for sharded, single_row in zip(two, one):
        for key in ("completion_tokens", "approx_kl", "clipfrac", "kl", "policy_loss"):
            if key in single_row:
                assert sharded[key] == pytest.approx(single_row[key], rel=1e-3, abs=1e-7), key
    checkpoint = load_checkpoint(latest_checkpoint(tmp_path / "fsdp" / "run"))
    for name, value in checkpoint.tensors["trainable"].items():
        assert torch.equal(value, rank0[name]), name
    exported = tmp_path / "fsdp" / "run" / "final"  # the full trained tensors, not one rank's shard
    if "lora" in case:
        saved = load_file(exported / "adapter_model.safetensors")
        for name, value in rank0.items():
            assert torch.equal(saved["base_model.model." + name.replace(".default", "")], value), name
    else:
        loaded = dict(load_policy("language", exported, lora=None, train=False).model.named_parameters())
        for name, value in rank0.items():
            assert torch.equal(loaded[name], value), name


JOINT = [  # PromptRL's rewriter (toy-rewriter, full fine-tuning with a reference copy) and generator
    "recipe=configs/toy/promptrl.yaml",  # (toy-sd's UNet, full fine-tuning), each sharded on its own
    "prompts.file=configs/prompts/toy_paraphrased_rl_train_balanced.txt",
    "reward.name=jpeg_compressibility",  # continuous: every group has spread, so both halves move
    "train.num_steps=2",
    "train.prompts_per_step=2",
    "train.group_size=2",
    "train.minibatch_size=2",
    "sampling.num_inference_steps=4",
    "sampling.num_sde_steps=2",
    "sampling.language.max_new_tokens=8",
    "train.adam_epsilon=1e-4",
]


@pytest.mark.slow
def test_fsdp_joint_run_matches_one_process_and_resumes(tmp_path):
    from diffusers import UNet2DConditionModel
    from safetensors.torch import load_file

    from genalign.policies import load_policy

    _torchrun(SCRIPT, tmp_path / "fsdp", *JOINT, "train.fsdp=true")
    _torchrun(SCRIPT, tmp_path / "one", *JOINT, processes=1)
    _torchrun(SCRIPT, tmp_path / "resumed", *JOINT, "train.fsdp=true", "train.num_steps=1")
    _torchrun(SCRIPT, tmp_path / "resumed", *JOINT, "train.fsdp=true", "logging.resume=latest")
    rank0, rank1, single, resumed, initial = (
        load_file(tmp_path / run / name)
        for run, name in [
            ("fsdp", "params-rank0.safetensors"),
            ("fsdp", "params-rank1.safetensors"),
            ("one", "params-rank0.safetensors"),
            ("resumed", "params-rank0.safetensors"),
            ("one", "initial.safetensors"),
        ]
    )
    assert rank0.keys() == single.keys() == resumed.keys()
    assert {name.split(".")[0] for name in rank0} == {"generator", "rewriter"}
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
        update = (single[name] - initial[name]).norm()
        assert update > 0, name  # every weight of both policies trained
        assert (rank0[name] - single[name]).norm() <= 0.02 * update + 1e-6, name
        torch.testing.assert_close(resumed[name], rank0[name], atol=1e-5, rtol=1e-4)
    final = tmp_path / "fsdp" / "run" / "final"  # each policy's full (gathered) weights
    rewriter = dict(
        load_policy("language", final / "rewriter", lora=None, train=False).model.named_parameters()
    )
    unet = dict(UNet2DConditionModel.from_pretrained(final / "generator" / "unet").named_parameters())
    for name, value in rank0.items():
        member, rest = name.split(".", 1)
        assert torch.equal((rewriter if member == "rewriter" else unet)[rest], value), name


def test_mixed_dtypes_are_refused_before_sharding():
    """LoRA's fp32 adapters on a bf16 model cannot share an FSDP2 unit: a one-line error naming the fix."""
    from genalign.trainers.distributed import shard_module

    model = torch.nn.Sequential(torch.nn.Linear(2, 2).to(torch.bfloat16), torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="bfloat16 and float32 .* load it with model.dtype=float32"):
        shard_module(model, ())
