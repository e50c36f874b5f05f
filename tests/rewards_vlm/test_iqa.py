"""``iqa`` (Q-Align, Q-Boost, sampled ratings) and the Q-Hawkeye weights against hand computations."""

from __future__ import annotations

import json
import math

import pytest
import torch

from genalign.rewards import load_reward
from genalign.rewards.iqa import (
    QBOOST_PROMPTS,
    VLMQualityReward,
    rollout_variance,
    uncertainty_weights,
)
from genalign.tiny.language import llava_vlm

from . import chat_text, last_logits, token_ids, uint8_images

QALIGN_QUESTION = "How would you rate the quality of this image?"
QALIGN_PREFIX = "The quality of the image is"
# How the tiny BPE spells the rating words' forms ("w" and " w"): a word with a single-token form
# uses those; a word that is never one token uses the first piece of each form.
QALIGN_PIECES = {
    "excellent": (["ex", "Ġex"], 5.0),  # ex+cellent, Ġex+cellent
    "good": (["Ġgood"], 4.0),  # g+ood is split, " good" is one token
    "fair": (["fair", "Ġfair"], 3.0),
    "poor": (["p", "Ġpoo"], 2.0),  # p+oo+r, Ġpoo+r
    "bad": (["Ġbad"], 1.0),  # b+ad is split
}
QBOOST_PIECES = {"good": (["Ġgood"], 1.0), "average": (["a", "Ġa"], 0.5), "poor": (["p", "Ġpoo"], 0.0)}


@pytest.fixture(scope="module")
def tiny_llava():
    return llava_vlm(seed=0)


@pytest.fixture
def images():
    return uint8_images(3, 40, 48, seed=1)


def expected_rating(tiny_llava, image, question, prefix, pieces) -> torch.Tensor:
    """sum_w P(w) v_w / sum_w P(w), P(w) = summed softmax probability of the word's tokens."""
    model, processor = tiny_llava
    probs = torch.softmax(
        last_logits(
            model, processor, chat_text(("user", "<image>" + question), generation_prompt=prefix), [image]
        ),
        -1,
    )
    word_probs = torch.stack([probs[token_ids(processor.tokenizer, ids)].sum() for ids, _ in pieces.values()])
    values = torch.tensor([value for _, value in pieces.values()])
    return (word_probs / word_probs.sum()) @ values


def test_qalign_equals_independent_computation(tiny_llava, images):
    reward = VLMQualityReward(*tiny_llava)
    out = reward(images, None)
    expected = torch.stack(
        [
            expected_rating(tiny_llava, image, QALIGN_QUESTION, QALIGN_PREFIX, QALIGN_PIECES)
            for image in images
        ]
    )
    torch.testing.assert_close(out.scores, expected, atol=1e-5, rtol=0)
    assert ((out.scores >= 1) & (out.scores <= 5)).all()
    rescaled = VLMQualityReward(*tiny_llava, rescale=True)(images, None).scores
    torch.testing.assert_close(rescaled, (expected - 1) / 4, atol=1e-6, rtol=0)


def test_qboost_averages_the_triadic_expectation_over_prompts(tiny_llava, images):
    out = VLMQualityReward(*tiny_llava, preset="qboost")(images, None)
    members = torch.stack(
        [
            torch.stack(
                [
                    expected_rating(tiny_llava, image, question, prefix, QBOOST_PIECES)
                    for question, prefix in QBOOST_PROMPTS
                ]
            )
            for image in images
        ]
    )  # (B, 4)
    torch.testing.assert_close(out.details["member_scores"], members, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.scores, members.mean(-1), atol=1e-6, rtol=0)


def test_level_sets_of_different_ranges_need_rescale(tiny_llava, images):
    levels = [{"good": 1.0, "poor": 0.0}, {"excellent": 5.0, "bad": 1.0}]
    with pytest.raises(ValueError, match="rescale"):
        VLMQualityReward(*tiny_llava, levels=levels)
    prompts = [("Rate it.", "It is")]
    out = VLMQualityReward(*tiny_llava, prompts=prompts, levels=levels, rescale=True)(images, None)
    pieces = [
        {"good": (["Ġgood"], 1.0), "poor": (["p", "Ġpoo"], 0.0)},
        {"excellent": (["ex", "Ġex"], 1.0), "bad": (["Ġbad"], 0.0)},
    ]
    for i, image in enumerate(images):
        members = torch.stack([expected_rating(tiny_llava, image, "Rate it.", "It is", p) for p in pieces])
        torch.testing.assert_close(out.details["member_scores"][i], members, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.scores, out.details["member_scores"].mean(-1))


