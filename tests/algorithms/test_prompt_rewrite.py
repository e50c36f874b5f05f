"""PromptRL's text helpers (arXiv 2602.01382; UniRL): the last <answer> tag, the fallback when
there is none, the format reward and prompt retention, against hand-written cases."""

from __future__ import annotations

import pytest
import torch

from genalign.algorithms import (
    GENEVAL_TEMPLATE,
    extract_answer,
    format_rewards,
    refine_prompts,
    retained_format_rewards,
    retained_rows,
)


def test_the_refined_prompt_is_the_last_answer_tag_stripped():
    text = "<think>hm</think><answer> a red cube </answer> then <answer>\n two red cubes\n</answer>"
    assert extract_answer(text, "orig") == ("two red cubes", True)


def test_no_tag_falls_back_to_the_original_or_the_completion():
    for text in ("no tags at all", "<answer>never closed", "", "</answer>reversed<answer>"):
        assert extract_answer(text, "a red cube") == ("a red cube", False)
    assert extract_answer("  just text ", "orig", fallback="completion") == ("just text", False)


def test_stray_answer_tags_are_removed_as_unirl_does():
    """UniRL's extract_thinking_content strips leftover tags from the answer and the fallback."""
    assert extract_answer("<answer>draft <answer>a red circle</answer>", "orig") == (
        "draft a red circle",
        True,
    )
    unclosed = "Sure. <answer>a red circle on the left"
    assert extract_answer(unclosed, "orig", fallback="completion") == (
        "Sure. a red circle on the left",
        False,
    )
    assert extract_answer(unclosed, "orig") == ("orig", False)  # the original is never edited


def test_an_empty_answer_is_an_empty_prompt_with_format_reward_one():
    assert extract_answer("<answer></answer>", "orig") == ("", True)
    prompts, scores = refine_prompts(["<answer></answer>", "nothing", "<answer>x</answer>"], ["a", "b", "c"])
    assert prompts == ["", "b", "x"]
    assert torch.equal(scores, torch.tensor([1.0, 0.0, 1.0]))
    assert torch.equal(format_rewards(["<answer>y</answer>", "", "<answer>"]), torch.tensor([1.0, 0.0, 0.0]))


def test_refine_prompts_checks_lengths():
    with pytest.raises(ValueError, match="2 completions for 1"):
        refine_prompts(["a", "b"], ["x"])


def test_the_template_is_unirls_geneval_question():
    text = GENEVAL_TEMPLATE.format(prompt="a photo of a cat")
    assert "Original prompt: a photo of a cat." in text
    assert text.endswith("Directly provide the improved prompt in <answer> </answer> tags.")


def test_retained_rows_are_the_first_k_of_each_group():
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    assert retained_rows(groups, 2).tolist() == [True, True, False, True, True, False]
    assert not retained_rows(groups, 0).any()
    with pytest.raises(ValueError):
        retained_rows(groups, -1)


def test_retained_rows_get_their_groups_mean_format_score():
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    retained = retained_rows(groups, 2)
    scores = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    out = retained_format_rewards(scores, retained, groups)
    assert out.tolist() == [0.5, 0.5, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
