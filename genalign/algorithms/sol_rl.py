"""Sol-RL's candidate selection and the fidelity of a preview ranking, as pure functions.

Sol-RL (Speed-of-light RL, 2025; official code in NVlabs/Sana, ``configs/sol_rl/``) scores a
low-precision pool of candidates per prompt and keeps a contrastive subset
(:func:`select_candidates`: the best and the worst, or a random subset, or all); how well the
preview ranks the kept samples against their full-precision regeneration is
:func:`ranking_fidelity`. The strategy is :mod:`genalign.trainers.strategies.sol_rl`.
"""

from __future__ import annotations

import math

import torch

__all__ = ["ranking_fidelity", "select_candidates"]


def select_candidates(
    rewards: torch.Tensor,
    selection: str,
    keep_top: int,
    keep_bottom: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pool positions kept for each prompt: ``rewards [P, N] -> [P, K]``.

    ``best_worst``: the ``keep_top`` highest rewards (best first) then the ``keep_bottom`` lowest
    (worst first), disjoint even under ties; ``random``: ``keep_top + keep_bottom`` positions drawn
    from ``generator``; ``all``: ``0 .. N-1``. NaN rewards rank below every number.
    """
    prompts, pool = rewards.shape
    if selection == "all":
        return torch.arange(pool).expand(prompts, -1).clone()
    kept = keep_top + keep_bottom
    if kept > pool:
        raise ValueError(f"cannot keep {kept} of a pool of {pool}")
    if selection == "random":
        return torch.stack([torch.randperm(pool, generator=generator)[:kept] for _ in range(prompts)])
    if selection != "best_worst":
        raise ValueError(f"unknown selection {selection!r}; choose best_worst, random or all")
    ranked = torch.nan_to_num(rewards.float(), nan=-math.inf)
    order = torch.argsort(ranked, dim=1, descending=True, stable=True)  # best first
    best = order[:, :keep_top]
    worst = order[:, pool - keep_bottom :].flip(1) if keep_bottom else order[:, :0]
    return torch.cat([best, worst], dim=1)


def ranking_fidelity(preview: torch.Tensor, final: torch.Tensor, top_k: int) -> dict[str, float]:
    """Agreement of two rankings of the same samples, per prompt (rows) and averaged.

    Returns Kendall's tau-b and Spearman's rho (``scipy.stats``; prompts whose rewards are all
    tied are left out) and the top-k hit rate: the fraction of the preview's k best that are among
    the final k best.
    """
    from scipy import stats

    taus, rhos, hits = [], [], []
    for p, f in zip(preview.double().numpy(), final.double().numpy()):
        if len(p) >= 2 and p.min() < p.max() and f.min() < f.max():  # all tied: undefined, left out
            tau = stats.kendalltau(p, f).statistic
            rho = stats.spearmanr(p, f).statistic
            if math.isfinite(tau):
                taus.append(float(tau))
            if math.isfinite(rho):
                rhos.append(float(rho))
        k = min(top_k, len(p))
        if k > 0:
            top_preview = set(torch.tensor(p).argsort(descending=True, stable=True)[:k].tolist())
            top_final = set(torch.tensor(f).argsort(descending=True, stable=True)[:k].tolist())
            hits.append(len(top_preview & top_final) / k)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else float("nan")

    return {"kendall_tau": mean(taus), "spearman_rho": mean(rhos), "top_k_hit_rate": mean(hits)}