def test_batch_equals_single_and_system_prompt(tiny_llava, images):
    reward = VLMQualityReward(*tiny_llava, batch_size=2, system_prompt="You rate image quality.")
    batched = reward(images, None).scores
    single = torch.cat([reward(images[i : i + 1], None).scores for i in range(3)])
    torch.testing.assert_close(batched, single, atol=1e-6, rtol=0)
    model, processor = tiny_llava
    text = chat_text(
        ("system", "You rate image quality."),
        ("user", "<image>" + QALIGN_QUESTION),
        generation_prompt=QALIGN_PREFIX,
    )
    probs = torch.softmax(last_logits(model, processor, text, [images[0]]), -1)
    word_probs = torch.stack(
        [probs[token_ids(processor.tokenizer, ids)].sum() for ids, _ in QALIGN_PIECES.values()]
    )
    expected = (word_probs / word_probs.sum()) @ torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
    torch.testing.assert_close(batched[0], expected, atol=1e-5, rtol=0)


def test_sampled_ratings_mean_variance_and_weights(tiny_llava, images):
    reward = VLMQualityReward(*tiny_llava, num_samples=4000, seed=0)
    out = reward(images, None)
    samples = out.details["samples"]  # (B, N)
    assert samples.shape == (3, 4000)
    assert set(samples.unique().tolist()) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    torch.testing.assert_close(out.details["score_mean"], samples.mean(-1))
    torch.testing.assert_close(out.details["score_var"], samples.var(-1, unbiased=False))
    torch.testing.assert_close(
        out.details["uncertainty_weight"], torch.exp(-0.2 * out.details["score_var"] / 4.0)
    )
    # samples are drawn from the rating distribution: their mean estimates the expectation
    standard_error = out.details["score_var"].sqrt() / math.sqrt(4000)
    assert ((out.details["score_mean"] - out.scores).abs() < 4 * standard_error + 1e-6).all()
    again = VLMQualityReward(*tiny_llava, num_samples=4000, seed=0)(images, None)
    torch.testing.assert_close(again.details["samples"], samples)
    cold = VLMQualityReward(*tiny_llava, num_samples=16, sample_temperature=1e-4, seed=0)(images, None)
    assert (cold.details["score_var"] == 0).all() and (cold.details["uncertainty_weight"] == 1).all()


def test_uncertainty_weights_formula():
    variance = torch.tensor([0.0, 1.0, 4.0, 9.0])  # on [1, 5] the largest possible variance is 4
    expected = torch.exp(-0.2 * torch.tensor([0.0, 0.25, 1.0, 1.0]))
    torch.testing.assert_close(uncertainty_weights(variance), expected)
    torch.testing.assert_close(
        uncertainty_weights(torch.tensor([0.0625]), score_min=0.0, score_max=1.0, alpha=1.0),
        torch.exp(torch.tensor([-0.25])),
    )
    with pytest.raises(ValueError, match="score_max"):
        uncertainty_weights(variance, score_min=2.0, score_max=2.0)


def test_rollout_variance_ignores_unparsed_rollouts():
    scores = torch.tensor([[1.0, 3.0, float("nan")], [2.0, float("nan"), float("nan")], [1.0, 2.0, 3.0]])
    torch.testing.assert_close(rollout_variance(scores), torch.tensor([1.0, 0.0, 2.0 / 3.0]))


def test_loading_from_a_saved_folder(tiny_llava, images, tmp_path):
    llava_vlm(seed=0, save_to=tmp_path)
    torch.testing.assert_close(
        load_reward("iqa", model=str(tmp_path))(images, None).scores,
        VLMQualityReward(*tiny_llava)(images, None).scores,
    )


def test_bad_arguments(tiny_llava):
    for bad, match in [
        ({"preset": "qinstruct"}, "preset"),
        ({"num_samples": -1}, "num_samples"),
        ({"sample_temperature": 0.0}, "sample_temperature"),
        ({"levels": {"good": 1.0}}, "two words"),
        ({"levels": {"good": 1.0, "bad": 1.0}}, "equal"),
        ({"prompts": []}, "prompts"),
    ]:
        with pytest.raises(ValueError, match=match):
            VLMQualityReward(*tiny_llava, **bad)


# -- a trained judge's answer (Q-Hawkeye, preset "answer") ---------------------------------------------

