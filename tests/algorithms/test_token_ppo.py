"""token_ppo_loss against an independent per-token loop, and its aggregations by hand."""

from __future__ import annotations

import math

import pytest
import torch

from genalign.algorithms.token_ppo import aggregate_tokens, token_ppo_loss


def _reference(new, old, adv, mask, low, high, ref, beta, aggregation, max_tokens=None):
    """The same loss written token by token with floats (GRPO eq. 3 with DAPO's clip-higher)."""
    batch, length = len(new), len(new[0])
    per_sequence, total, count = [], 0.0, 0
    for i in range(batch):
        terms = []
        for t in range(length):
            if not mask[i][t]:
                continue
            rho = math.exp(new[i][t] - old[i][t])
            clipped = min(max(rho, 1 - low), 1 + high)
            term = max(-adv[i] * rho, -adv[i] * clipped)
            if beta:
                r = math.exp(ref[i][t] - new[i][t])
                term += beta * (r - 1 - math.log(r))
            terms.append(term)
        per_sequence.append(sum(terms) / len(terms) if terms else 0.0)
        total += sum(terms)
        count += len(terms)
    if aggregation == "sequence_mean":
        return sum(per_sequence) / batch
    if aggregation == "token_mean":
        return total / count
    return total / (batch * (max_tokens or length))


@pytest.mark.parametrize("aggregation", ["sequence_mean", "token_mean", "constant"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_matches_a_token_loop(aggregation, beta):
    gen = torch.Generator().manual_seed(0)
    batch, length = 4, 7
    new = torch.randn(batch, length, generator=gen) * 0.3 - 2.0
    old = new + torch.randn(batch, length, generator=gen) * 0.3  # ratios well outside [0.8, 1.28]
    ref = new + torch.randn(batch, length, generator=gen) * 0.2
    adv = torch.tensor([1.5, -0.7, 0.0, -2.0])
    mask = torch.ones(batch, length)
    mask[0, :3] = 0  # prompt tokens
    mask[1, 5:] = 0  # padding after EOS
    mask[3, :] = 0
    mask[3, 2] = 1  # a one-token completion
    loss, info = token_ppo_loss(
        new,
        old,
        adv,
        mask,
        (0.2, 0.28),
        ref_log_probs=ref,
        kl_coef=beta,
        aggregation=aggregation,
        max_tokens=9,
    )
    expected = _reference(
        new.tolist(),
        old.tolist(),
        adv.tolist(),
        mask.bool().tolist(),
        0.2,
        0.28,
        ref.tolist(),
        beta,
        aggregation,
        9,
    )
    assert float(loss) == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert 0 < float(info["clipfrac"]) < 1 and float(info["kl"]) > 0


def test_on_policy_gradient_is_the_advantage_weighted_score():
    # first pass over fresh rollouts: old == new, ratio 1, and d loss / d logp_t = -A_i / n_i
    new = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, info = token_ppo_loss(new, new.detach(), torch.tensor([2.0, -1.0]), mask)
    loss.backward()
    assert float(info["ratio"]) == 1.0 and float(info["clipfrac"]) == 0.0
    expected = torch.tensor([[-2 / 2, -2 / 2, 0.0], [1 / 3, 1 / 3, 1 / 3]]) / 2  # mean over 2 sequences
    assert torch.allclose(new.grad, expected)


def test_aggregations_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert float(aggregate_tokens(values, mask, "sequence_mean")) == pytest.approx((2.0 + 4.0) / 2)
    assert float(aggregate_tokens(values, mask, "token_mean")) == pytest.approx(10.0 / 4)
    assert float(aggregate_tokens(values, mask, "constant")) == pytest.approx(10.0 / 6)
    assert float(aggregate_tokens(values, mask, "constant", max_tokens=5)) == pytest.approx(10.0 / 10)


def test_bad_input_says_what_is_wrong():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="ref_log_probs"):
        token_ppo_loss(x, x, torch.zeros(2), torch.ones(2, 3), kl_coef=0.1)
    with pytest.raises(ValueError, match="advantages"):
        token_ppo_loss(x, x, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="aggregation"):
        aggregate_tokens(x, torch.ones(2, 3), "sum")
    with pytest.raises(ValueError, match="clip_range"):
        token_ppo_loss(x, x, torch.zeros(2), torch.ones(2, 3), clip_range=1.5)
