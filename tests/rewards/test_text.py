"""The verifiable text rewards: scores by hand, batch equals one at a time, bad input."""

from __future__ import annotations

import pytest
import torch

from genalign.rewards import load_reward

TEXTS = ["a red circle, Red!", "", "blue and green", "red red red red red"]


def test_keyword_count_and_fraction_by_hand():
    count = load_reward("keyword", keywords=["red"], mode="count", cap=2)
    out = count(TEXTS, ["p"] * 4)
    assert out.scores.tolist() == [1.0, 0.0, 0.0, 1.0]  # min(2, 2) / 2, 0, 0, min(5, 2) / 2
    assert out.details["keyword_hits"].tolist() == [2.0, 0.0, 0.0, 5.0]
    fraction = load_reward("keyword", keywords=["red", "green", "circle"], mode="fraction")
    assert fraction(TEXTS).scores.tolist() == pytest.approx([2 / 3, 0.0, 1 / 3, 1 / 3])
    sensitive = load_reward("keyword", keywords=["Red"], mode="count", cap=1, case_sensitive=True)
    assert sensitive(TEXTS).scores.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_text_length_by_hand():
    reward = load_reward("text_length", target=10)
    out = reward(["x" * 10, "", "x" * 15, "x" * 40])
    assert out.scores.tolist() == [1.0, 0.0, 0.5, -1.0]  # floored at -1
    words = load_reward("text_length", target=2, unit="words")
    assert words(["one two", "one", "a b c d"]).scores.tolist() == [1.0, 0.5, 0.0]


@pytest.mark.parametrize("name", ["keyword", "text_length"])
def test_batch_equals_one_at_a_time(name):
    reward = load_reward(name)
    batch = reward(TEXTS, ["p"] * len(TEXTS)).scores
    single = torch.cat([reward([text], ["p"]).scores for text in TEXTS])
    assert torch.equal(batch, single) and batch.dtype == torch.float32
    assert not reward.differentiable and reward.input_kind == "text"


def test_bad_input_is_refused_with_a_message():
    reward = load_reward("keyword")
    with pytest.raises(ValueError, match="list of strings"):
        reward("a single string")
    with pytest.raises(ValueError, match="2 texts but 1 prompts"):
        reward(["a", "b"], ["only one prompt"])
    with pytest.raises(ValueError, match="keywords"):
        load_reward("keyword", keywords=[])
    with pytest.raises(ValueError, match="target"):
        load_reward("text_length", target=0)


def test_iqa_answer_sums_the_three_terms_and_logs_each():
    import math

    reward = load_reward("iqa_answer")
    texts = ["<think>ok</think><answer>3.50</answer>", "no answer", "aaaaaa <answer>9</answer>"]
    out = reward(texts, ["q"] * 3, mos=torch.tensor([3.2, 4.0, 5.0]))
    # accuracy e^-1 + format 0.8; nothing; accuracy 1 (9 -> 5) + repetition 0 (the answer "9" only)
    torch.testing.assert_close(out.scores, torch.tensor([math.exp(-1) + 0.8, 0.0, 1.0]))
    torch.testing.assert_close(out.details["format"], torch.tensor([0.8, 0.0, 0.0]))
    assert out.details["unparsed_count"] == 1 and math.isnan(float(out.details["parsed_score"][1]))
    assert out.details["accuracy_mean"] == pytest.approx((math.exp(-1) + 1.0) / 3)
    weighted = load_reward("iqa_answer", weights={"format": 0.0})
    assert float(weighted(texts[:1], ["q"], mos=[3.2]).scores[0]) == pytest.approx(math.exp(-1))
    with pytest.raises(ValueError, match="needs metadata 'mos'"):
        reward(texts, ["q"] * 3)
    with pytest.raises(ValueError, match="unknown terms"):
        load_reward("iqa_answer", weights={"fmt": 1.0})
