"""Teacher-forced token records for supervised fine-tuning of a ``language`` policy.

Supervised fine-tuning (RLRF's stage 1, "SVG-SFT": ``L = -sum_l log p(x_l | x_<l, I)``,
Rodriguez et al. 2025, arXiv 2505.20793, Sec. 3.1) scores given target texts instead of sampled
completions. :func:`teacher_forced_trajectory` lays the targets out exactly as a rollout lays out
its completions (:class:`~genalign.policies.TokenTrajectory`: the left-padded prompt through the
same chat template, then the target tokens and an end-of-turn token, padded on the right), so
:meth:`~genalign.policies.LanguagePolicy.log_prob` re-scores them with the attention mask and
real-token position ids of every other forward, and the trainer's minibatches, checkpoints and
resume work unchanged. ``completion_mask`` is 1 on the target tokens and their end token only:
prompt and padding never enter the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from genalign.policies.language_vision import stored_images
from genalign.policies.token_trajectory import TokenSettings, TokenTrajectory

if TYPE_CHECKING:
    from genalign.policies.language import LanguagePolicy

__all__ = ["teacher_forced_trajectory"]


def teacher_forced_trajectory(
    policy: LanguagePolicy,
    prompts: Sequence[str],
    targets: Sequence[str],
    images: torch.Tensor | Sequence[torch.Tensor] | None = None,
    settings: TokenSettings | None = None,
) -> TokenTrajectory:
    """The B (prompt, target) pairs as a :class:`TokenTrajectory` with zero ``log_probs``.

    Args:
        policy: the language policy whose tokenizer / processor and chat template are used.
        prompts, targets: B prompts and the B texts the policy should answer them with.
        images: for a VLM, one image per prompt in [0, 1]: ``[B, 3, H, W]``, or B ``[3, H, W]``
            tensors of any sizes.
        settings: the prompt rendering (``chat_template``, ``system_prompt``) and the temperature
            of re-scoring (1 for a maximum-likelihood loss); ``max_new_tokens`` is set to L.

    Each target is tokenized without special tokens and followed by the policy's first
    end-of-sequence id (``<|im_end|>`` for a chat model), so the model also learns to stop.
    """
    if len(prompts) != len(targets):
        raise ValueError(f"got {len(prompts)} prompts but {len(targets)} targets")
    if not prompts:
        raise ValueError("no prompts to fine-tune on")
    settings = settings or TokenSettings()
    encoded = policy.encode_prompts(list(prompts), settings, images)
    prompt_ids, prompt_mask = encoded.pop("input_ids"), encoded.pop("attention_mask")
    end = policy.eos_token_ids[0]
    rows = [policy.tokenizer(str(t), add_special_tokens=False)["input_ids"] + [end] for t in targets]
    length = max(len(row) for row in rows)
    completion_ids = torch.full((len(rows), length), policy.pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        completion_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        completion_mask[i, : len(row)] = 1
    device = prompt_ids.device
    completion_ids, completion_mask = completion_ids.to(device), completion_mask.to(device)
    settings = TokenSettings(settings.temperature, length, settings.chat_template, settings.system_prompt)
    return TokenTrajectory(
        prompts=list(prompts),
        group_ids=torch.arange(len(rows)),
        seeds=torch.zeros(len(rows), dtype=torch.long),
        input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
        attention_mask=torch.cat([prompt_mask.long(), completion_mask], dim=1),
        completion_mask=completion_mask,
        log_probs=torch.zeros(len(rows), length),
        completions=[str(t) for t in targets],
        model_inputs=encoded,
        images=stored_images(images),
        settings=settings,
    )
