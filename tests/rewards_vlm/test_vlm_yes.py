"""``vlm_yes`` (VQAScore / RewardDance) against P("yes") computed from the tiny LLaVA's logits."""

from __future__ import annotations

import pytest
import torch

from genalign.rewards import load_reward
from genalign.rewards.vlm_yes import COT_INSTRUCTION, DEFAULT_CRITERIA, JUDGEMENT_PROMPT, VLMYesReward
from genalign.tiny import language
from genalign.tiny.tokenizers import DEFAULT_CORPUS, train_bpe_tokenizer

from . import QUESTION, chat_text, greedy_continuation, last_logits, p_yes_formula, token_ids, uint8_images

PROMPTS = ["a red circle", "two blue squares", "a red circle", "a green triangle"]


def comparative_user_turn(prompt: str) -> tuple[str, str]:
    question = (
        f'Both images were generated for the prompt "{prompt}". '
        f"Is Image 1 better than Image 2 in terms of {DEFAULT_CRITERIA}? Please answer yes or no."
    )
    return ("user", f"Image 1:<image>\nImage 2:<image>\n{question}")


@pytest.fixture(scope="module")
def tiny_llava():
    return language.llava_vlm(seed=0)


@pytest.fixture(scope="module")
def yes_no_ids(tiny_llava):
    """The tiny BPE has "yes"/" yes" and "no"/" no" as single tokens ("Yes", "YES" are split)."""
    tokenizer = tiny_llava[1].tokenizer
    return token_ids(tokenizer, ["yes", "Ġyes"]), token_ids(tokenizer, ["no", "Ġno"])


@pytest.fixture
def images():
    """Non-square 40x48 uint8-exact images: the processor resizes and crops them."""
    return uint8_images(4, 40, 48, seed=0)


def pointwise_expected(tiny_llava, yes_no_ids, images, prompts, normalize="yes_no"):
    model, processor = tiny_llava
    values = []
    for image, prompt in zip(images, prompts):
        text = chat_text(("user", "<image>" + QUESTION.format(prompt)))
        values.append(p_yes_formula(last_logits(model, processor, text, [image]), *yes_no_ids, normalize))
    return torch.stack(values)


def comparative_expected(tiny_llava, yes_no_ids, candidate, reference, prompt):
    model, processor = tiny_llava
    text = chat_text(comparative_user_turn(prompt))
    return p_yes_formula(last_logits(model, processor, text, [candidate, reference]), *yes_no_ids, "yes_no")


@pytest.mark.parametrize("normalize", ["yes_no", "raw"])
def test_pointwise_equals_independent_computation(tiny_llava, yes_no_ids, images, normalize):
    reward = VLMYesReward(*tiny_llava, normalize=normalize)
    out = reward(images, PROMPTS)
    expected = pointwise_expected(tiny_llava, yes_no_ids, images, PROMPTS, normalize)
    torch.testing.assert_close(out.scores, expected, atol=1e-6, rtol=0)
    probs = [
        torch.softmax(last_logits(*tiny_llava, chat_text(("user", "<image>" + QUESTION.format(p))), [i]), -1)
        for i, p in zip(images, PROMPTS)
    ]
    torch.testing.assert_close(
        out.details["p_yes"], torch.stack([p[yes_no_ids[0]].sum() for p in probs]), atol=1e-7, rtol=0
    )
    assert out.scores.min() >= 0 and out.scores.max() <= 1
    assert reward.differentiable is False


def test_yes_no_stays_defined_when_both_words_are_far_below_the_top_token(tiny_llava, yes_no_ids, images):
    """A judge sure of another next token (after a chain of thought, say) puts P(yes) and P(no)
    below float32's range: their ratio was 0/0 = NaN; the two-word softmax it equals is not."""
    reward = VLMYesReward(*tiny_llava)
    plain = reward(images, PROMPTS).scores
    score_logits = reward.judge.next_token_logits
    other = next(
        i for i in range(tiny_llava[0].config.text_config.vocab_size) if i not in sum(yes_no_ids, [])
    )

    def confident(texts, chat_images):
        logits = score_logits(texts, chat_images).clone()
        logits[:, other] += 120.0  # every other logit, yes and no included, is now e^-120 below it
        return logits

    reward.judge.next_token_logits = confident
    out = reward(images, PROMPTS)
    assert out.details["nan_count"] == 0 and (out.details["p_yes"] == 0).all()  # the ratio's 0/0
    torch.testing.assert_close(out.scores, plain, atol=1e-5, rtol=0)  # shifting one logit leaves the pair