SCRIPTED = [
    "<think>sharp</think><answer>4.25</answer>",
    "<think>noisy</think><answer>7</answer>",  # out of range: clamped to 5
    "no answer at all",  # unparsed: the range's floor
]


def scripted_judge(reward, monkeypatch):
    """Replace the judge's greedy generation by SCRIPTED, recording what it was asked."""
    asked = []

    def generate(texts, images, max_new_tokens, temperature=None, seed=None):
        asked.append((list(texts), [len(i) for i in images], max_new_tokens, temperature, seed))
        return (SCRIPTED * len(texts))[: len(texts)]

    monkeypatch.setattr(reward.judge, "generate", generate)
    return asked


def test_the_answer_preset_parses_clamps_and_floors(tiny_llava, images, monkeypatch):
    reward = VLMQualityReward(*tiny_llava, preset="answer", question="Rate it.", max_new_tokens=12)
    asked = scripted_judge(reward, monkeypatch)
    out = reward(images, None)
    torch.testing.assert_close(out.scores, torch.tensor([4.25, 5.0, 1.0]))
    torch.testing.assert_close(out.details["answer_parsed"], torch.tensor([1.0, 1.0, 0.0]))
    # one user turn (the image, then the question) as the language policy renders it
    assert asked == [([chat_text(("user", "<image>Rate it."))] * 3, [1, 1, 1], 12, None, None)]


def test_sampled_answers_are_averaged_over_the_parsed_ones(tiny_llava, images, monkeypatch):
    reward = VLMQualityReward(
        *tiny_llava, preset="answer", question="Rate it.", num_samples=3, sample_temperature=0.5, seed=7
    )
    asked = scripted_judge(reward, monkeypatch)
    out = reward(images[:2], None)
    # each image's 3 samples are 4.25, 5 (clamped from 7) and an unparsed one
    torch.testing.assert_close(out.scores, torch.tensor([4.625, 4.625]))
    torch.testing.assert_close(out.details["answer_parsed"], torch.tensor([2 / 3, 2 / 3]))
    torch.testing.assert_close(out.details["answer_var"], torch.tensor([0.140625, 0.140625]))
    assert [len(asked[0][0]), asked[0][3], asked[0][4]] == [6, 0.5, 7]


def test_sampled_generation_repeats_with_its_seed(tiny_llava, images):
    judge = VLMQualityReward(*tiny_llava, preset="answer", question="Rate it.").judge
    text = judge.render([judge.message("user", "Rate it.", images=1)])
    batch = ([text] * 3, [[image] for image in images])
    first = judge.generate(*batch, 8, temperature=1.0, seed=3)
    assert first == judge.generate(*batch, 8, temperature=1.0, seed=3)
    assert first != judge.generate(*batch, 8, temperature=1.0, seed=4)
    assert judge.generate(*batch, 8) == judge.generate(*batch, 8)  # greedy


def test_the_answer_preset_decodes_greedily_with_the_real_model(tiny_llava, images):
    reward = VLMQualityReward(*tiny_llava, preset="answer", question="Rate it.", max_new_tokens=6)
    text = reward.judge.render([reward.judge.message("user", "Rate it.", images=1)])
    completions = reward.judge.generate([text] * 3, [[image] for image in images], 6)
    out = reward(images, None)
    # a tiny random model writes no answer: every image gets the floor, none counts as parsed
    assert not any("<answer>" in c for c in completions)
    torch.testing.assert_close(out.scores, torch.ones(3))
    assert float(out.details["answer_parsed"].sum()) == 0.0


def test_a_folder_with_iqa_judge_json_asks_its_question(tiny_llava, images, tmp_path, monkeypatch):
    llava_vlm(seed=0, save_to=tmp_path)
    settings = {"preset": "answer", "question": "Judge.", "max_new_tokens": 9, "answer_range": [1, 5]}
    (tmp_path / "iqa_judge.json").write_text(json.dumps(settings))
    reward = load_reward("iqa", model=str(tmp_path))
    assert reward.answer == {
        "question": "Judge.",
        "max_new_tokens": 9,
        "answer_range": (1.0, 5.0),
        "num_samples": 0,
        "temperature": 1.0,
        "seed": None,
        "digit_ids": None,
    }
    asked = scripted_judge(reward, monkeypatch)
    torch.testing.assert_close(reward(images, None).scores, torch.tensor([4.25, 5.0, 1.0]))
    assert asked[0][0][0].endswith("<image>Judge.<|im_end|>\n<|im_start|>assistant\n")
    # an explicit preset wins over the file
    assert load_reward("iqa", model=str(tmp_path), preset="qalign").answer is None
    (tmp_path / "iqa_judge.json").write_text(json.dumps({**settings, "questoin": "x"}))
    with pytest.raises(ValueError, match=r"iqa_judge.json: unknown keys \['questoin'\]"):
        load_reward("iqa", model=str(tmp_path))


