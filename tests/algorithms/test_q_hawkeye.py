"""Q-Hawkeye's math (#27 items 1-3) against hand-computed values: the three reward terms, score
parsing of malformed answers, uncertainty-aware advantages, the perception k3 and gamma's annealing."""

from __future__ import annotations

import math

import pytest
import torch

from genalign.algorithms import (
    accuracy_reward,
    answer_digit_places,
    cosine_annealed,
    format_reward,
    parse_answer_score,
    perception_k3,
    perception_row_scale,
    perception_term,
    repetition_penalty,
    score_uncertainty_weights,
    uncertainty_aware_advantages,
)
from genalign.algorithms.schedules import learning_rate_factor

GOOD = "<think>sharp edges, no noise</think><answer>3.50</answer>"


# -- parsing ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "unsigned", "signed"),
    [
        (GOOD, 3.5, 3.5),
        ("<ANSWER> 4 </ANSWER>", 4.0, 4.0),  # case-insensitive, spaces allowed
        ("no tag at all 4.2", None, None),
        ("<answer>abc</answer>", None, None),  # not a number
        ("<answer>3.4.5</answer>", None, None),  # digits and dots, but not a float
        ("<answer>-2</answer>", None, -2.0),  # the accuracy parser takes no sign; UA-GRPO's does
        ("<answer>7.25</answer>", 7.25, 7.25),  # out of range: returned as is, callers clamp
        ("<answer>3.5", None, None),  # unclosed
        ("<answer>2</answer><answer>4</answer>", 2.0, 2.0),  # the first answer
    ],
)
def test_parse_answer_score(text, unsigned, signed):
    assert parse_answer_score(text) == unsigned
    assert parse_answer_score(text, signed=True) == signed


@pytest.mark.parametrize(
    ("text", "digits", "places"),
    [
        (GOOD, "350", [1.0, 0.1, 0.01]),
        ("<ANSWER> 4 </ANSWER>", "4", [1.0]),
        ("x<answer>12.5</answer>", "125", [10.0, 1.0, 0.1]),
        ("<answer>3.</answer>", "3", [1.0]),
        ("<answer>.25</answer>", "25", [0.1, 0.01]),
        ("<answer>2</answer><answer>4</answer>", "2", [1.0]),  # the first answer, as the parser
    ],
)
def test_answer_digit_places(text, digits, places):
    found = answer_digit_places(text)
    assert "".join(text[offset] for offset, _ in found) == digits
    assert [place for _, place in found] == pytest.approx(places)
    # the digits at their places add up to the parsed number
    assert sum(int(text[o]) * p for o, p in found) == pytest.approx(parse_answer_score(text))


@pytest.mark.parametrize(
    "text", ["no tag 4.2", "<answer>3.4.5</answer>", "<answer>-2</answer>", "<answer>x</answer>"]
)
def test_answer_digit_places_is_none_where_nothing_parses(text):
    assert answer_digit_places(text) is None


# -- accuracy -----------------------------------------------------------------------------------------


def test_accuracy_is_exp_of_the_clamped_error_over_tau():
    assert accuracy_reward(GOOD, 3.2) == pytest.approx(math.exp(-0.3 / 0.3))
    assert accuracy_reward(GOOD, 3.5) == pytest.approx(1.0)
    # both sides clamped to [1, 5]: 7 -> 5 against 5; 0.2 -> 1 against 1.6; 4.7 against 6 -> 5
    assert accuracy_reward("<answer>7</answer>", 5.0) == pytest.approx(1.0)
    assert accuracy_reward("<answer>0.2</answer>", 1.6) == pytest.approx(math.exp(-0.6 / 0.3))
    assert accuracy_reward("<answer>4.7</answer>", 6.0) == pytest.approx(math.exp(-0.3 / 0.3))
    assert accuracy_reward("<answer>2</answer>", 3.0, tau=0.5) == pytest.approx(math.exp(-2.0))


