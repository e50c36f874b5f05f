"""Stateless step kernels with exact Gaussian log-probabilities.

Each kernel is a pure function of a scheduler (after ``set_timesteps``), the model output, the
current timestep(s) and sample: it never reads or writes the scheduler's step counter, computes in
fp32, accepts one timestep per sample, and either samples ``prev_sample`` or, when one is given,
scores it (how log-probs are recomputed under new weights)::

    out = ddim_step(scheduler, model_output, timestep, sample, eta=1.0)        # DDPO policy
    out = flow_sde_step(scheduler, velocity, step_index, sample, mode="sde")   # Flow-GRPO policy
    out = consistency_step(scheduler, model_output, timestep, sample)          # RLCM policy
    out.prev_sample, out.mean, out.std, out.log_prob, out.pred_original_sample

``log_prob`` is the exact Gaussian log-density summed over all non-batch dimensions (``[B]``);
deterministic steps (``std == 0``) have ``log_prob == 0``. Averaging per dimension, as DDPO and
Flow-GRPO do, is a loss option.
"""

from __future__ import annotations

from genalign.sampling.consistency import consistency_step, rlcm_timesteps
from genalign.sampling.ddim import ddim_step
from genalign.sampling.flow import FLOW_MODES, flow_sde_step
from genalign.sampling.types import StepOutput, gaussian_log_prob

__all__ = [
    "FLOW_MODES",
    "StepOutput",
    "consistency_step",
    "ddim_step",
    "flow_sde_step",
    "gaussian_log_prob",
    "rlcm_timesteps",
]
