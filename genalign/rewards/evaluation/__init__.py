"""Reward-model evaluation: how well a reward agrees with human judgements.

Three tasks, each with its field's metric:

- ``preference``: pairwise accuracy on (prompt, image_0, image_1, label) under a tie policy
  (PickScore's tuned-threshold protocol, skip-ties, strict), Kirstain et al. 2023;
- ``ranking``: per-prompt pairwise agreement with human ranks (HPS v2's inversion score),
  Wu et al. 2023;
- ``mos``: SRCC, KRCC, PLCC against mean opinion scores, raw and after the 4-parameter
  logistic fit (VQEG 2000), as IQA papers report.

Every summary number comes with a percentile bootstrap interval. ``genalign eval-reward`` is the
command line; :func:`evaluate_rewards` the library entry point.
"""

from __future__ import annotations

from genalign.rewards.evaluation.data import (
    PRESETS,
    TASK_COLUMNS,
    EvalDataset,
    EvalSample,
    load_eval_dataset,
    load_table,
)
from genalign.rewards.evaluation.metrics import (
    TIE_POLICIES,
    bootstrap_interval,
    bootstrap_intervals,
    imagereward_pair_counts,
    inversion_score,
    logistic4,
    mos_correlations,
    preference_credit,
    tune_tie_threshold,
)
from genalign.rewards.evaluation.run import EvalConfig, evaluate_rewards

__all__ = [
    "PRESETS",
    "TASK_COLUMNS",
    "TIE_POLICIES",
    "EvalConfig",
    "EvalDataset",
    "EvalSample",
    "bootstrap_interval",
    "bootstrap_intervals",
    "evaluate_rewards",
    "imagereward_pair_counts",
    "inversion_score",
    "load_eval_dataset",
    "load_table",
    "logistic4",
    "mos_correlations",
    "preference_credit",
    "tune_tie_threshold",
]
