"""The training loop: rollout -> reward -> advantages -> inner epochs of PPO-style updates.

``Trainer(policy, reward, strategy, loss, config)`` composes the four parts of DESIGN.md; the
recipes (DDPO, GRPO, Flow-GRPO, RLCM, B2-DiffuRL, DiffusionNFT, Sol-RL, RWR, ReFL) are choices of
them made in YAML (``configs/``). The strategy sees a
:class:`~genalign.trainers.strategies.base.RolloutContext`, not the trainer; the loss's hooks are
declared on :class:`~genalign.trainers.losses.base.PolicyLoss`.

Lifecycle of one step (read top to bottom in :meth:`Trainer.train_step`):

1. collect: the loss's ``begin_step`` hook; then, in the loss's ``rollout_policy`` (DiffusionNFT:
   the old policy), the strategy draws the step's global batch, rolls out this process's share in
   the training precision context (:meth:`Trainer.precision`) and scores it; a non-finite reward
   (NaN, +-inf) skips the step before any advantage or history sees it (logged and counted,
   nothing applied; :mod:`genalign.trainers.guards`); otherwise the strategy's advantages;
2. reward metrics: reward statistics, monitors, the strategy's own report, within-group spread;
3. update: for each inner epoch, :func:`genalign.trainers.minibatches.epoch_passes` permutes the
   global batch (zero-advantage samples left out under ``drop_zero_advantage``), gives each
   sample ``timestep_fraction`` of its trainable steps (a random subset, or the first ones:
   ``timestep_order``) and yields this process's part of every minibatch, which accumulates
   gradients over those steps (after the loss's ``prepare_update`` hook saw the batch); every
   ``gradient_accumulation_steps`` minibatches the loss's ``before_optimizer_step`` hook, then the
   optimiser steps (not when the gradient is not finite: ``nonfinite_grad_steps`` counts those;
   under fp16 compute the loss is scaled, the gradient unscaled before the clip and an overflow
   skipped as accelerate's GradScaler does: :mod:`genalign.trainers.loss_scale`); then the
   loss's ``end_step`` hook (DiffusionNFT's old-policy soft update);
4. metrics are logged; checkpoints are written atomically.

Distributed training goes through ``accelerate``: each process trains on its rows of the global
batch, scales its loss by its share of the minibatch and gradients are summed across processes,
so N processes compute the same update as one process with the same global batch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from genalign.algorithms import clustered_stderr, group_reward_statistics
from genalign.config import to_dict
from genalign.policies import DiffusionPolicy, JointPolicy, LanguagePolicy
from genalign.rewards import Reward
from genalign.trainers.checkpoint import latest_checkpoint
from genalign.trainers.config import RecipeConfig
from genalign.trainers.diagnostics import parameter_change, snapshot
from genalign.trainers.distributed import sum_over_processes
from genalign.trainers.ema import ParameterEMA
from genalign.trainers.guards import count_nonfinite, gradients_are_finite
from genalign.trainers.interrupts import GracefulStop, StepSnapshot
from genalign.trainers.loss_scale import loss_scale_for
from genalign.trainers.losses.base import PolicyLoss, as_policy_loss
from genalign.trainers.minibatches import MinibatchPass, epoch_passes, loss_calls, nonzero_advantages
from genalign.trainers.optimizer import make_optimizer
from genalign.trainers.prompt_pool import PromptPool
from genalign.trainers.run_folder import check_fresh_run, owned_run_folder, read_metrics, rewrite_metrics
from genalign.trainers.strategies.base import RolloutBatch, RolloutContext, RolloutStrategy
from genalign.trainers.trainer_state import resume_trainer, save_trainer

logger = logging.getLogger(__name__)


class Trainer:
    """RL fine-tuning of a generator policy against a reward.

    Args:
        policy: a :class:`~genalign.policies.DiffusionPolicy` or
            :class:`~genalign.policies.LanguagePolicy` with trainable parameters, or a
            :class:`~genalign.policies.JointPolicy` of several trained together (one optimiser
            parameter group each, one advantage per sample shared by all: PromptRL).
        reward: a :class:`~genalign.rewards.Reward`.
        strategy: decides which trajectories exist (``genalign.trainers.strategies``).
        loss: turns them into gradients (``genalign.trainers.losses``).
        config: the full :class:`RecipeConfig`.
        prompts: the prompt pool: a list of prompts, or a
            :class:`~genalign.trainers.prompt_pool.PromptPool` whose prompts carry metadata.
        accelerator: an ``accelerate.Accelerator`` (made from the config when None).
        monitors: rewards computed on every step's rollouts for logging only
            (``monitor_<name>`` metrics), never used for advantages.
    """

    def __init__(
        self,
        policy: DiffusionPolicy | LanguagePolicy | JointPolicy,
        reward: Reward,
        strategy: RolloutStrategy,
        loss: PolicyLoss,
        config: RecipeConfig,
        prompts: list[str],
        accelerator: Any | None = None,
        monitors: dict[str, Reward] | None = None,
    ) -> None:

        self.policy, self.reward, self.strategy, self.loss, self.config = (
            policy,
            reward,
            strategy,
            loss,
            config,
        )
        # a PromptPool (prompts with per-sample metadata: images, reference SVGs) is kept as is
        self.prompts = prompts if isinstance(prompts, PromptPool) else list(prompts)
        if not self.prompts:
            raise ValueError("the prompt pool is empty")
        self.fingerprint = config.fingerprint(self.prompts)  # identifies the recipe for resume
        train = config.train
        self.run_dir = Path(config.logging.run_dir.format(name=config.name))
        self.accelerator = accelerator or make_accelerator(config)
        if train.samples_per_step % self.accelerator.num_processes != 0:
            raise ValueError(
                f"the batch of {train.samples_per_step} samples does not split evenly over "
                f"{self.accelerator.num_processes} processes"
            )
        self.device = policy.device
        self.reward.to(self.device)
        self.monitors = dict(monitors or {})
        for monitor in self.monitors.values():
            monitor.to(self.device)
        self.sharded = self._wants_fsdp() and self.accelerator.num_processes > 1
        if self.sharded and not isinstance(policy, DiffusionPolicy | LanguagePolicy | JointPolicy):
            raise ValueError(f"FSDP shards a denoiser or a language model, not a {policy.family!r} policy")
        if self.sharded:
            from genalign.trainers.distributed import shard_policy

            units = shard_policy(policy, train.fsdp_wrap)
            logger.info("FSDP: sharded over %d processes in %d units", self.accelerator.num_processes, units)
        self.parameters = policy.trainable_parameters()
        if not self.parameters:
            raise ValueError("the policy has no trainable parameters (loaded with train=False?)")
        self.optimizer, self.lr_scheduler = make_optimizer(policy, train)  # AdamW, LambdaLR
        self.ema = ParameterEMA(self.parameters, train.ema_decay) if train.ema_decay else None
        self.step = 0
        self.optimizer_steps = 0
        self.saved_step: int | None = None  # the step of the checkpoint this trainer last wrote
        self.interrupted: int | None = None  # the signal that stopped train() early, if one did
        # called as ``callback(trainer, step, metrics)`` after each step, before it is logged;
        # a callback may add entries to ``metrics`` (e.g. a periodic held-out evaluation)
        self.callbacks: list[Any] = []
        self.history: list[dict[str, Any]] = []
        self._last_outputs: torch.Tensor | list[str] | None = None  # images, or completions
        self._grad_norms: list[float] = []  # this step's gradient norms, one per optimizer step
        self._nonfinite_grad_steps = self._loss_scale_skips = 0  # this step's skipped optimizer steps
        # fp16 compute: dynamic loss scaling as accelerate's GradScaler (None under fp32 / bf16)
        self.loss_scale = loss_scale_for(policy, train.mixed_precision)
        self.loss.bind(self)  # a loss that needs the reward itself (ReFL)

    # ---- distributed helpers -------------------------------------------------------------------
    @property
    def is_main_process(self) -> bool:
        return self.accelerator.is_main_process

    def local_rows(self, global_batch_size: int) -> torch.Tensor:
        """This process's contiguous rows of the global batch."""
        n, rank = self.accelerator.num_processes, self.accelerator.process_index
        share = global_batch_size // n
        return torch.arange(rank * share, (rank + 1) * share)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.accelerator.num_processes == 1:
            return tensor
        return self.accelerator.gather(tensor.contiguous())

    def _wants_fsdp(self) -> bool:
        from accelerate.utils import DistributedType

        return bool(self.config.train.fsdp) or self.accelerator.distributed_type == DistributedType.FSDP

    def _sum_gradients_across_processes(self) -> None:
        if self.accelerator.num_processes == 1 or self.sharded:
            return  # FSDP reduce-scatters gradients in backward
        for parameter in self.parameters:
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            torch.distributed.all_reduce(parameter.grad, op=torch.distributed.ReduceOp.SUM)

    def precision(self) -> contextlib.AbstractContextManager:
        """The precision context of rollouts and of log-prob recomputation (``accelerate``'s
        autocast under ``train.mixed_precision``, a no-op otherwise).

        Rollouts whose log-probs are trained on and the update's re-scoring must run in the same
        context, or under bf16 / fp16 the first inner step's ratio is not 1 (issue 20: clipfrac
        0.58 on a wholly on-policy step of the tiny Flow-GRPO recipe). ddpo-pytorch and flow_grpo
        sample under the same ``accelerator.autocast()`` as they train.
        """
        return self.accelerator.autocast()

    def rollout_context(self) -> RolloutContext:
        """What the strategy sees of this trainer: policy, reward, prompts, sampling, processes."""
        return RolloutContext(
            policy=self.policy,
            reward=self.reward,
            prompts=self.prompts,
            sampling=self.config.sampling,
            device=self.device,
            num_processes=self.accelerator.num_processes,
            local_rows=self.local_rows,
            gather=self.gather,
            precision=self.precision,
        )

    def rollout_kwargs(self) -> dict[str, Any]:
        """The sampling as evaluations use it (``policy.rollout`` keywords, no ``sampling.training``)."""
        return self.rollout_context().rollout_kwargs(training=False)

    @property
    def loss(self) -> PolicyLoss:
        return self._loss

    @loss.setter
    def loss(self, loss: PolicyLoss | Any) -> None:
        self._loss = as_policy_loss(loss)  # a plain callable is a loss without hooks

    # ---- one step ------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict[str, Any]:
        """Run training step ``step``: rollout -> reward -> advantages -> update; return its metrics."""
        start = time.perf_counter()
        batch = self.collect(step)  # rollouts, rewards and advantages: the strategy's
        metrics = self._reward_metrics(step, batch)
        metrics["time_rollout"] = time.perf_counter() - start
        metrics.update(self._monitor_metrics(batch))
        metrics.update(batch.metrics)  # a strategy's own report (Sol-RL fidelity, timings)
        if batch.skipped:  # e.g. a non-finite reward: nothing is applied
            logger.warning("step %d skipped: %s", step, batch.reason)
            metrics.update(skipped=True, skip_reason=batch.reason)
            return metrics
        trainable_steps = self._trainable_steps(batch)
        if batch.global_group_ids is not None:
            finite = torch.isfinite(batch.global_rewards)
            metrics.update(
                group_reward_statistics(batch.global_rewards[finite], batch.global_group_ids[finite.cpu()])
            )
        # a copy of the trainable weights for the step's param_change (off: logging.param_change)
        before = snapshot(self.parameters) if self.config.logging.param_change else None
        update_start = time.perf_counter()
        metrics.update(self.loss.prepare_update(self, batch))  # e.g. Astrolabe's selective-KL mask
        rates = self.lr_scheduler.get_last_lr()  # what the step's (first) optimizer step uses
        metrics.update(self.update(step, batch, trainable_steps, self._window_steps(batch).numel()))
        metrics.update(self.loss.end_step(self, step))  # e.g. DiffusionNFT's old-policy soft update
        metrics["time_update"] = time.perf_counter() - update_start
        metrics["lr"] = rates[0]
        if len(self.optimizer.param_groups) > 1:
            for group, lr in zip(self.optimizer.param_groups, rates, strict=True):
                metrics[f"lr_{group['name']}"] = lr
        metrics["nonfinite_grad_steps"] = self._nonfinite_grad_steps
        if self.loss_scale is not None:  # fp16: the scale after the step, its overflow skips
            metrics.update(loss_scale=self.loss_scale.scale, loss_scale_skips=self._loss_scale_skips)
        if self._grad_norms:
            metrics["grad_norm"] = sum(self._grad_norms) / len(self._grad_norms)
        if before is not None:
            metrics.update(parameter_change(before, self.parameters))
        return metrics

    def collect(self, step: int) -> RolloutBatch:
        """The step's rollouts, scored, with advantages (in the loss's rollout policy)."""
        self.loss.begin_step(step)
        self.policy.trained_module.eval()  # no dropout: rollout and re-scoring see the same function
        with self.loss.rollout_policy(self, step):  # DiffusionNFT samples with its old policy
            batch = self.strategy.collect(self.rollout_context(), step)
        self._last_outputs = batch.trajectory.outputs
        return batch

    def _window_steps(self, batch: RolloutBatch) -> torch.Tensor:
        """LongTensor of the grid steps within the loss's (ReFL) and the strategy's (B2-DiffuRL)
        windows, every step without one: ``timestep_fraction`` keeps ``int(n * fraction)`` of these
        n, as DDPO and Flow-GRPO take it of the sampling steps, not of the stochastic ones."""
        steps = torch.arange(batch.trajectory.num_steps)
        for window in (self.loss.train_steps(batch.trajectory.num_steps), batch.train_steps):
            if window is not None:
                steps = steps[torch.isin(steps, window.to(steps.device))]
        return steps

    def _trainable_steps(self, batch: RolloutBatch) -> torch.Tensor:
        """LongTensor of the step indices the update may train on: the stochastic ones (every one
        for a forward-process loss), within the loss's and the strategy's windows."""
        steps = self._window_steps(batch)
        if not self.loss.forward_process:
            # a forward-process loss (DiffusionNFT) noises the final samples itself: any rollout,
            # ODE included, and any step's noise level can be trained on; others need a log-prob
            stochastic = batch.trajectory.stochastic_steps()
            steps = steps[torch.isin(steps, stochastic.to(steps.device))]
        if steps.numel() == 0:
            raise ValueError(
                "no stochastic step to train on (eta 0 / mode ode in sampling or sampling.training, or an empty train window?)"
            )
        return steps

    def update(
        self,
        step: int,
        batch: RolloutBatch,
        trainable_steps: torch.Tensor,
        num_window_steps: int | None = None,
    ) -> dict[str, Any]:
        """The inner epochs of minibatch updates on ``batch``; returns the loss metrics (means over
        every process's loss calls, weighted by their rows) and the fraction of zero-advantage
        samples (:mod:`genalign.trainers.minibatches`).
        ``num_window_steps``: the steps ``timestep_fraction`` is a fraction of (None: the trainable ones)."""
        train = self.config.train
        self._grad_norms = []
        self._nonfinite_grad_steps = self._loss_scale_skips = 0
        global_size = batch.global_batch_size
        kept = nonzero_advantages(batch.global_index, batch.advantages, global_size, self.gather, self.device)
        sums: dict[str, float] = {}
        counts = 0
        sharded_over = self.accelerator.num_processes if self.sharded else 0
        for epoch in range(train.inner_epochs):
            passes = (train, step, epoch, batch.global_index, global_size, trainable_steps, kept)
            for part in epoch_passes(*passes, sharded_over, batch.global_group_ids, num_window_steps):
                for info, rows in self._backward(batch, part):  # weighted by rows: a mean over samples
                    for key, value in info.items():
                        sums[key] = sums.get(key, 0.0) + float(value) * rows
                    counts += rows
                if part.optimizer_step:
                    self._optimizer_step()
        sums, counts = sum_over_processes(sums, counts, self.device)  # every process's loss calls
        metrics = {"zero_advantage_fraction": int((~kept).sum()) / max(global_size, 1)}
        metrics.update({key: value / max(counts, 1) for key, value in sums.items()})
        return metrics

    def _backward(self, batch: RolloutBatch, part: MinibatchPass) -> list[tuple[dict[str, Any], int]]:
        """Accumulate the gradients of one minibatch pass; the metrics of its (non-dummy) losses,
        each with its number of rows."""
        if not part.rows:
            return []
        train = self.config.train
        infos = []
        selected = {}  # the unfused calls share one sub-batch: select it once per pass
        for rows, step_index, weight in loss_calls(part, train.fuse_timesteps):
            if (key := tuple(rows)) not in selected:
                selected[key] = (batch.trajectory.select(rows), batch.advantages[torch.tensor(rows)])
            sub, advantages = selected[key]
            with self.precision():
                loss, info = self.loss(self.policy, sub, step_index, advantages)
            loss = loss * (weight / part.accumulated)  # the mean over the optimiser step's minibatches
            (loss if self.loss_scale is None else self.loss_scale.scale_loss(loss)).backward()
            if not part.dummy:
                infos.append((info, len(rows)))
        return infos

    def _optimizer_step(self) -> None:
        train = self.config.train
        self.loss.before_optimizer_step(self)  # the step's minibatches are done (Astrolabe's KL watch)
        self._sum_gradients_across_processes()
        if self.loss_scale is not None:  # fp16: true units for the clip, the logged norm, the check
            self.loss_scale.unscale_(self.parameters)
        # the norm before clipping (clip_grad_norm_ returns it); inf clips nothing
        norm = torch.nn.utils.clip_grad_norm_(
            self.parameters, train.max_grad_norm if train.max_grad_norm > 0 else math.inf
        )
        finite = gradients_are_finite(norm)
        if self.loss_scale is not None and not self.loss_scale.update(finite):
            self.optimizer.zero_grad(set_to_none=True)  # an fp16 overflow: expected, the scale halved
            self._loss_scale_skips += 1
            return
        self._grad_norms.append(float(norm))
        if not finite:  # a NaN / infinite loss: applying it would poison the weights
            logger.warning("optimizer step skipped: the gradient norm is %s", float(norm))
            self.optimizer.zero_grad(set_to_none=True)
            self._nonfinite_grad_steps += 1
            return
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        if self.ema is not None:
            self.ema.step(self.parameters)

    def _monitor_metrics(self, batch: RolloutBatch) -> dict[str, float]:
        """Mean and std of each monitor's scores on this step's rollouts (all processes)."""
        metrics = {}
        trajectory = batch.trajectory
        for name, monitor in self.monitors.items():
            with torch.no_grad():
                scores = monitor(trajectory.outputs, trajectory.prompts).scores.detach().float()
            scores = self.gather(scores.to(self.device)).cpu()
            finite = scores[torch.isfinite(scores)]
            metrics[f"monitor_{name}"] = float(finite.mean()) if finite.numel() else float("nan")
            metrics[f"monitor_{name}_std"] = float(finite.std(unbiased=True)) if finite.numel() > 1 else 0.0
        return metrics

    def _reward_metrics(self, step: int, batch: RolloutBatch) -> dict[str, Any]:
        rewards = batch.global_rewards.float()
        kept = torch.isfinite(rewards)
        finite, groups = rewards[kept], batch.global_group_ids
        std = float(finite.std(unbiased=True)) if finite.numel() > 1 else 0.0
        metrics: dict[str, Any] = {
            "step": step,
            "reward_mean": float(finite.mean()) if finite.numel() else float("nan"),
            "reward_std": std,  # the error of the mean, with a prompt's group as one cluster:
            "reward_stderr": clustered_stderr(finite, groups[kept.cpu()] if groups is not None else 1),
            "samples": int(rewards.numel()),
            "nonfinite_rewards": count_nonfinite(rewards),
        }
        for key, value in batch.details.items():
            metrics[f"reward_{key}"] = value
        return metrics

    # ---- checkpoints (genalign.trainers.trainer_state) ------------------------------------------
    def save(self, rng_state: Any | None = None) -> Path | None:
        """Write an atomic checkpoint of everything needed to resume (main process only); never
        from non-finite weights. ``rng_state``: the RNG state to store (default: the current one)."""
        return save_trainer(self, rng_state)

    def resume(self, where: str) -> None:
        """Continue from ``"latest"`` (the newest intact checkpoint in the run folder) or a
        checkpoint folder; ``"latest"`` without a checkpoint starts a fresh, clean run."""
        resume_trainer(self, where)

    # ---- logging -------------------------------------------------------------------------------
    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    def _truncate_metrics(self, step: int) -> None:
        """Drop metric lines of steps after ``step`` (logged before a crash, redone after resume)."""
        if not self.is_main_process or not self.metrics_path.exists():
            return
        self.history = [row for row in read_metrics(self.metrics_path) if row["step"] < step]
        rewrite_metrics(self.metrics_path, self.history)

    def log(self, metrics: dict[str, Any]) -> None:
        self.history.append(metrics)
        if self.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with self.metrics_path.open("a") as handle:
                handle.write(json.dumps(metrics) + "\n")
            numeric = {
                k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            if self.config.logging.trackers:
                self.accelerator.log(numeric, step=metrics["step"])

    def save_samples(self, outputs: torch.Tensor | list[str], step: int) -> None:
        """A grid of the step's images, or a language policy's completions as JSON lines."""
        from genalign.utils.images import make_grid

        folder = self.run_dir / "samples"
        folder.mkdir(parents=True, exist_ok=True)
        if torch.is_tensor(outputs):
            make_grid(outputs.cpu()).save(folder / f"step-{step:06d}.png")
            return
        rows = [{"completion": text} for text in outputs]
        (folder / f"step-{step:06d}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    # ---- the loop ------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Run from the current step to ``train.num_steps``; return the metrics of every step.

        The run folder is locked for the run (:mod:`genalign.trainers.run_folder`): a second live
        run into it fails, and a fresh run into a folder holding another run refuses unless
        ``logging.overwrite`` is set.
        """
        with owned_run_folder(self.run_dir, self.is_main_process):
            return self._train()

    def _train(self) -> list[dict[str, Any]]:
        from genalign.utils.progress import progress_bar

        config = self.config
        if config.logging.resume:
            self.resume(config.logging.resume)
        else:
            if self.is_main_process:
                check_fresh_run(self.run_dir, config.logging.overwrite)
            self._truncate_metrics(self.step)
        if self.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "recipe.json").write_text(json.dumps(to_dict(config), indent=2))
        if config.logging.trackers:
            self.accelerator.init_trackers(config.name, config={"fingerprint": self.fingerprint})
        bar = progress_bar(
            range(self.step, config.train.num_steps),
            desc="train",
            disable=not (config.logging.progress and self.is_main_process),
        )
        with GracefulStop() as stop:
            for step in bar:
                self._run_step(step, bar)
                if stop.requested is not None:
                    break
        if stop.requested is not None and self.step < config.train.num_steps:
            # SIGTERM / Ctrl-C: keep the finished steps, skip the export
            self.interrupted = stop.requested
            if self.saved_step != self.step:
                self.save()
            logger.warning("interrupted: stopped after step %d and saved it", self.step - 1)
            return self.history
        if not latest_checkpoint(self.run_dir) or self._latest_step() != self.step:
            self.save()
        self.export_weights()  # gathers on every process under FSDP; the main one writes
        if self.is_main_process:
            self.plot_rewards()
        if config.logging.trackers:
            self.accelerator.end_training()
        return self.history

    def _run_step(self, step: int, bar: Any) -> None:
        """One step of the loop: train, callbacks, log, samples, periodic checkpoint."""
        config = self.config
        snapshot = StepSnapshot(self)
        try:
            metrics = self.train_step(step)
        except Exception as error:  # a reward or loss exception: keep the last good step
            snapshot.save_after_failure(self, error)
            raise
        self.step = step + 1
        for callback in self.callbacks:
            callback(self, step, metrics)
        self.log(metrics)
        bar.set_postfix(reward=f"{metrics['reward_mean']:.4g}")
        every = config.logging.sample_every
        if every and step % every == 0 and self.is_main_process:
            self.save_samples(self._last_outputs, step)
        if config.logging.checkpoint_every and self.step % config.logging.checkpoint_every == 0:
            self.save()

    def _latest_step(self) -> int:
        path = latest_checkpoint(self.run_dir)
        return int(path.name.split("-")[-1]) if path else -1

    def export_weights(self) -> Path:
        """Trained weights in the standard format (:mod:`genalign.trainers.export`): a diffusers
        LoRA file or the full denoiser; a language policy's peft adapter or whole model.

        With ``train.ema_decay`` set, the exported weights are the EMA of the trained ones.
        """
        if self.ema is not None:
            with self.ema.swapped(self.parameters):
                return self._export_weights()
        return self._export_weights()

    def _export_weights(self) -> Path:
        from genalign.trainers.export import export_trained_weights

        return export_trained_weights(self, self.run_dir / "final")

    def plot_rewards(self) -> Path | None:
        from genalign.utils.plots import reward_curve

        ylabel = f"reward ({self.config.reward.name})"
        return reward_curve(self.history, ylabel, self.config.name, self.run_dir / "reward_curve.png")


def make_accelerator(config: RecipeConfig) -> Any:
    """The ``accelerate.Accelerator`` a recipe asks for (mixed precision, trackers, run folder)."""
    from accelerate import Accelerator

    return Accelerator(
        mixed_precision=config.train.mixed_precision,
        log_with=list(config.logging.trackers) or None,
        project_dir=config.logging.run_dir.format(name=config.name),
    )


def build_trainer(
    config: RecipeConfig, base_dir: Path | None = None, accelerator: Any | None = None
) -> Trainer:
    """Build policy, reward, strategy and loss from a recipe and return the trainer."""
    from genalign.policies import LoRASpec, load_policy
    from genalign.rewards import load_reward
    from genalign.trainers.joint_recipe import generator_training, joint_policy_and_loss
    from genalign.trainers.losses import LOSSES
    from genalign.trainers.preflight import check_recipe_names
    from genalign.trainers.recipe_paths import resolve_recipe_paths
    from genalign.trainers.strategies import STRATEGIES

    check_recipe_names(config)  # every registry name, before any model loads
    # what is loaded: relative paths missing from the working directory come from the recipe's folders
    loaded = resolve_recipe_paths(config, base_dir)
    model = loaded.model
    lora = LoRASpec(**to_dict(model.lora)) if model.lora is not None else None
    # the accelerator first: under a multi-process launch it picks this process's device
    accelerator = accelerator or make_accelerator(config)
    device = accelerator.device
    lora, trained = generator_training(config, lora)  # PromptRL's LM-only runs freeze the generator
    options = model.policy_options()  # the language family's frozen, ar_video's local_window
    policy = load_policy(
        model.family, model.path, lora=lora, train=trained, dtype=model.dtype, device=device, **options
    )
    reward = load_reward(config.reward.name, **loaded.reward.kwargs)
    monitors = {name: load_reward(name, **kwargs) for name, kwargs in loaded.reward.monitors.items()}
    strategy = STRATEGIES.get(config.train.strategy)(config.train)
    loss = LOSSES.get(config.train.loss)(config.train)
    if config.rewriter is not None:  # a joint run: PromptRL's rewriter beside the generator
        policy, loss = joint_policy_and_loss(loaded, policy, loss, device)
    prompts = config.prompts.load(base_dir)
    return Trainer(
        policy, reward, strategy, loss, config, prompts, accelerator=accelerator, monitors=monitors
    )
