"""The trainer end to end on tiny models: on-policy ratios, update direction, resume, recipes."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from genalign.config import ConfigError
from genalign.rewards import Reward, RewardOutput
from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.checkpoint import RecipeMismatchError

from .tiny_ddpo import ROOT, SMALL, TINY_SD, make_trainer, params


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def test_first_inner_step_is_on_policy(tmp_path):
    trainer = make_trainer(tmp_path)
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    trajectory = batch.trajectory
    for index in trajectory.stochastic_steps().tolist():
        out = trainer.policy.step(trajectory, index)
        ratio = torch.exp(out.log_prob - trajectory.log_probs[:, index])
        assert torch.equal(ratio, torch.ones_like(ratio))
    steps = torch.tensor([0] * trajectory.batch_size)
    _, info = trainer.loss(trainer.policy, trajectory, steps, batch.advantages)
    assert info["ratio"].item() == 1.0 and info["approx_kl"].item() == 0.0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_update_moves_log_prob_with_the_sign_of_the_advantage(tmp_path, sign):
    trainer = make_trainer(
        tmp_path, "train.ratio_reduction=sum", "train.clip_range=0.9", "train.learning_rate=1e-3"
    )
    trajectory = trainer.strategy.collect(trainer.rollout_context(), 0).trajectory.select([0])
    step = torch.tensor([1])
    # LoRA's B starts at zero, so A has no gradient until B moves: two updates reach every factor.
    for _ in range(2):
        before = trainer.policy.step(trajectory, step).log_prob.detach()
        loss, _ = trainer.loss(trainer.policy, trajectory, step, torch.tensor([sign]))
        loss.backward()
        trainer._optimizer_step()
        after = trainer.policy.step(trajectory, step).log_prob.detach()
        assert sign * (after - before).item() > 0


def test_every_trainable_parameter_changes_and_frozen_ones_do_not(tmp_path):
    trainer = make_trainer(tmp_path, "train.inner_epochs=2")
    frozen = {n: p.detach().clone() for n, p in trainer.policy.pipeline.vae.named_parameters()}
    unet_frozen = {
        n: p.detach().clone() for n, p in trainer.policy.denoiser.named_parameters() if not p.requires_grad
    }
    before = params(trainer)
    trainer.train_step(0)
    after = params(trainer)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert not unchanged, unchanged[:5]
    assert all(torch.equal(p, frozen[n]) for n, p in trainer.policy.pipeline.vae.named_parameters())
    for n, p in trainer.policy.denoiser.named_parameters():
        if n in unet_frozen:
            assert torch.equal(p, unet_frozen[n]), n


def test_group_advantages_in_a_step_equal_a_hand_computation(tmp_path):
    trainer = make_trainer(tmp_path, "train.advantage=group", "train.advantage_std=group")
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    r = batch.global_rewards.double()
    expected = []
    for g in range(2):
        block = r[2 * g : 2 * g + 2]
        mean = block.mean()
        std = math.sqrt(((block - mean) ** 2).mean().item())
        expected += [((x - mean) / (std + 1e-4)).item() for x in block]
    torch.testing.assert_close(
        batch.advantages.double(), torch.tensor(expected, dtype=torch.double), atol=1e-5, rtol=1e-5
    )


def _metrics_without_times(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in rows]


def test_resume_reproduces_an_uninterrupted_run(tmp_path):
    straight = make_trainer(tmp_path / "a", "train.num_steps=4")
    straight.train()
    first = make_trainer(tmp_path / "b", "train.num_steps=2")
    first.train()
    resumed = make_trainer(tmp_path / "b", "train.num_steps=4", "logging.resume=latest")
    resumed.train()
    assert resumed.step == 4
    a, b = params(straight), params(resumed)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)
    assert _metrics_without_times(straight.metrics_path) == _metrics_without_times(resumed.metrics_path)


def test_fresh_run_in_a_used_folder_logs_only_its_own_steps(tmp_path):
    make_trainer(tmp_path, "train.num_steps=3").train()
    # without logging.overwrite the fresh run refuses (tests/reliability/test_run_folder.py)
    again = make_trainer(tmp_path, "train.num_steps=2", "logging.overwrite=true")
    again.train()
    steps = [row["step"] for row in _metrics_without_times(again.metrics_path)]
    assert steps == [0, 1]


def test_checkpoint_from_another_recipe_is_refused(tmp_path):
    make_trainer(tmp_path, "train.num_steps=1").train()
    other = make_trainer(tmp_path, "train.num_steps=2", "train.learning_rate=0.5", "logging.resume=latest")
    with pytest.raises(
        RecipeMismatchError, match=r"another recipe.*changed: train\.learning_rate: .* -> 0\.5"
    ):
        other.train()


def _age_checkpoints(run_dir: Path, drop: str) -> None:
    """Make the run's checkpoints look written by an older genalign, before option ``drop`` existed."""
    for meta_path in run_dir.glob("checkpoints/*/meta.json"):
        meta = json.loads(meta_path.read_text())
        section, key = drop.split(".")
        del meta["recipe"]["data"][section][key]
        meta["recipe"]["fingerprint"] = "0123456789abcdef"  # the old code hashed the data without it
        meta_path.write_text(json.dumps(meta))