def test_the_expected_readout_equals_an_independent_computation(tiny_llava, images, monkeypatch):
    """Each digit of the answer replaced by its expectation over the ten digit tokens, given the
    completion up to it, weighted by its place; computed here one chat at a time."""
    model, processor = tiny_llava
    reward = VLMQualityReward(
        *tiny_llava,
        preset="answer",
        question="Rate it.",
        answer_range=(0, 100),
        readout="expected",
        batch_size=2,
    )
    scripted_judge(reward, monkeypatch)
    out = reward(images, None)
    digit_ids = token_ids(processor.tokenizer, [str(d) for d in range(10)])
    expected = []
    for image, completion in zip(images, SCRIPTED):
        start = completion.find("<answer>") + len("<answer>")
        number = completion[start : completion.find("</answer>")] if start >= len("<answer>") else ""
        value, place = 0.0, 10.0 ** (len(number.split(".")[0]) - 1)
        for index, character in enumerate(number):
            if character == ".":
                continue
            text = chat_text(("user", "<image>Rate it."), generation_prompt=completion[: start + index])
            probs = torch.softmax(last_logits(model, processor, text, [image]), -1)[digit_ids]
            value += place * float((probs / probs.sum()) @ torch.arange(10.0))
            place /= 10
        expected.append(value if number else 0.0)  # unparsed: the range's floor
    torch.testing.assert_close(out.scores, torch.tensor(expected), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.details["answer_parsed"], torch.tensor([1.0, 1.0, 0.0]))
    # a digit's expectation lies strictly inside its range and differs from the written digit
    assert 0 < float(out.scores[0]) < 10 and float(out.scores[0]) != 4.25


def test_the_expected_readout_clamps_to_the_answer_range(tiny_llava, images, monkeypatch):
    reward = VLMQualityReward(*tiny_llava, preset="answer", question="Rate it.", readout="expected")
    scripted_judge(reward, monkeypatch)
    scores = reward(images, None).scores
    assert float(scores.min()) >= 1.0 and float(scores.max()) <= 5.0
    assert float(scores[2]) == 1.0  # unparsed: the floor


def test_the_expected_readout_needs_one_digit_per_token(tiny_llava, monkeypatch):
    tokenizer = tiny_llava[1].tokenizer
    merged = lambda text, **kw: ["<answer>", "2", ".", "51", "</answer>"]  # noqa: E731
    monkeypatch.setattr(tokenizer, "tokenize", merged)
    with pytest.raises(ValueError, match=r"needs one digit per token, but the tokenizer writes '2.51' as"):
        VLMQualityReward(*tiny_llava, preset="answer", readout="expected")


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"readout": "mean"}, r"readout must be one of \['text', 'expected'\], got 'mean'"),
        ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
        ({"answer_range": (5, 1)}, "answer_range must have low < high"),
        ({"answer_range": "high"}, "answer_range must be two numbers"),
        ({"question": ""}, "question must be a non-empty string"),
        ({"levels": {"good": 1.0, "bad": 0.0}}, "preset 'answer' reads the judge's <answer>"),
        ({"num_samples": -1}, "need num_samples >= 0"),
    ],
)
def test_bad_answer_arguments(tiny_llava, bad, match):
    with pytest.raises(ValueError, match=match):
        VLMQualityReward(*tiny_llava, preset="answer", **bad)


def test_the_expected_readout_needs_the_answer_preset(tiny_llava):
    with pytest.raises(
        ValueError, match="readout 'expected' reads an answer judge's number: it needs preset 'answer'"
    ):
        VLMQualityReward(*tiny_llava, preset="qalign", readout="expected")


