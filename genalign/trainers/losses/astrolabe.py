"""Astrolabe: forward-process RL for distilled autoregressive video models (arXiv 2603.17051).

The math is :func:`genalign.algorithms.astrolabe.astrolabe_loss`; this module is the trainer's
loss for the ``ar_video`` family, as the official trainer (``franklinz233/Astrolabe`` @ 35a5347,
``scripts/train_nft_wan.py``) runs it per minibatch:

1. one noise level ``timestep`` from ``train.astrolabe.timesteps`` (1000/750/500/250, unwarped),
   the same for every frame of every sample: ``t = timestep / 1000``; with
   ``train.astrolabe.device_batch_size`` one level per chunk of that many rows instead (the
   official per-GPU minibatch), and the selective KL's masked mean taken per chunk;
2. ``x_t = (1 - t) x0 + t eps`` on the rollouts' clean latent videos x0 ``[B, C, F, h, w]``;
3. the x0 predictions ``x0 = x_t - t v`` of the trained, the old (EMA) and the reference model
   (adapters disabled) at x_t, one block-causal forward over the whole video each (every frame
   at the same level, so earlier blocks are noisy context, as the official training forward);
4. ``L = mean_i[r_i |x0+ - x0|^2 + (1 - r_i) |x0- - x0|^2] + lambda |x0_theta - x0_ref|^2`` with
   ``x0+ = beta x0_theta + (1 - beta) x0_old``, ``x0- = (1 + beta) x0_old - beta x0_theta``.

The old policy is DiffusionNFT's (:class:`~genalign.trainers.losses.nft.NFTLoss`, whose
machinery this class inherits): rollouts come from it, and after each training step
``theta_old <- eta theta_old + (1 - eta) theta`` with ``eta = min(0.001 i, 0.5)`` after i optimiser
steps (the official ``return_decay``, applied after each epoch of rollouts). It is checkpointed.

Streaming windows (``train.astrolabe.window_frames``; the paper's, not in the released script):
only a window of latent frames is predicted and trained, the frames before it run once without
gradient as a KV-cached history (:meth:`~genalign.policies.ARVideoPolicy.predict_window_x0`), so
activations are kept for the window alone; frames after the window are not run at all. The start
is drawn per loss call, uniform over the block starts that fit; under
``train.astrolabe.window_per_step`` it is the step's window, drawn by the strategy, whose reward
scored that window only (the released streaming config's window-level reward).

The level and the noise are drawn from generators keyed by ``(train.seed, training step, the
loss call's index within the step)`` and ``(training step, sample seed, call index)``, so a run
replays them exactly on resume. The official trainer draws the level with ``random.randint`` per
minibatch on each GPU; here too each process draws its own sequence, the same on every process
that makes the same calls. The trainer's per-sample step indices are not used: the level is the
minibatch's, not the sample's (``train.timestep_fraction = 0.25`` makes one call per minibatch
on the 4-step grid).

Selective KL (``train.astrolabe.selective_kl``; the released multi-reward runs' ``use_select_kl``):
the KL term applies to the samples of the step's mask only, against a lagging copy of the trained
weights instead of the adapter-disabled model (:mod:`genalign.trainers.losses.selective_kl`: the
hooks ``prepare_update`` and ``before_optimizer_step``, the mask in ``trajectory.extras``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from genalign.algorithms.astrolabe import (
    astrolabe_loss,
    astrolabe_old_policy_decay,
    draw_window_start,
    flow_forward_noise,
    frame_timesteps,
    sample_noise_level,
)
from genalign.trainers.losses.base import LOSSES
from genalign.trainers.losses.forward_process import seeded_noise
from genalign.trainers.losses.nft import NFTLoss
from genalign.trainers.losses.selective_kl import KL_MASK_KEY, SelectiveKL
from genalign.trainers.strategies.astrolabe import WINDOW_KEY
from genalign.trainers.strategies.base import step_generator

__all__ = ["AstrolabeLoss"]


@LOSSES.register("astrolabe")
class AstrolabeLoss(NFTLoss):
    """Astrolabe's x0-space NFT loss on an ``ar_video`` policy (module docstring; ``train.astrolabe``).

    Hooks (inherited): ``forward_process = True``; :meth:`begin_step` keys the step's draws;
    ``rollout_policy`` samples with the old policy (``train.astrolabe.rollout_policy``);
    ``end_step`` soft-updates it with :meth:`old_policy_decay`. Under ``selective_kl`` also
    ``bind``, ``prepare_update``, ``before_optimizer_step`` and the checkpointed state of
    :attr:`selective` (:class:`~genalign.trainers.losses.selective_kl.SelectiveKL`).
    """

    decay_metric = "astrolabe_old_decay"
    row_mean = False  # one noise level per minibatch, and the selective KL ranks over the batch
    group_noise = False  # its noise is keyed by the loss call (below), not by NFTLoss.noise

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.options = config.astrolabe
        self.calls = 0  # loss calls so far in the current step: keys the level and the noise
        self.selective = SelectiveKL(self.options) if self.options.selective_kl else None

    def begin_step(self, step: int) -> None:
        self.current_step, self.calls = step, 0

    # ---- the selective KL's hooks (no-ops without it) --------------------------------------------
    def bind(self, trainer: Any) -> None:
        if self.selective is not None:
            self.selective.bind(trainer.reward)

    def prepare_update(self, trainer: Any, batch: Any) -> dict[str, float]:
        """Under selective KL: the reference reset rule and the step's KL mask (in the batch)."""
        if self.selective is None:
            return {}
        return self.selective.prepare(trainer, batch, self.current_step)

    def before_optimizer_step(self, trainer: Any) -> None:
        if self.selective is not None:
            self.selective.before_optimizer_step(trainer)

    def end_step(self, trainer: Any, step: int) -> dict[str, float]:
        metrics = super().end_step(trainer, step)
        if self.selective is not None:
            metrics.update(self.selective.end())
        return metrics

    def reference(self, policy: Any) -> contextlib.AbstractContextManager:
        """The KL's reference: the lagging copy under selective KL, else the adapter-disabled model."""
        return policy.reference() if self.selective is None else self.selective.swapped(policy)

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = super().state_dict()
        if self.selective is not None:
            state.update(self.selective.state_dict())
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        if self.selective is not None and state:
            self.selective.load_state_dict(state)

    def old_policy_decay(self, optimizer_steps: int) -> float:
        """eta = min(ema_rate * i, ema_max) (:func:`~genalign.algorithms.astrolabe.astrolabe_old_policy_decay`)."""
        return astrolabe_old_policy_decay(optimizer_steps, self.options.ema_rate, self.options.ema_max)

    def draw_level(self) -> tuple[int, float]:
        """This call's ``(timestep, t)`` (its first chunk's), keyed by (seed, step, call index)."""
        return self._draws(1, 1, 1)[0][0]

    def _draws(self, num_frames: int, block_size: int, batch: int) -> tuple[list[tuple[int, float]], int]:
        """This call's levels, one a chunk of ``device_batch_size`` rows (one for the call without
        it), and its window start (0 without ``window_frames``; uniform over the block starts that
        fit, :func:`~genalign.algorithms.astrolabe.draw_window_start`), from one generator: the
        first level, the window, then the other chunks' levels."""
        generator = step_generator(self.config.seed, self.current_step, self.calls)
        timesteps = [int(t) for t in self.options.timesteps]
        levels = [sample_noise_level(generator, timesteps)]
        window, start = self.options.window_frames, 0
        if window is not None and window < num_frames:
            start = draw_window_start(generator, num_frames, window, block_size)
        chunk = self.options.device_batch_size
        if chunk is not None:
            levels += [sample_noise_level(generator, timesteps) for _ in range(1, -(-batch // chunk))]
        return levels, start

    def _row_levels(self, levels: list[tuple[int, float]], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's ``(timestep, t)`` as ``[B]`` tensors: its chunk's level."""
        chunk = self.options.device_batch_size or batch
        rows = [levels[i // chunk] for i in range(batch)]
        return torch.tensor([r[0] for r in rows], dtype=torch.long), torch.tensor([r[1] for r in rows])

    def _window(
        self, policy, trajectory, num_frames: int, batch: int
    ) -> tuple[list[tuple[int, float]], int, int]:
        """This call's levels and the frames ``[start, stop)`` it trains: the whole video, a window
        drawn for this call, or under ``window_per_step`` the step's window (the rollout's end)."""
        options = self.options
        level, start = self._draws(num_frames, policy.block_size, batch)
        if options.window_frames is None:
            return level, 0, num_frames
        if options.window_per_step:
            window = trajectory.extras.get(WINDOW_KEY)
            if window is None:
                raise ValueError(
                    f"train.astrolabe.window_per_step: the minibatch carries no window (trajectory.extras[{WINDOW_KEY!r}]); "
                    "the astrolabe strategy sets it"
                )
            start, stop = window
            if stop != num_frames:
                raise ValueError(
                    f"the step's window [{start}, {stop}) does not end the {num_frames}-frame rollout"
                )
            return level, start, stop
        return level, start, min(start + options.window_frames, num_frames)

    def _predict(self, policy, x_t, levels, conditioning, start: int, stop: int) -> torch.Tensor:
        """x0 predictions of frames ``start .. stop - 1``: the whole video, or a streaming window
        attending to a detached history."""
        if self.options.window_frames is None:
            return policy.predict_video_x0(x_t, levels, conditioning)
        return policy.predict_window_x0(x_t[:, :, :stop], levels[:, :stop], conditioning, start)

    def __call__(self, policy, trajectory, step_index, advantages):
        if policy.family != "ar_video":
            raise ValueError(f"the astrolabe loss trains an 'ar_video' policy, got family {policy.family!r}")
        options = self.options
        x0 = trajectory.latents[:, -1].float()  # (B, C, F, h, w) clean latent videos
        batch, num_frames = x0.shape[0], x0.shape[2]
        drawn, start, stop = self._window(policy, trajectory, num_frames, batch)
        timestep, t = self._row_levels(drawn, batch)  # (B,) each: the row's chunk's level
        call = torch.full((batch,), self.calls, dtype=torch.long)
        self.calls += 1
        eps = seeded_noise(trajectory.seeds, call, x0.shape[1:], step=self.current_step).to(x0.device)
        x_t = flow_forward_noise(x0, eps, t.to(x0.device))
        levels = frame_timesteps(timestep, batch, num_frames, device=x0.device)  # (B, F)
        conditioning = trajectory.conditioning
        with torch.no_grad(), self.old_policy(policy):
            x0_old = self._predict(policy, x_t, levels, conditioning, start, stop)
        x0_theta = self._predict(policy, x_t, levels, conditioning, start, stop)
        if options.kl_weight > 0:
            with torch.no_grad(), self.reference(policy):
                x0_ref = self._predict(policy, x_t, levels, conditioning, start, stop)
        else:
            x0_ref = x0_theta.detach()
        kl_mask = None
        if self.selective is not None:
            kl_mask = trajectory.extras.get(KL_MASK_KEY)
            if kl_mask is None:
                raise ValueError(
                    f"train.astrolabe.selective_kl: the minibatch carries no KL mask (trajectory.extras[{KL_MASK_KEY!r}]); "
                    "the trainer's prepare_update hook sets it"
                )
        loss, info = astrolabe_loss(
            x0_theta,
            x0_old,
            x0_ref,
            x0[:, :, start:stop],
            advantages.to(x0.device).float(),
            beta=options.beta,
            kl_weight=options.kl_weight,
            advantage_clip=options.advantage_clip,
            adaptive_weighting=options.adaptive_weighting,
            clip_over_beta=options.clip_over_beta,
            kl_mask=kl_mask,
            kl_chunk_size=options.device_batch_size,
        )
        if self.selective is not None:
            self.selective.observe(info["astrolabe_kl_loss"])
        metrics = {
            "policy_loss": info["astrolabe_policy_loss"],
            "astrolabe_timestep": timestep.float().mean(),
            "astrolabe_window_start": torch.tensor(float(start)),
        }
        metrics.update({key: value for key, value in info.items() if torch.is_tensor(value)})
        return loss, metrics