def test_resume_accepts_options_added_after_the_checkpoint(tmp_path, caplog):
    straight = make_trainer(tmp_path / "a", "train.num_steps=3")
    straight.train()
    make_trainer(tmp_path / "b", "train.num_steps=2").train()
    _age_checkpoints(tmp_path / "b" / "run", "train.token_ppo")
    resumed = make_trainer(tmp_path / "b", "train.num_steps=3", "logging.resume=latest")
    with caplog.at_level("WARNING", logger="genalign.trainers.checkpoint"):
        resumed.train()
    assert "written before these options existed" in caplog.text and "train.token_ppo" in caplog.text
    a, b = params(straight), params(resumed)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)


def test_resume_of_an_older_checkpoint_still_refuses_a_changed_option(tmp_path):
    make_trainer(tmp_path, "train.num_steps=1").train()
    _age_checkpoints(tmp_path / "run", "train.token_ppo")
    other = make_trainer(tmp_path, "train.num_steps=2", "train.clip_range=0.5", "logging.resume=latest")
    with pytest.raises(RecipeMismatchError, match=r"changed: train\.clip_range"):
        other.train()


def test_logged_lr_is_the_rate_the_steps_optimizer_steps_used(tmp_path):
    # a linear decay moves the rate at every optimizer step (two per training step here); the
    # metric once read the scheduler after the step, i.e. the next step's rate
    trainer = make_trainer(tmp_path, "train.lr_schedule=linear", "train.lr_decay_steps=8")
    used = []
    trainer.optimizer.register_step_pre_hook(
        lambda optimizer, *_: used.append(optimizer.param_groups[0]["lr"])
    )
    logged = [trainer.train_step(n)["lr"] for n in range(2)]
    assert len(used) == 4 and len(set(used)) == 4
    assert logged == [used[0], used[2]]  # each step's first optimizer step


class NaNReward(Reward):
    name = "nan_test"

    def score(self, images, prompts, **metadata):
        scores = images.mean(dim=(1, 2, 3))
        scores[0] = float("nan")
        return RewardOutput(scores)