@pytest.mark.parametrize(
    "text", ["", "4.0", "<answer>x</answer>", "<answer>-3</answer>", "<answer>1..</answer>"]
)
def test_unparsable_answers_get_the_accuracy_floor(text):
    assert accuracy_reward(text, 3.0) == 0.0


def test_a_nonfinite_true_score_gets_the_floor_and_tau_must_be_positive():
    assert accuracy_reward(GOOD, float("nan")) == 0.0
    with pytest.raises(ValueError, match="tau"):
        accuracy_reward(GOOD, 3.0, tau=0.0)


# -- format -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD, 0.8),
        ("  <think>\nblur on the edges\n</think>\n<answer> 3.75 </answer>\n", 0.8),  # spaces and newlines
        ("<think> </think><answer>3</answer>", 0.8),  # the official regex accepts a blank think
        ("<think></think><answer>3</answer>", 0.0),  # but not an empty one
        ("<answer>3.75</answer>", 0.0),  # no think
        ("<think>ok</think>", 0.0),  # no answer
        ("<think>ok</think><answer>3.75 points</answer>", 0.0),  # words in the answer
        ("<think>ok</think><answer>3.75</answer> done", 0.0),  # text after the answer
        ("intro <think>ok</think><answer>3.75</answer>", 0.0),  # text before the think
        ("<think>ok</think><answer>3</answer><answer>4</answer>", 0.0),  # two answers
        ("<think>ok</think><answer>-3</answer>", 0.0),  # a sign is not a digit or dot
        ("<think>ok</think><answer>3.4.5</answer>", 0.8),  # digits and dots, as the official regex
    ],
)
def test_format_reward(text, expected):
    assert format_reward(text) == expected


# -- repetition ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD, 0.0),  # the answer "3.50" -> "350": nothing repeats
        ("a a a a a", 0.0),  # 'a' five times: not more than 5
        ("aaaaaa", -1.5),  # the character 'a' occurs 6 times: -0.25 * 6
        ("xxxxxx y", -1.5),  # words: none; characters: 'x' x 6
        ("<think>bla</think><answer>1111111</answer>", -1.75),  # the answer only: '1' x 7
        ("<think>aaaaaaaaaaaaaa</think><answer>3</answer>", 0.0),  # the think is not penalised
        ("go go go go go go", -2.0),  # words 6 + chars g 6, o 6 = 18 occurrences: -4.5 floored at -2
        ("a, a. a! a? a; a", -2.0),  # punctuation removed: 'a' x 6 as a word and a char, ' ' x 5: -3
        ("", 0.0),
    ],
)
def test_repetition_penalty(text, expected):
    assert repetition_penalty(text) == pytest.approx(expected)


def test_repetition_penalty_floor_and_scale_are_options():
    assert repetition_penalty("go go go go go go", floor=-10.0) == pytest.approx(-4.5)
    assert repetition_penalty("aaaaaa", scale=0.3) == pytest.approx(-1.8)


# -- uncertainty-aware advantages ---------------------------------------------------------------------


