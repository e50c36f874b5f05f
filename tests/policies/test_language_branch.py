"""Greedy answers and one-token branches off them (genalign.policies.language_branch) on the tiny
Qwen2 LM, each token checked against a forward pass over the bare sequence."""

from __future__ import annotations

import pytest
import torch

from genalign.policies import LanguagePolicy
from genalign.policies.language_branch import BranchSampler, branch_positions
from genalign.tiny.language import qwen2_lm

PROMPTS = ["a red circle", "two big blue squares to the left of a green triangle"]
TEMPERATURE = 1.1


@pytest.fixture(scope="module")
def policy():
    model, tokenizer = qwen2_lm(seed=0)
    return LanguagePolicy(model, tokenizer, lora=None, train=False)


def bare_logits(policy, trajectory, row: int, upto: int) -> torch.Tensor:
    """The logits predicting completion token ``upto`` of ``row``, from a forward over the prompt
    and the completion's first ``upto`` tokens without padding or masks."""
    prompt = trajectory.input_ids[row, : trajectory.prompt_length]
    prompt = prompt[trajectory.attention_mask[row, : trajectory.prompt_length].bool()]
    sequence = torch.cat([prompt, trajectory.completion_ids[row, :upto]])[None]
    with torch.no_grad():
        return policy.model(input_ids=sequence).logits[0, -1].float()


def greedy(policy, prompts, **kwargs):
    return policy.rollout(
        prompts,
        seeds=torch.zeros(len(prompts), dtype=torch.long),
        temperature=TEMPERATURE,
        max_new_tokens=10,
        sampler=BranchSampler(),
        **kwargs,
    )


def test_without_a_reference_every_token_is_the_argmax(policy):
    answers = greedy(policy, PROMPTS)
    for row in range(len(PROMPTS)):
        for t in range(int(answers.completion_mask[row].sum())):
            assert answers.completion_ids[row, t] == bare_logits(policy, answers, row, t).argmax()
    # the log-probs are still recomputed at the sampling temperature (on-policy ratio 1)
    torch.testing.assert_close(policy.log_prob(answers), answers.log_probs, rtol=0, atol=0)


def test_a_branch_copies_the_prefix_draws_another_token_and_finishes_greedily(policy):
    answers = greedy(policy, PROMPTS)
    positions = torch.tensor([0, 3])
    seeds = torch.tensor([11, 12])
    branches = policy.rollout(
        PROMPTS,
        seeds=seeds,
        temperature=TEMPERATURE,
        max_new_tokens=10,
        sampler=BranchSampler(answers.completion_ids, positions, TEMPERATURE),
    )
    for row, position in enumerate(positions.tolist()):
        ids = branches.completion_ids[row]
        assert torch.equal(ids[:position], answers.completion_ids[row, :position])
        # the branch token: a Gumbel-max draw from softmax(logits / T) without the greedy token,
        # from the row's own generator (seeded by its seed, as every rollout's)
        logits = bare_logits(policy, branches, row, position) / TEMPERATURE
        logits[answers.completion_ids[row, position]] = float("-inf")
        uniform = torch.rand(logits.shape[0], generator=torch.Generator().manual_seed(int(seeds[row])))
        gumbel = -torch.log(-torch.log(uniform.clamp(min=1e-20, max=1.0 - 1e-7)))
        assert ids[position] == torch.argmax(logits + gumbel)
        assert ids[position] != answers.completion_ids[row, position]
        for t in range(position + 1, int(branches.completion_mask[row].sum())):
            assert ids[t] == bare_logits(policy, branches, row, t).argmax()
    torch.testing.assert_close(policy.log_prob(branches), branches.log_probs, rtol=0, atol=0)


def test_position_minus_one_is_the_greedy_answer(policy):
    answers = greedy(policy, PROMPTS)
    same = policy.rollout(
        PROMPTS,
        seeds=torch.tensor([5, 6]),
        temperature=TEMPERATURE,
        max_new_tokens=10,
        sampler=BranchSampler(answers.completion_ids, torch.tensor([-1, -1]), TEMPERATURE),
    )
    assert torch.equal(same.completion_ids, answers.completion_ids)


def test_branch_positions_follow_the_alternatives_mass():
    # p(greedy token) = 0.5, 0.75, 1.0 (never branched at), then a masked position
    log_probs = torch.log(torch.tensor([[0.5, 0.75, 1.0, 0.1]])).repeat(4000, 1)
    mask = torch.tensor([[1, 1, 1, 0]]).repeat(4000, 1)
    positions = branch_positions(log_probs, mask, torch.arange(4000))
    share = torch.bincount(positions, minlength=4).float() / 4000
    torch.testing.assert_close(share, torch.tensor([2 / 3, 1 / 3, 0.0, 0.0]), atol=0.03, rtol=0)
    assert torch.equal(positions, branch_positions(log_probs, mask, torch.arange(4000)))  # seeded
    # every token certain: uniform over the mask; an empty row: -1
    certain = branch_positions(torch.zeros(3000, 2), torch.ones(3000, 2), torch.arange(3000))
    assert abs(float(certain.float().mean()) - 0.5) < 0.04
    assert branch_positions(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([0])).tolist() == [-1]


def test_the_sampler_refuses_half_a_reference():
    with pytest.raises(ValueError, match="both reference and positions"):
        BranchSampler(torch.zeros(1, 2, dtype=torch.long), None)
    with pytest.raises(ValueError, match="temperature must be positive"):
        BranchSampler(temperature=0.0)
