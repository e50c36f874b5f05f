"""PromptRL's text side as pure functions: the rewrite template, answer extraction, the format
reward and which rows of a group keep their original prompt (arXiv 2602.01382, Sec. 3; UniRL's
``GenEvalJointGRPOTrainer`` and ``EditJointGRPOTrainer``).

The rewriter sees ``template.format(prompt=p)`` and writes a completion ``o_i``; the generator
draws the refined prompt ``q_i``, the text inside the **last** ``<answer>...</answer>`` of
``o_i``; the reward is ``R_task(x_i, p) + w * R_format(o_i)`` with ``R_format = 1`` when an
answer tag is present, else 0 (the paper's reward, eq. 2, with the format term of UniRL's
``format`` reward function). Strings in, strings and tensors out: nothing here loads a model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import torch

__all__ = [
    "ANSWER_PATTERN",
    "GENEVAL_TEMPLATE",
    "extract_answer",
    "format_rewards",
    "refine_prompts",
    "retained_format_rewards",
    "retained_rows",
]

# UniRL's GENEVAL_QUESTION_TEMPLATE (unirl/train_geneval.py) with ``{Question}`` named ``{prompt}``
GENEVAL_TEMPLATE = (
    "Please provide an enhanced prompt for the following image generation prompt to "
    "make the image more realistic, detailed, with clear separation and precise alignment "
    "of all entities.\nOriginal prompt: {prompt}. "
    "Directly provide the improved prompt in <answer> </answer> tags."
)

# a closed answer tag; DOTALL so an answer may span lines (UniRL's ``<answer>.*</answer>``)
ANSWER_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

Fallback = Literal["original", "completion"]


def extract_answer(completion: str, original: str, fallback: Fallback = "original") -> tuple[str, bool]:
    """The refined prompt in ``completion`` and whether it holds an answer tag.

    The refined prompt is the stripped text inside the last ``<answer>...</answer>`` (possibly
    empty: an empty answer is drawn as the empty prompt, as UniRL does). Without a closed tag it
    is ``original`` (``fallback="original"``) or the whole stripped completion (``"completion"``,
    UniRL's choice). Stray ``<answer>`` / ``</answer>`` tags left in the text taken from the
    completion (a nested opening tag, an unclosed one) are removed, as UniRL's
    ``extract_thinking_content`` does.
    """
    matches = ANSWER_PATTERN.findall(completion)
    if matches:
        return _without_tags(matches[-1].strip()), True
    return (original if fallback == "original" else _without_tags(completion.strip())), False


def _without_tags(text: str) -> str:
    return text.replace("<answer>", "").replace("</answer>", "")


def refine_prompts(
    completions: Sequence[str], originals: Sequence[str], fallback: Fallback = "original"
) -> tuple[list[str], torch.Tensor]:
    """The refined prompts of ``completions`` and their format rewards ``[B]`` fp32 (1 with an
    answer tag, else 0); ``originals[i]`` is row ``i``'s original prompt."""
    if len(completions) != len(originals):
        raise ValueError(f"{len(completions)} completions for {len(originals)} original prompts")
    pairs = [extract_answer(c, p, fallback) for c, p in zip(completions, originals, strict=True)]
    prompts = [prompt for prompt, _ in pairs]
    return prompts, torch.tensor([float(tagged) for _, tagged in pairs], dtype=torch.float32)


def format_rewards(completions: Sequence[str]) -> torch.Tensor:
    """``[B]`` fp32: 1 where a completion holds a closed ``<answer>`` tag, else 0."""
    return torch.tensor([float(bool(ANSWER_PATTERN.search(c))) for c in completions], dtype=torch.float32)


def retained_rows(group_ids: torch.Tensor, num_retained: int) -> torch.Tensor:
    """Bool ``[B]``: the first ``num_retained`` members of each group, which draw the original
    prompt (UniRL's edit trainer, ``NUM_SKIP_REFINEMENT``: of G generations K use the original
    instruction, and only the G - K refined ones enter the LM loss).

    ``group_ids``: ``[B]`` group of each row; members are counted in row order.
    """
    if num_retained < 0:
        raise ValueError(f"num_retained must be >= 0, got {num_retained}")
    keep = torch.zeros(group_ids.shape[0], dtype=torch.bool)
    seen: dict[int, int] = {}
    for row, group in enumerate(group_ids.tolist()):
        seen[group] = seen.get(group, 0) + 1
        keep[row] = seen[group] <= num_retained
    return keep


def retained_format_rewards(
    format_scores: torch.Tensor, retained: torch.Tensor, group_ids: torch.Tensor
) -> torch.Tensor:
    """Format rewards ``[B]`` where each retained row gets the mean of its group's refined rows
    (UniRL's edit trainer; 0 for a group with no refined row)."""
    out = format_scores.clone().float()
    for group in group_ids[retained].unique().tolist():
        members = group_ids == group
        refined = members & ~retained
        value = format_scores[refined].float().mean() if refined.any() else torch.tensor(0.0)
        out[members & retained] = value
    return out