def test_nan_reward_skips_the_step(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.reward = NaNReward()
    before = params(trainer)
    metrics = trainer.train_step(0)
    assert metrics["skipped"] and "NaN" in metrics["skip_reason"]
    assert all(torch.equal(before[n], p) for n, p in params(trainer).items())


@pytest.mark.parametrize("recipe", sorted((ROOT / "configs" / "tiny").glob("*.yaml")), ids=lambda p: p.stem)
def test_each_tiny_recipe_runs_two_steps(tmp_path, recipe):
    config = load_recipe(
        recipe, ["train.num_steps=2", f"logging.run_dir={tmp_path}/run", "logging.progress=false"]
    )
    trainer = build_trainer(config, base_dir=recipe.parent)
    history = trainer.train()
    assert [m["step"] for m in history] == [0, 1]
    assert all(math.isfinite(m["reward_mean"]) for m in history)
    assert (trainer.run_dir / "reward_curve.png").is_file()
    final = trainer.run_dir / "final"
    if config.model.lora is not None:
        assert (final / "pytorch_lora_weights.safetensors").is_file()
    else:  # full fine-tuning exports the denoiser in diffusers format
        assert (final / "unet" / "config.json").is_file() or (final / "transformer" / "config.json").is_file()
    assert trainer._latest_step() == 2


def test_exported_lora_loads_into_the_pipeline(tmp_path):
    trainer = make_trainer(tmp_path, "train.num_steps=1")
    trainer.train()
    from diffusers import DiffusionPipeline

    from genalign.tiny.materialize import materialize

    pipe = DiffusionPipeline.from_pretrained(materialize(trainer.config.model.path))
    pipe.load_lora_weights(trainer.run_dir / "final")
    assert any("lora" in n for n, _ in pipe.unet.named_parameters())


def test_trackers_samples_and_ema_export(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    (tmp_path / "wandb").mkdir()
    trainer = make_trainer(
        tmp_path,
        "train.num_steps=2",
        "logging.trackers=[wandb]",
        "logging.sample_every=1",
        "train.ema_decay=0.5",
    )
    trainer.train()
    assert sorted(p.name for p in (trainer.run_dir / "samples").glob("*.png")) == [
        "step-000000.png",
        "step-000001.png",
    ]
    assert list((tmp_path / "wandb").rglob("*.wandb")), "no offline W&B run was written"
    from safetensors.torch import load_file

    exported = load_file(trainer.run_dir / "final" / "pytorch_lora_weights.safetensors")
    shadow = trainer.ema.state_dict()["shadow_params"]
    trained = trainer.parameters
    # the exported LoRA holds the EMA weights (key names differ: compare the tensors as a multiset)
    exported_sums = sorted(float(t.double().sum()) for t in exported.values())
    assert exported_sums == pytest.approx(sorted(float(t.double().sum()) for t in shadow), abs=1e-5)
    assert exported_sums != pytest.approx(sorted(float(t.detach().double().sum()) for t in trained), abs=1e-5)


def test_tensorboard_tracker_writes_events(tmp_path):
    pytest.importorskip("tensorboard")
    trainer = make_trainer(tmp_path, "train.num_steps=1", "logging.trackers=[tensorboard]")
    trainer.train()
    assert list(trainer.run_dir.rglob("events.out.tfevents.*")), "no TensorBoard event file was written"


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.batch_size=5", "group_size 2 does not divide train.batch_size 5"),
        ("train.timestep_fraction=0", "timestep_fraction must lie in"),
        ("train.timestep_fraction=1.5", "timestep_fraction must lie in"),
        ("train.learning_rte=1", "unknown config key 'learning_rte'"),
        ("train.group_size=three", "train.group_size: expected an integer"),
        ("model.family=flow", "is for the 'sd' family"),
        ("train.timestep_order=last", r"train\.timestep_order: 'last' is not one of \['random', 'first'\]"),
        ("train.kl_convention=flow_grpo", r"train\.kl_convention: 'flow_grpo' is not one of"),
        ("train.drop_zero_advantage=maybe", r"train\.drop_zero_advantage: expected true/false"),
    ],
)
def test_bad_recipes_fail_at_load_time_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(TINY_SD, [*SMALL, override])