def test_uncertainty_aware_advantages_against_a_hand_computation():
    rewards = torch.tensor([1.0, 2.0, 4.0, 5.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    nan = float("nan")
    scores = torch.tensor([2.0, 4.0, nan, 4.0, 1.0, nan, nan, nan, 7.0, 0.0, 7.0, 0.0])
    advantages = uncertainty_aware_advantages(rewards, groups, scores)

    # group 0: mean 3, unbiased std sqrt(10 / 3); parsed scores 2, 4, 4: population variance 8 / 9
    std = math.sqrt(10 / 3)
    w0 = math.exp(-0.2 * (8 / 9) / 4)
    expected0 = [(r - 3) / (std + 1e-4) * w0 for r in (1, 2, 4, 5)]
    # group 1: equal rewards -> 0 (one parsed score: weight 1)
    # group 2: mean 0.5, unbiased std sqrt(1 / 3); scores clamped to 5, 1, 5, 1: variance 4 -> u = 1
    w2 = math.exp(-0.2)
    expected2 = [(r - 0.5) / (math.sqrt(1 / 3) + 1e-4) * w2 for r in (1, 0, 1, 0)]
    expected = torch.tensor(expected0 + [0.0] * 4 + expected2)
    torch.testing.assert_close(advantages, expected, rtol=1e-6, atol=1e-6)

    weights = score_uncertainty_weights(scores, groups)
    torch.testing.assert_close(weights, torch.tensor([w0] * 4 + [1.0] * 4 + [w2] * 4), rtol=1e-6, atol=1e-6)
    # without scores: plain GRPO advantages with the unbiased std
    plain = uncertainty_aware_advantages(rewards, groups)
    torch.testing.assert_close(plain[:4], torch.tensor(expected0) / w0, rtol=1e-6, atol=1e-6)


def test_uncertainty_weights_match_the_iqa_rewards_helper():
    from genalign.rewards.iqa import uncertainty_weights

    scores = torch.tensor([1.0, 2.5, 4.0, 4.5])
    ours = score_uncertainty_weights(scores, torch.zeros(4, dtype=torch.long), alpha=0.3)
    theirs = uncertainty_weights(scores.var(unbiased=False), alpha=0.3)
    torch.testing.assert_close(ours, theirs.expand(4))


def test_weights_lie_in_exp_minus_alpha_to_one():
    scores = torch.rand(64) * 8 - 2
    groups = torch.arange(16).repeat_interleave(4)
    weights = score_uncertainty_weights(scores, groups, alpha=0.2)
    assert bool(((weights >= math.exp(-0.2) - 1e-7) & (weights <= 1.0)).all())


# -- perception term ----------------------------------------------------------------------------------


def test_perception_k3_against_a_per_token_loop_with_padding_and_the_clamp():
    log_probs = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, -1.5]], requires_grad=True)
    degraded = torch.tensor([[-1.5, 3.0, -9.0], [-0.1, -6.0, 20.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    gamma = 1e-4
    term, mean = perception_term(log_probs, degraded, mask, gamma)

    values, count = [], 0
    lp, dg = log_probs.detach(), degraded.detach()
    for i in range(2):
        for t in range(3):
            if not mask[i, t]:
                continue
            d = max(-20.0, min(20.0, float(dg[i, t] - lp[i, t])))
            values.append(max(-10.0, min(10.0, math.exp(d) - d - 1)))
            count += 1
    # d = 5 (exp(5) - 6 = 142.4) and d = 21.5 -> 20 are clamped to 10; padding (row 0, t 2) is skipped
    assert values[1] == 10.0 and values[-1] == 10.0 and count == 5
    assert float(mean) == pytest.approx(sum(values) / count, rel=1e-6)
    assert float(term.detach()) == pytest.approx(-gamma * sum(values) / count, rel=1e-6)

    term.backward()
    assert degraded.grad is None  # the degraded re-scoring is a constant
    # d/dlogp of -gamma/5 * (exp(d) - d - 1) = -gamma/5 * (1 - exp(d)); 0 where clamped or padded
    expected = torch.zeros(2, 3)
    for i, t in [(0, 0), (1, 0), (1, 1)]:
        d = float(dg[i, t] - lp[i, t])
        expected[i, t] = -gamma / count * (1 - math.exp(d))
    torch.testing.assert_close(log_probs.grad, expected, rtol=1e-5, atol=1e-12)


def test_perception_term_is_zero_for_equal_distributions_and_pushes_them_apart():
    log_probs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    term, mean = perception_term(log_probs, log_probs.detach().clone(), torch.ones(1, 2), 1.0)
    assert term.item() == 0.0 and mean.item() == 0.0
    # with the degraded log-probs higher, the gradient step lowers log p_orig further (apart)
    term, _ = perception_term(log_probs, log_probs.detach() + 0.5, torch.ones(1, 2), 1.0)
    term.backward()
    assert bool((log_probs.grad > 0).all())  # descent moves log p_orig down, away from log p_deg
    assert float(perception_k3(torch.zeros(1), torch.full((1,), 30.0), clamp=10.0)) == 10.0


def test_the_perception_term_averages_per_image_over_any_minibatch_split():
    """The official trainer token-averages k3 over one image's G completions (its device batch) and
    then averages over images. Minibatches that mix images, with completions of different lengths,
    must give the same total: the token mean of a mixed minibatch weighted long completions' images
    more (5.5x off in the review's case of 10- and 100-token completions)."""
    generator = torch.Generator().manual_seed(0)
    groups, size, length = 3, 4, 12
    log_probs = -torch.rand(groups * size, length, generator=generator) * 3
    spread = torch.tensor([1.0, 0.1, 1.0]).repeat_interleave(size)[:, None]  # image 1: near-equal views
    degraded = log_probs - spread * torch.randn(groups * size, length, generator=generator)
    lengths = torch.tensor([2, 3, 2, 2, 12, 11, 12, 10, 5, 1, 7, 6])  # image 1's completions are long
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    group_ids = torch.arange(groups).repeat_interleave(size)

    per_image = []
    for g in range(groups):
        rows = group_ids == g
        k3 = [
            math.exp(d) - d - 1
            for i in rows.nonzero().flatten().tolist()
            for d in (degraded[i, : lengths[i]] - log_probs[i, : lengths[i]]).tolist()
        ]
        per_image.append(sum(min(v, 10.0) for v in k3) / len(k3))
    official = sum(per_image) / groups

    scale = perception_row_scale(mask.sum(dim=1), group_ids)
    assert scale.tolist() == pytest.approx([4 / 9] * 4 + [4 / 45] * 4 + [4 / 19] * 4)
    _, whole = perception_term(log_probs, degraded, mask, 1.0, row_scale=scale)
    assert float(whole) == pytest.approx(official, rel=1e-6)
    # three minibatches of four rows, each mixing the images: their mean is the official number
    order = torch.tensor([0, 5, 10, 7, 4, 1, 9, 11, 2, 3, 6, 8])
    parts = [
        perception_term(log_probs[r], degraded[r], mask[r], 1.0, row_scale=scale[r])[1]
        for r in order.split(4)
    ]
    assert float(sum(parts) / 3) == pytest.approx(official, rel=1e-6)
    # the token mean over the mixed minibatches is not the official number
    unscaled = [perception_term(log_probs[r], degraded[r], mask[r], 1.0)[1] for r in order.split(4)]
    assert abs(float(sum(unscaled) / 3) - official) > 0.2 * official
    # one whole group: the two means agree
    rows = group_ids == 1
    assert float(perception_term(log_probs[rows], degraded[rows], mask[rows], 1.0)[1]) == pytest.approx(
        float(perception_term(log_probs[rows], degraded[rows], mask[rows], 1.0, row_scale=scale[rows])[1]),
        rel=1e-6,
    )


def test_perception_term_checks_shapes():
    with pytest.raises(ValueError, match="one \\[B, L\\] shape"):
        perception_term(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 2), 1.0)


# -- gamma's annealing and the cosine learning rate ---------------------------------------------------


def test_gamma_is_cosine_annealed_to_zero():
    assert cosine_annealed(1e-4, 0, 10) == pytest.approx(1e-4)
    assert cosine_annealed(1e-4, 5, 10) == pytest.approx(5e-5)
    assert cosine_annealed(1e-4, 2.5, 10) == pytest.approx(1e-4 * (1 + math.cos(math.pi / 4)) / 2)
    assert cosine_annealed(1e-4, 10, 10) == pytest.approx(0.0, abs=1e-20)
    assert cosine_annealed(1e-4, 12, 10) == pytest.approx(0.0, abs=1e-20)
    assert cosine_annealed(1e-4, 7, 0) == 1e-4  # no horizon: constant, as the official zero_epoch 0


def test_cosine_learning_rate_with_warmup():
    factor = [learning_rate_factor(n, 2, "cosine", 12) for n in (0, 1, 2, 7, 12, 20)]
    assert factor == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0, 0.0], abs=1e-12)
    with pytest.raises(ValueError, match="decay_steps"):
        learning_rate_factor(0, 0, "cosine", None)
