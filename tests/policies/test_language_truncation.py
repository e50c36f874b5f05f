"""Top-k / top-p sampling of the language family: the tokens come from the truncated distribution,
and every recorded and recomputed log-prob is taken under that same truncation (so the first PPO
ratio is still 1, and the trainer replays it); the recipe keys and their refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from genalign.algorithms import truncation_mask
from genalign.config import ConfigError
from genalign.policies import TokenTrajectory
from genalign.trainers import build_trainer, load_recipe

from .test_language import PROMPTS, bare_logits, lm_policy, perturb_lora

ROOT = Path(__file__).resolve().parents[2]


def independent_truncated_log_probs(model, trajectory: TokenTrajectory) -> list[torch.Tensor]:
    """Per sample, on the bare sequence: the tempered logits of each position, the kept set (the
    mask itself is checked against the definitions in tests/algorithms/test_token_truncation.py)
    with the completion token put back, and the log-prob renormalised over it, in float64."""
    settings = trajectory.settings
    out = []
    for logits, tokens in bare_logits(model, trajectory):
        values = []
        for row, token in zip((logits.double() / settings.temperature).numpy(), tokens.tolist(), strict=True):
            keep = truncation_mask(torch.from_numpy(row), settings.top_k, settings.top_p).numpy()
            keep[token] = True
            kept = row[keep]
            values.append(row[token] - (kept.max() + np.log(np.exp(kept - kept.max()).sum())))
        out.append(torch.tensor(values))
    return out


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_recorded_log_probs_are_the_truncated_distributions_and_the_ratio_is_one(lora):
    policy = lm_policy(lora=lora)
    if lora:
        perturb_lora(policy)
    trajectory = policy.rollout(
        PROMPTS, group_size=3, generator=0, max_new_tokens=10, temperature=1.3, top_k=20, top_p=0.8
    )
    assert (trajectory.settings.top_k, trajectory.settings.top_p) == (20, 0.8)
    log_probs = policy.log_prob(trajectory)
    assert log_probs.requires_grad
    assert torch.equal(log_probs.detach(), trajectory.log_probs)  # the first PPO ratio is exactly 1
    expected = independent_truncated_log_probs(policy.model, trajectory)
    for b, values in enumerate(expected):
        count = len(values)
        torch.testing.assert_close(trajectory.log_probs[b, :count].double(), values, atol=2e-5, rtol=0)
    # truncation renormalises: the same tokens score higher than under the full tempered softmax
    full = policy.token_log_probs(
        trajectory.input_ids, trajectory.attention_mask, trajectory.completion_mask, 1.3
    ).detach()
    mask = trajectory.completion_mask.bool()
    assert (trajectory.log_probs[mask] >= full[mask] - 1e-6).all() and (
        trajectory.log_probs[mask] > full[mask]
    ).any()
    with torch.no_grad(), policy.reference():  # the reference is scored under the same truncation
        reference = policy.log_prob(trajectory)
    if not lora:
        assert torch.equal(reference, trajectory.log_probs)  # the frozen copy equals the start: KL 0


def test_top_k_one_is_greedy_at_any_temperature():
    policy = lm_policy(lora=False)
    hot = policy.rollout(PROMPTS, group_size=2, generator=3, max_new_tokens=8, temperature=5.0, top_k=1)
    greedy = policy.rollout(PROMPTS, group_size=2, generator=3, max_new_tokens=8, temperature=1e-4)
    assert hot.completions == greedy.completions
    assert hot.completions[0] == hot.completions[1]  # every seed draws the one kept token
    assert torch.equal(hot.log_probs, torch.zeros_like(hot.log_probs))  # probability 1 after truncation


def test_sampled_first_tokens_follow_the_truncated_distribution():
    policy = lm_policy(lora=False)
    draws = 3000
    trajectory = policy.rollout(
        ["a red circle"], group_size=draws, generator=1, max_new_tokens=1, temperature=2.0, top_k=8, top_p=0.6
    )
    tokens = trajectory.completion_ids[:, 0]
    with torch.no_grad():
        prompt = trajectory.input_ids[0, : trajectory.prompt_length]
        prompt = prompt[trajectory.attention_mask[0, : trajectory.prompt_length].bool()]
        row = (policy.model(input_ids=prompt[None]).logits[0, -1].double() / 2.0).numpy()
    keep = truncation_mask(torch.from_numpy(row), 8, 0.6).numpy()
    assert 1 < keep.sum() < 8  # the check truncates on both rules
    probs = np.where(keep, np.exp(row - row[keep].max()), 0.0)
    probs /= probs.sum()
    counts = np.bincount(tokens.numpy(), minlength=len(row))
    assert counts[~keep].sum() == 0  # nothing outside the kept set is ever drawn
    expected = probs[keep] * draws
    chi2 = (((counts[keep] - expected) ** 2) / expected).sum()
    assert chi2 < 25, (counts[keep], expected)  # df <= 6: p < 0.001 above 22.5


def test_without_truncation_the_rollout_is_unchanged():
    policy = lm_policy(lora=False)
    plain = policy.rollout(PROMPTS, group_size=2, generator=4, max_new_tokens=8, temperature=0.9)
    full_p = policy.rollout(PROMPTS, group_size=2, generator=4, max_new_tokens=8, temperature=0.9, top_p=1.0)
    assert full_p.settings.top_p is None and full_p.completions == plain.completions
    assert torch.equal(full_p.log_probs, plain.log_probs)


def test_bad_truncation_arguments_are_refused():
    from genalign.policies.language_branch import BranchSampler

    policy = lm_policy(lora=False)
    with pytest.raises(ValueError, match="top_k"):
        policy.rollout(PROMPTS, top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        policy.rollout(PROMPTS, top_p=1.2)
    with pytest.raises(ValueError, match="custom sampler"):
        policy.rollout(PROMPTS, top_p=0.9, sampler=BranchSampler())


def _recipe(tmp_path: Path, recipe: str, *overrides: str):
    path = ROOT / "configs" / "toy" / recipe
    return path, load_recipe(path, [f"logging.run_dir={tmp_path}/run", "logging.progress=false", *overrides])


def test_the_trainer_samples_and_rescores_under_the_recipes_truncation(tmp_path, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path / "tiny-cache"))
    path, config = _recipe(
        tmp_path, "grpo_language.yaml", "sampling.language.top_k=30", "sampling.language.top_p=0.85"
    )
    trainer = build_trainer(config, base_dir=path.parent)
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    assert (batch.trajectory.settings.top_k, batch.trajectory.settings.top_p) == (30, 0.85)
    _, info = trainer.loss(
        trainer.policy, batch.trajectory, torch.zeros(batch.trajectory.batch_size), batch.advantages
    )
    assert info["ratio"].item() == 1.0 and info["clipfrac"].item() == 0.0 and info["kl"].item() == 0.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["sampling.language.top_k=0"], "sampling.language.top_k must be a positive integer"),
        (["sampling.language.top_p=1.5"], r"sampling.language.top_p must be in \(0, 1\]"),
        (
            ["sampling.language.top_p=0.9", "train.svg.rollout=branch"],
            "rollout 'branch' draws its own tokens",
        ),
    ],
)
def test_recipe_refusals_name_the_key(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        _recipe(tmp_path, "rlrf_text2svg.yaml", *overrides)