def test_the_expected_readout_of_sampled_answers_is_the_mean_over_the_parsed_ones(
    tiny_llava, images, monkeypatch
):
    options = {"preset": "answer", "question": "Rate it.", "answer_range": (0, 100), "readout": "expected"}
    sampled = VLMQualityReward(*tiny_llava, num_samples=3, sample_temperature=0.5, seed=7, **options)
    scripted_judge(sampled, monkeypatch)  # each image's 3 samples: SCRIPTED[0], [1], [2] (unparsed)
    out = sampled(images[:2], None)
    single = VLMQualityReward(*tiny_llava, **options)
    per_answer = []
    for completion in SCRIPTED[:2]:
        monkeypatch.setattr(single.judge, "generate", lambda texts, *a, c=completion, **k: [c] * len(texts))
        per_answer.append(single(images[:2], None).scores)
    torch.testing.assert_close(out.scores, torch.stack(per_answer).mean(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.details["answer_parsed"], torch.tensor([2 / 3, 2 / 3]))


def test_logits_from_end_are_each_prefixs_next_token_logits(tiny_llava, images):
    """One teacher-forced forward per text gives, at each offset from its end, what a forward of
    the prefix ending there gives for its next token; texts of different lengths share a batch
    (left padding) and the batches are chunked (batch size 2 for 3 texts)."""
    from genalign.rewards.vlm import VLMJudge

    judge = VLMJudge(*tiny_llava, batch_size=2)
    base = chat_text(("user", "<image>Rate it."), generation_prompt="<think>ok</think><answer>")
    wholes = [base + "4.25", base + "3", base + "12.5"]
    offsets = [[3, 1, 0], [1], [4, 2]]
    rows = judge.logits_from_end(wholes, [[image] for image in images], offsets)
    for whole, image, row_offsets, row in zip(wholes, images, offsets, rows):
        tokens = judge.tokenizer(whole)["input_ids"]
        assert row.shape == (len(row_offsets), judge.model.config.text_config.vocab_size)
        for offset, logits in zip(row_offsets, row):
            prefix = judge.tokenizer.decode(tokens[: len(tokens) - offset], skip_special_tokens=False)
            torch.testing.assert_close(
                logits, last_logits(*tiny_llava, prefix, [image]), atol=1e-4, rtol=1e-4
            )
    with pytest.raises(ValueError, match="got 3 texts but 1 offset lists"):
        judge.logits_from_end(wholes, [[image] for image in images], [[0]])


def test_the_expected_readout_forces_one_forward_per_answer_and_falls_back_where_tokens_merge(
    tiny_llava, images, monkeypatch
):
    reward = VLMQualityReward(
        *tiny_llava, preset="answer", question="Rate it.", answer_range=(0, 100), readout="expected"
    )
    scripted_judge(reward, monkeypatch)
    calls = {"forced": 0, "prefixes": 0}
    forced, prefixes = reward.judge.logits_from_end, reward.judge.next_token_logits

    def count(name, function):
        def wrapped(texts, *args):
            calls[name] += len(texts)
            return function(texts, *args)

        return wrapped

    monkeypatch.setattr(reward.judge, "logits_from_end", count("forced", forced))
    monkeypatch.setattr(reward.judge, "next_token_logits", count("prefixes", prefixes))
    one_pass = reward(images, None).scores
    assert calls == {"forced": 2, "prefixes": 0}  # two parsed answers, one forward each
    monkeypatch.setattr(
        reward, "_digit_offsets", lambda whole, prefixes: None
    )  # as if every cut merged tokens
    per_digit = reward(images, None).scores
    assert calls == {"forced": 2, "prefixes": 4}  # 4.25 and 7: three digits and one
    torch.testing.assert_close(one_pass, per_digit, atol=1e-5, rtol=1e-5)


def test_digit_offsets_count_back_from_the_end_and_refuse_a_merge_across_the_cut(tiny_llava, monkeypatch):
    reward = VLMQualityReward(*tiny_llava, preset="answer", question="Rate it.", readout="expected")
    by_character = lambda text: {"input_ids": [ord(c) for c in text]}  # noqa: E731
    monkeypatch.setattr(type(reward.judge), "tokenizer", property(lambda judge: by_character))
    assert reward._digit_offsets("<a>4.25", ["<a>", "<a>4.", "<a>4.2"]) == [4, 2, 1]

    def merging(text):  # "4." is one token: the prefix "<a>4" ends inside it
        return {"input_ids": [ord(c) for c in text.replace("4.", "\x00")]}

    monkeypatch.setattr(type(reward.judge), "tokenizer", property(lambda judge: merging))
    assert reward._digit_offsets("<a>4.25", ["<a>", "<a>4.", "<a>4.2"]) == [3, 2, 1]
    assert reward._digit_offsets("<a>4.25", ["<a>", "<a>4"]) is None