def _free_port() -> int:
    """A TCP port no one listens on now: a fixed one fails the run when another run (or a killed
    one's leftover worker) still holds it (seen in CI: EADDRINUSE)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _torchrun(script: Path, out: Path, *overrides: str, processes: int = 2) -> None:
    """Run ``script`` on ``processes`` CPU processes (torchrun on a free port) or, for one, plainly.

    accelerate's own launcher starts several CPU processes only through mpirun; torchrun sets the
    same environment (RANK, WORLD_SIZE, MASTER_ADDR) and accelerate initialises gloo from it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(script)]
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                   "--master_port", str(_free_port()), str(script)]  # fmt: skip
    subprocess.run([*command, str(out), *overrides], check=True, env=env, cwd=ROOT, timeout=600)


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    script = Path(__file__).with_name("distributed_run.py")
    _torchrun(script, tmp_path / "two")
    _torchrun(script, tmp_path / "one", processes=1)
    from safetensors.torch import load_file

    rank0 = load_file(tmp_path / "two" / "params-rank0.safetensors")
    rank1 = load_file(tmp_path / "two" / "params-rank1.safetensors")
    single = load_file(tmp_path / "one" / "params-rank0.safetensors")
    initial = load_file(tmp_path / "one" / "initial.safetensors")
    assert rank0.keys() == single.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
        # same samples, same update up to float summation order (Adam amplifies ~1e-7 differences)
        torch.testing.assert_close(rank0[name], single[name], atol=1e-4, rtol=1e-3)
    assert any(not torch.equal(single[n], initial[n]) for n in single)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_fsdp_two_processes_match_one_process_and_resume(tmp_path, lora):
    """FSDP2-sharded denoiser on 2 CPU processes: ranks agree, the update equals one process's,
    and 1 step + checkpoint + resume + 1 step equals 2 straight steps (full weights and optimiser
    state are gathered to the checkpoint and re-sharded on resume)."""
    from safetensors.torch import load_file

    from genalign.trainers.checkpoint import latest_checkpoint, load_checkpoint

    script = Path(__file__).with_name("distributed_run.py")
    extra = [] if lora else ["model.lora=null", "train.learning_rate=1e-3"]
    _torchrun(script, tmp_path / "fsdp", "train.fsdp=true", *extra)
    _torchrun(script, tmp_path / "one", *extra, processes=1)
    _torchrun(script, tmp_path / "resumed", "train.fsdp=true", "train.num_steps=1", *extra)
    _torchrun(script, tmp_path / "resumed", "train.fsdp=true", "logging.resume=latest", *extra)
    rank0 = load_file(tmp_path / "fsdp" / "params-rank0.safetensors")
    rank1 = load_file(tmp_path / "fsdp" / "params-rank1.safetensors")
    single = load_file(tmp_path / "one" / "params-rank0.safetensors")
    resumed = load_file(tmp_path / "resumed" / "params-rank0.safetensors")
    initial = load_file(tmp_path / "one" / "initial.safetensors")
    assert rank0.keys() == single.keys() == resumed.keys()
    # Sharded gradients are summed in another order than one process's, and Adam's first steps
    # move a weight by about lr whatever its gradient's size, so a weight whose gradient is ~0 can
    # move by +-lr in one run and -+lr in the other. Full fine-tuning (every UNet weight) has a
    # few such weights: there the update of each tensor must agree with one process's to 2% in
    # norm; LoRA's (fewer, larger gradients) agrees element by element.
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
        update = single[name] - initial[name]
        difference = (rank0[name] - single[name]).norm()
        assert difference <= 0.02 * update.norm() + 1e-6, (name, float(difference), float(update.norm()))
        if lora:
            torch.testing.assert_close(rank0[name], single[name], atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(resumed[name], rank0[name], atol=1e-5, rtol=1e-4)
    assert any(not torch.equal(single[n], initial[n]) for n in single)
    # the checkpoint holds the full (gathered) weights, equal to what the ranks hold
    checkpoint = load_checkpoint(latest_checkpoint(tmp_path / "fsdp" / "run"))
    for name, value in checkpoint.tensors["trainable"].items():
        assert torch.equal(value, rank0[name]), name
    exported = tmp_path / "fsdp" / "run" / "final"
    assert (exported / ("pytorch_lora_weights.safetensors" if lora else "unet/config.json")).exists()
