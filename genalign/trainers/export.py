"""A finished run's trained weights, written in the format their family's libraries load.

* diffusion families under LoRA: a diffusers LoRA file (``pytorch_lora_weights.safetensors``)
  that the pipeline's ``load_lora_weights`` reads;
* diffusion families fully fine-tuned: the denoiser's ``save_pretrained`` folder (``unet/`` or
  ``transformer/``), gathered from the shards under FSDP;
* the ``language`` family: a peft adapter folder under LoRA or the whole model in transformers
  format, with the tokenizer or processor (:meth:`~genalign.policies.LanguagePolicy.save_pretrained`);
  a Q-Hawkeye judge's also holds ``iqa_judge.json`` (its question and token budget), which
  ``load_reward("iqa", model=final)`` reads;
* a joint run (:class:`~genalign.policies.JointPolicy`): each trained policy's, as above, in a
  folder named after it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genalign.policies import JointPolicy, LanguagePolicy

if TYPE_CHECKING:
    from genalign.trainers.trainer import Trainer

__all__ = ["export_trained_weights"]


def export_trained_weights(trainer: Trainer, out: Path) -> Path:
    """Write ``trainer``'s trained weights to ``out`` (a collective under FSDP; the main process
    writes); a joint run writes each policy's into ``out/<name>``."""
    policy = trainer.policy
    if isinstance(policy, JointPolicy):
        for name in policy.names():
            if policy[name].trainable_parameters():
                _export_policy(trainer, policy[name], out / name)
        return out
    return _export_policy(trainer, policy, out)


def _judge_settings(trainer: Trainer) -> dict[str, Any]:
    """What ``load_reward("iqa", model=final)`` needs to ask a Q-Hawkeye judge what it was trained
    to answer (``genalign.rewards.iqa``, preset "answer"): the question (when every prompt of the
    pool is the same), the token budget, the score range and the system prompt; empty for other
    methods."""
    config = trainer.config
    if config.train.method != "q_hawkeye":
        return {}
    language, options = config.sampling.language, config.train.q_hawkeye
    settings: dict[str, Any] = {
        "preset": "answer",
        "max_new_tokens": int(language.max_new_tokens),
        "answer_range": [float(options.score_min), float(options.score_max)],
    }
    questions = set(trainer.prompts)
    if len(questions) == 1:
        settings["question"] = questions.pop()
    if language.system_prompt:
        settings["system_prompt"] = language.system_prompt
    return settings


def _export_policy(trainer: Trainer, policy: Any, out: Path) -> Path:
    from genalign.trainers.distributed import full_state

    if isinstance(policy, LanguagePolicy):
        state = full_state(dict(policy.model.state_dict())) if trainer.sharded else None  # collective
        if trainer.is_main_process:
            policy.save_pretrained(out, state_dict=state)
            judge = _judge_settings(trainer)
            if judge:
                (out / "iqa_judge.json").write_text(json.dumps(judge, indent=2) + "\n", encoding="utf-8")
        trainer.accelerator.wait_for_everyone()
        return out
    pipeline = policy.pipeline
    denoiser = policy.denoiser
    component = "unet" if hasattr(pipeline, "unet") else "transformer"
    if policy.lora is not None:
        from peft.utils import get_peft_model_state_dict

        state = full_state(get_peft_model_state_dict(denoiser))
        if trainer.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
            type(pipeline).save_lora_weights(
                out, **{f"{component}_lora_layers": state}, safe_serialization=True
            )
    elif trainer.sharded:
        state = full_state(dict(denoiser.state_dict()))
        if trainer.is_main_process:
            # an unsharded twin of the denoiser holds the gathered weights for save_pretrained
            twin = type(denoiser).from_config(denoiser.config)
            twin.load_state_dict(state)
            twin.save_pretrained(out / component)
    elif trainer.is_main_process:
        denoiser.save_pretrained(out / component)
    trainer.accelerator.wait_for_everyone()
    return out
