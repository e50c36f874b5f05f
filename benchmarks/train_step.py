"""Update overhead: the trainer's update phase vs a bare forward+backward of the same denoiser calls.

A :class:`~genalign.trainers.Trainer` is built from the tiny DDPO recipe
(``configs/tiny/ddpo_jpeg.yaml``; ``key=value`` arguments override it), one rollout batch is
collected, and then two updates on that same batch are timed in alternating repeats:

* ``trainer``: ``Trainer.train_step`` with the strategy's ``collect`` answering the cached batch,
  so it runs the real update loop (minibatches, per-sample timestep selection, ``policy.step``
  with its DDIM log-prob, PPO-clip loss, gradient clipping, AdamW) and nothing else of note;
  its own ``time_update`` metric is reported beside the measured time;
* ``bare``: the same minibatches and per-sample step indices (drawn from the same generator), one
  batched UNet call with classifier-free guidance on ``[uncond; cond]`` per step, the guided output
  in an advantage-weighted squared loss, backward with the trainer's loss scale, gradient clipping
  and an AdamW step on the same parameters. ``--baseline predict`` makes that call through
  ``policy.predict`` instead of the bare UNet.

``max|d output|`` checks that the bare forward computes what ``policy.predict`` does. The ratio of
median times trainer / bare should be at most 1.25. Peak memory is measured per variant in two
more calls each (alternating which goes first; the larger is shown): ``torch.cuda.max_memory_allocated``
on CUDA, else the process's peak resident set (``getrusage`` max RSS, its high-water mark reset
through ``/proc/self/clear_refs`` and freed heap returned with ``malloc_trim`` just before).

    python benchmarks/train_step.py                                # CPU, ~1 minute
    python benchmarks/train_step.py train.minibatch_size=16 --repeats 7 --json /tmp/update.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import diffusers
import torch
import transformers
from _timing import Comparison, compare, peak_memory, profile_difference

from genalign.algorithms import select_timesteps_per_sample
from genalign.algorithms.losses import reduce_log_prob
from genalign.policies import SDPolicy
from genalign.trainers.config import load_recipe
from genalign.trainers.strategies import RolloutBatch, step_generator
from genalign.trainers.trainer import Trainer, build_trainer

RECIPE = Path(__file__).resolve().parent.parent / "configs" / "tiny" / "ddpo_jpeg.yaml"
TARGET = 1.25


def update_plan(trainer: Trainer, batch: RolloutBatch, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The trainer's minibatches for ``step``: (rows ``[M]``, step indices ``[M, K]``) per minibatch,
    drawn exactly as ``Trainer.train_step`` draws them (single process: local rows are global)."""
    train = trainer.config.train
    stochastic = batch.trajectory.stochastic_steps()
    size = batch.global_batch_size
    plan = []
    for epoch in range(train.inner_epochs):
        generator = step_generator(train.seed, step, epoch)
        permutation = torch.randperm(size, generator=generator)
        chosen = select_timesteps_per_sample(size, stochastic.numel(), train.timestep_fraction, generator)
        step_indices = stochastic[chosen]  # (B, K)
        for m in range(size // train.minibatch_size):
            rows = permutation[m * train.minibatch_size : (m + 1) * train.minibatch_size]
            plan.append((rows, step_indices[rows]))
    return plan


def guided_unet(trainer: Trainer) -> Callable[..., torch.Tensor]:
    """The denoiser call of ``SDPolicy.predict`` without the policy: CFG on one ``[uncond; cond]``
    batch (SD 1.x/2.x UNets, which the tiny recipe trains)."""
    policy = trainer.policy
    unet, scheduler = policy.denoiser, policy.scheduler
    if type(policy) is not SDPolicy or policy.is_sdxl:
        raise ValueError(
            f"the bare UNet call covers SD 1.x/2.x only, not {type(policy).__name__}: use --baseline predict"
        )
    dtype = unet.dtype  # once: diffusers' ``ModelMixin.dtype`` walks every submodule

    def call(latents, step_index, conditioning, settings) -> torch.Tensor:
        t = scheduler.timesteps[step_index].to(policy.device)  # (M,)
        embeds = torch.cat([conditioning["negative_prompt_embeds"], conditioning["prompt_embeds"]])
        out = unet(
            torch.cat([latents, latents]).to(dtype),
            torch.cat([t, t]),
            encoder_hidden_states=embeds.to(dtype),
            return_dict=False,
        )[0]
        uncond, text = out.chunk(2)  # (M, C, H, W) each
        return uncond + settings.guidance_scale * (text - uncond)

    return call


def bare_update(
    trainer: Trainer, batch: RolloutBatch, predict: Callable[..., torch.Tensor]
) -> Callable[[], None]:
    """Forward + simple loss + backward + clipped AdamW step over the trainer's minibatches."""
    train = trainer.config.train
    trajectory = batch.trajectory
    parameters = trainer.parameters
    optimizer = torch.optim.AdamW(
        parameters,
        lr=train.learning_rate,
        betas=tuple(train.adam_betas),
        weight_decay=train.adam_weight_decay,
        eps=train.adam_epsilon,
    )

    def run() -> None:
        plan = update_plan(trainer, batch, 0)
        for m, (rows, step_indices) in enumerate(plan):
            conditioning = {key: value[rows] for key, value in trajectory.conditioning.items()}
            advantages = batch.advantages[rows].reshape(-1, 1, 1, 1)
            num_steps = step_indices.shape[1]
            for k in range(num_steps):
                index = step_indices[:, k]  # (M,)
                latents = trajectory.latents[rows, index]  # (M, C, H, W)
                output = predict(latents, index, conditioning, trajectory.settings)
                loss = (advantages * output.float().square()).mean()
                (loss / (num_steps * train.gradient_accumulation_steps)).backward()
            if (m + 1) % train.gradient_accumulation_steps == 0 or m == len(plan) - 1:
                if train.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(parameters, train.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

    return run


def forward_difference(trainer: Trainer, batch: RolloutBatch, predict: Callable[..., torch.Tensor]) -> float:
    """Largest difference between the bare forward and ``policy.predict`` on the first minibatch."""
    rows, step_indices = update_plan(trainer, batch, 0)[0]
    index = step_indices[:, 0]  # (M,)
    latents = batch.trajectory.latents[rows, index]  # (M, C, H, W)
    conditioning = {key: value[rows] for key, value in batch.trajectory.conditioning.items()}
    settings = batch.trajectory.settings
    with torch.no_grad():
        ours = predict(latents, index, conditioning, settings)
        theirs = trainer.policy.predict(latents, index, conditioning, settings)
    return (ours - theirs).abs().max().item()


def on_policy_check(trainer: Trainer, batch: RolloutBatch) -> dict[str, float]:
    """The update's first ratios, before any optimiser step: log-probs recomputed minibatch by
    minibatch as ``train_step`` draws them (same rows, same per-sample steps, the update's
    precision), against the rollout's. Every ratio must be 1; on a GPU in fp16 or bf16 the
    rollout's batch shape and the minibatch's can pick different kernels, and a drift larger than
    the clip range clips an on-policy step (DDPO's clip range is 1e-4)."""
    train = trainer.config.train
    trajectory = batch.trajectory
    num_dims = trajectory.latents[0, 0].numel()
    worst, total, clipped = 0.0, 0, 0
    for rows, step_indices in update_plan(trainer, batch, 0):
        sub = trajectory.select(rows)
        with torch.no_grad(), trainer.precision():  # one policy.step per column, as the update calls it
            new = trainer.policy.log_prob(sub, step_indices).float().cpu()
        old = sub.log_probs.gather(1, step_indices.to(sub.log_probs.device)).float().cpu()
        deviation = (reduce_log_prob(new - old, train.ratio_reduction, num_dims).exp() - 1).abs()
        worst = max(worst, float(deviation.max()))
        clipped += int((deviation > train.clip_range).sum())
        total += deviation.numel()
    return {"max_abs_ratio_minus_1": worst, "clipped_fraction": clipped / max(total, 1), "ratios": total}


def trainer_update(trainer: Trainer, batch: RolloutBatch, update_times: list[float]) -> Callable[[], None]:
    """``trainer.train_step(0)`` on the cached batch; its ``time_update`` goes to ``update_times``."""
    trainer.strategy.collect = lambda trainer_, step: batch  # the rollout is done once, outside

    def run() -> None:
        update_times.append(trainer.train_step(0)["time_update"])

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="recipe overrides, e.g. train.minibatch_size=16")
    parser.add_argument("--recipe", default=str(RECIPE))
    parser.add_argument("--repeats", type=int, default=9, help="timed pairs (median reported)")
    parser.add_argument(
        "--baseline", choices=["unet", "predict"], default="unet", help="the bare loop's forward"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (tiny models: 1 is steadiest)"
    )
    parser.add_argument(
        "--profile", choices=["auto", "all", "off"], default="auto", help="cProfile when over target"
    )
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()

    overrides = ["logging.run_dir=/tmp/bench/{name}", "logging.progress=false", *args.overrides]
    config = load_recipe(args.recipe, overrides)
    trainer = build_trainer(config, base_dir=Path(args.recipe).parent)
    policy, train = trainer.policy, config.train
    policy.denoiser.eval()
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    device = str(trainer.device)
    predict = policy.predict if args.baseline == "predict" else guided_unet(trainer)

    difference = forward_difference(trainer, batch, predict)
    on_policy = on_policy_check(trainer, batch)
    update_times: list[float] = []
    measured, baseline = trainer_update(trainer, batch, update_times), bare_update(trainer, batch, predict)
    result: Comparison = compare(measured, baseline, repeats=args.repeats, warmup=1, device=device)
    internal = statistics.median(update_times[-args.repeats :])
    memory = {"trainer": [], "bare": []}
    for order in ((measured, baseline), (baseline, measured)):  # each variant measured first once
        for fn in order:
            memory["trainer" if fn is measured else "bare"].append(peak_memory(fn, device))

    unit = "max allocated" if device.startswith("cuda") else "max RSS"
    plan = update_plan(trainer, batch, 0)
    steps_per_sample = plan[0][1].shape[1]
    print(
        f"device={device} recipe={Path(args.recipe).name} samples={batch.global_batch_size} "
        f"minibatch={train.minibatch_size} steps/sample={steps_per_sample}/{batch.trajectory.num_steps} "
        f"denoiser calls/update={len(plan) * steps_per_sample} cfg={policy.uses_cfg(config.sampling.guidance_scale)} "
        f"baseline={args.baseline} repeats={args.repeats} threads={torch.get_num_threads()} target<={TARGET:.2f}"
    )
    print(f"max|d output| bare forward vs policy.predict: {difference:.2e}")
    print(
        f"on-policy ratios before the first optimiser step ({on_policy['ratios']}, {train.ratio_reduction} "
        f"reduction): max|ratio - 1| {on_policy['max_abs_ratio_minus_1']:.2e}, beyond the clip range "
        f"{train.clip_range:g}: {on_policy['clipped_fraction']:.3f} (must be 0)"
    )
    print(f"{'variant':8s} {'median ms':>10s} {f'peak {unit} MiB':>22s} {'rise MiB':>9s}")
    for name, seconds in (("trainer", result.measured_median), ("bare", result.baseline_median)):
        peak = max(p for p, _ in memory[name])
        rise = max(r for _, r in memory[name])
        print(f"{name:8s} {seconds * 1e3:10.1f} {peak:22.1f} {rise:9.1f}")
    print(f"trainer time_update metric (median): {internal * 1e3:.1f} ms")
    flag = "" if result.ratio <= TARGET else "  > target"
    print(
        f"ratio trainer/bare: {result.ratio:.3f} (paired {result.paired_ratio:.3f}, noise {result.noise:.3f}){flag}"
    )
    if args.profile == "all" or (args.profile == "auto" and result.ratio > TARGET):
        result.extras["profile"] = profile_difference(measured, baseline)
        print(f"\nwhere the trainer's extra time goes\n{result.extras['profile']}")
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if args.json:
        result.extras.update(
            max_output_difference=difference,
            on_policy=on_policy,
            time_update_median=internal,
            peak_memory_mib=memory,
            memory_unit=unit,
        )
        payload = {"config": vars(args), "target": TARGET, "device": device, "result": result.to_dict()}
        with open(args.json, "w") as handle:
            json.dump(payload, handle, indent=2)


if __name__ == "__main__":
    main()