def test_vqascore_convention_first_token_of_yes(tiny_llava, images):
    """t2v_metrics: softmax over the vocabulary, the first token of "Yes" (here "Y" of Y+es)."""
    reward = VLMYesReward(
        *tiny_llava, yes_words=("Yes",), no_words=("No",), answer_templates=("{w}",), normalize="raw"
    )
    model, processor = tiny_llava
    (y,) = token_ids(processor.tokenizer, ["Y"])
    expected = torch.stack(
        [
            torch.softmax(
                last_logits(model, processor, chat_text(("user", "<image>" + QUESTION.format(p))), [i]), -1
            )[y]
            for i, p in zip(images, PROMPTS)
        ]
    )
    torch.testing.assert_close(reward(images, PROMPTS).scores, expected, atol=1e-7, rtol=0)


def test_batch_equals_single(tiny_llava, images):
    reward = VLMYesReward(*tiny_llava, batch_size=3)  # chunks of 3 and 1
    batched = reward(images, PROMPTS).scores
    single = torch.cat([reward(images[i : i + 1], PROMPTS[i : i + 1]).scores for i in range(4)])
    torch.testing.assert_close(batched, single, atol=1e-6, rtol=0)


def test_comparative_equals_independent_and_swaps(tiny_llava, yes_no_ids, images):
    references = uint8_images(4, 32, 32, seed=9)
    reward = VLMYesReward(*tiny_llava, mode="comparative")
    forward = reward(images, PROMPTS, reference_images=references).scores
    swapped = reward(references, PROMPTS, reference_images=images).scores
    for i, prompt in enumerate(PROMPTS):
        expected = comparative_expected(tiny_llava, yes_no_ids, images[i], references[i], prompt)
        expected_swapped = comparative_expected(tiny_llava, yes_no_ids, references[i], images[i], prompt)
        torch.testing.assert_close(forward[i], expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(swapped[i], expected_swapped, atol=1e-6, rtol=0)
    assert (forward - swapped).abs().min() > 1e-6  # the image order matters


def test_one_reference_image_is_shared(tiny_llava, images):
    reference = uint8_images(1, 32, 32, seed=5)
    reward = VLMYesReward(*tiny_llava, mode="comparative")
    shared = reward(images, PROMPTS, reference_images=reference[0]).scores
    expanded = reward(images, PROMPTS, reference_images=reference.expand(4, -1, -1, -1)).scores
    torch.testing.assert_close(shared, expanded)


def test_group_mean_averages_comparisons_with_every_other_member(tiny_llava, yes_no_ids, images):
    group_ids = [0, 0, 1, 1]
    reward = VLMYesReward(*tiny_llava, mode="comparative", reference="group_mean")
    out = reward(images, PROMPTS, group_ids=torch.tensor(group_ids))
    for i in range(4):
        others = [j for j in range(4) if group_ids[j] == group_ids[i] and j != i]
        expected = torch.stack(
            [comparative_expected(tiny_llava, yes_no_ids, images[i], images[j], PROMPTS[i]) for j in others]
        ).mean()
        torch.testing.assert_close(out.scores[i], expected, atol=1e-6, rtol=0)


def test_group_best_compares_with_the_best_other_member(tiny_llava, yes_no_ids):
    images = uint8_images(5, 32, 32, seed=3)
    prompts = ["a red circle"] * 3 + ["two blue squares"] * 2
    group_ids = ["a", "a", "a", "b", "b"]
    reward = VLMYesReward(*tiny_llava, mode="comparative", reference="group_best")
    out = reward(images, prompts, group_ids=group_ids)
    pointwise = pointwise_expected(tiny_llava, yes_no_ids, images, prompts)
    for i in range(5):
        others = [j for j in range(5) if group_ids[j] == group_ids[i] and j != i]
        best = max(others, key=lambda j: float(pointwise[j]))
        assert out.details["reference_index"][i] == best
        expected = comparative_expected(tiny_llava, yes_no_ids, images[i], images[best], prompts[i])
        torch.testing.assert_close(out.scores[i], expected, atol=1e-6, rtol=0)


def test_system_prompt_and_in_context_examples(tiny_llava, yes_no_ids, images):
    example_image = uint8_images(1, 32, 32, seed=7)[0]
    reward = VLMYesReward(
        *tiny_llava,
        system_prompt="You judge text-to-image alignment.",
        examples=[(example_image, "Does this figure show a star?", "No")],
    )
    out = reward(images[:2], PROMPTS[:2])
    model, processor = tiny_llava
    for i in range(2):
        text = chat_text(
            ("system", "You judge text-to-image alignment."),
            ("user", "<image>Does this figure show a star?"),
            ("assistant", "No"),
            ("user", "<image>" + QUESTION.format(PROMPTS[i])),
        )
        logits = last_logits(model, processor, text, [example_image, images[i]])
        torch.testing.assert_close(
            out.scores[i], p_yes_formula(logits, *yes_no_ids, "yes_no"), atol=1e-6, rtol=0
        )


def test_chain_of_thought_reads_at_the_judgement_position(yes_no_ids, images):
    model, processor = language.llava_vlm(seed=0)
    model.generation_config.suppress_tokens = [
        processor.tokenizer.convert_tokens_to_ids("Ċ")
    ]  # no blank "\n\n..."
    reward = VLMYesReward(model, processor, cot_max_new_tokens=6)
    out = reward(images[:2], PROMPTS[:2])
    for i in range(2):
        question = "<image>" + QUESTION.format(PROMPTS[i])
        reasoning = greedy_continuation(
            model, processor, chat_text(("user", question + COT_INSTRUCTION)), [images[i]], 6
        )
        assert reasoning.strip() and out.details["reasoning"][i] == reasoning
        judgement = chat_text(
            ("user", question + COT_INSTRUCTION), ("assistant", reasoning), ("user", JUDGEMENT_PROMPT)
        )
        logits = last_logits(model, processor, judgement, [images[i]])
        torch.testing.assert_close(
            out.scores[i], p_yes_formula(logits, *yes_no_ids, "yes_no"), atol=1e-6, rtol=0
        )


def test_tokenizer_with_capitalised_answer_tokens(images):
    """A vocabulary where "Yes", " Yes", "YES", " YES", "No", ... are single tokens ("NO" is N+O)."""
    corpus = DEFAULT_CORPUS + ("Yes, Yes. Yes! Yes Yes", "No, No. No! No No", "YES NO YES NO")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(language, "train_bpe_tokenizer", lambda: train_bpe_tokenizer(corpus=corpus))
        model, processor = language.llava_vlm(seed=1)
    tokenizer = processor.tokenizer
    yes_ids = token_ids(tokenizer, ["yes", "Ġyes", "Yes", "ĠYes", "YES", "ĠYES"])
    no_ids = token_ids(tokenizer, ["no", "Ġno", "No", "ĠNo", "ĠNO"])  # "NO" splits; "N" is not used
    reward = VLMYesReward(model, processor)
    assert reward.yes_ids == sorted(yes_ids) and reward.no_ids == sorted(no_ids)
    expected = pointwise_expected((model, processor), (yes_ids, no_ids), images, PROMPTS)
    torch.testing.assert_close(reward(images, PROMPTS).scores, expected, atol=1e-6, rtol=0)


def test_loading_from_a_saved_folder_gives_the_same_scores(tiny_llava, images, tmp_path):
    language.llava_vlm(seed=0, save_to=tmp_path)
    from_folder = load_reward("vlm_yes", model=str(tmp_path), mode="comparative")
    built = VLMYesReward(*tiny_llava, mode="comparative")
    references = uint8_images(4, 32, 32, seed=2)
    torch.testing.assert_close(
        from_folder(images, PROMPTS, reference_images=references).scores,
        built(images, PROMPTS, reference_images=references).scores,
    )


def test_bad_inputs(tiny_llava, images):
    comparative = VLMYesReward(*tiny_llava, mode="comparative")
    with pytest.raises(ValueError, match="reference_images"):
        comparative(images, PROMPTS)
    with pytest.raises(ValueError, match="reference_images"):
        comparative(images, PROMPTS, reference_images=uint8_images(3, 32, 32))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        comparative(images, PROMPTS, reference_images=uint8_images(4, 32, 32) * 2)
    grouped = VLMYesReward(*tiny_llava, mode="comparative", reference="group_mean")
    with pytest.raises(ValueError, match="group_ids"):
        grouped(images, PROMPTS)
    with pytest.raises(ValueError, match="single member"):
        grouped(images, PROMPTS, group_ids=[0, 0, 0, 1])
    for bad in (
        {"mode": "pairwise"},
        {"normalize": "softmax"},
        {"reference": "best"},
        {"cot_max_new_tokens": -1},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            VLMYesReward(*tiny_llava, **bad)
