"""toy-vlm's training: next-token cross-entropy on the answer token of three instruction tasks
(VQAScore yes/no, RewardDance comparison, Q-Align rating), each chat rendered exactly as its reward
renders it (the package docstring describes the tasks)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from genalign.toy.prompts import train_prompts
from genalign.toy.reward_models.data import (
    DEGRADATIONS,
    SceneBank,
    augment,
    build_bank,
    degrade,
    sample_scenes,
    to_size,
)
from genalign.toy.reward_models.vlm_model import (
    RATING_WORDS,
    VLMRecipe,
    _vlm_templates,
    answer_token,
    build_vlm,
)
from genalign.toy.training import parameter_count, training_progress, warmup_cosine

logger = logging.getLogger(__name__)


class VLMTasks:
    """Renders the three training chats exactly as ``vlm_yes`` / ``iqa`` render theirs."""

    def __init__(self, judge: Any) -> None:
        self.judge = judge
        self.templates = _vlm_templates()
        tokenizer = judge.tokenizer
        self.yes, self.no = answer_token(tokenizer, "yes"), answer_token(tokenizer, "no")
        self.levels = [answer_token(tokenizer, " " + word) for word in RATING_WORDS]

    def yes_no(self, caption: str) -> str:
        question = self.templates["vqa"].format(prompt=caption)
        return self.judge.render([self.judge.message("user", question, images=1)])

    def comparative(self, caption: str) -> str:
        t = self.templates
        question = t["comparative"].format(prompt=caption, criteria=t["criteria"])
        first, second = t["labels"]
        return self.judge.render(
            [self.judge.message("user", parts=[first, None, second, None, "\n" + question])]
        )

    def rating(self) -> str:
        question, prefix = self.templates["rating"]
        return self.judge.render([self.judge.message("user", question, images=1)], prefix)

    def description(self, caption: str) -> tuple[str, int]:
        """The captioning chat answered with ``caption``: (full text, number of answer tokens at
        its end, the closing ``<|im_end|>`` included)."""
        prompt = self.judge.render([self.judge.message("user", CAPTION_QUESTION, images=1)])
        answer = caption + "<|im_end|>"
        return prompt + answer, len(self.judge.tokenizer.encode(answer, add_special_tokens=False))


CAPTION_QUESTION = "Describe this image."


def caption_loss(
    model: torch.nn.Module, judge: Any, texts: Sequence[str], images: Sequence, lengths: Sequence[int]
):
    """Mean next-token cross-entropy over the last ``lengths[i]`` tokens of each (left-padded)
    chat: the answer tokens of :meth:`VLMTasks.description`."""
    inputs = judge.encode(texts, images)
    ids = inputs["input_ids"]
    scored = torch.zeros_like(ids, dtype=torch.bool)
    for row, length in enumerate(lengths):
        scored[row, ids.shape[1] - length :] = True
    return _next_token_loss(model(**inputs, use_cache=False).logits, ids, scored)


def _next_token_loss(logits: torch.Tensor, ids: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting each token where ``scored`` (bool, like ``ids``) is true
    from the position before it."""
    labels = torch.where(scored, ids, torch.full_like(ids, -100))
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def question_loss(logits: torch.Tensor, inputs: Any, image_token_id: int, rows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the text after the last image token (the question and the
    assistant header; padding excluded) of the chats selected by the boolean ``rows``.

    ``logits`` are the model's ``[B, L, V]`` outputs for ``inputs`` (left padded); a batch with no
    selected row gives 0."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"].bool()
    is_image = ids == image_token_id
    after_images = is_image.cumsum(1) == is_image.sum(1, keepdim=True)
    scored = after_images & ~is_image & mask & rows.view(-1, 1)
    if not scored[:, 1:].any():
        return logits.new_zeros(())
    return _next_token_loss(logits, ids, scored)


def _training_image(
    bank: SceneBank, index: int, recipe: VLMRecipe, rng: np.random.Generator, clean: bool = False
) -> torch.Tensor:
    """A bank image as toy-vlm trains on it: sometimes rendered at 48 px, then (unless ``clean``)
    a generator-like imperfection (:func:`augment`)."""
    image = bank.image(index)
    if rng.random() < recipe.render_48_probability:
        image = to_size(image, 48)
    return image if clean else augment(image, rng)


def _vlm_example(
    bank: SceneBank, recipe: VLMRecipe, rng: np.random.Generator, tasks: VLMTasks, task: int
) -> tuple[str, list[torch.Tensor], int] | None:
    """One training chat: (rendered text, its images, answer token id); None to redraw."""
    s = int(sample_scenes(bank, 1, rng)[0])
    prompt = bank.prompts[bank.prompt_index[s]]

    def render(index: int, clean: bool = False) -> torch.Tensor:
        return _training_image(bank, index, recipe, rng, clean)

    if task == 0:  # VQAScore yes/no
        draw = rng.random()
        if draw < 0.5:
            return tasks.yes_no(prompt.caption), [render(s)], tasks.yes
        if draw < 0.85:
            if not bank.negatives[s]:
                return None
            caption = bank.prompts[bank.negatives[s][rng.integers(len(bank.negatives[s]))]].caption
        else:
            false = np.flatnonzero(~bank.satisfies[s])
            caption = bank.prompts[false[rng.integers(len(false))]].caption
        return tasks.yes_no(caption), [render(s)], tasks.no
    if task == 1:  # RewardDance comparison: better = matches the prompt / less degraded
        if rng.random() < 0.5:
            if not bank.negatives[s]:
                return None
            variant_index = bank.negatives[s][rng.integers(len(bank.negatives[s]))]
            # scenes drawn for the changed caption that do not happen to satisfy the prompt
            candidates = np.flatnonzero(
                (bank.prompt_index == variant_index) & ~bank.satisfies[:, bank.prompt_index[s]]
            )
            if not len(candidates):
                return None
            good, bad = render(s), render(int(candidates[rng.integers(len(candidates))]))
        else:
            generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
            low = int(rng.integers(0, 3))
            high = int(rng.integers(low + 2, 5))
            kind = DEGRADATIONS[rng.integers(len(DEGRADATIONS))]
            base = render(s, clean=True)
            good, bad = degrade(base, kind, low, generator), degrade(base, kind, high, generator)
        if rng.random() < 0.5:
            return tasks.comparative(prompt.caption), [good, bad], tasks.yes
        return tasks.comparative(prompt.caption), [bad, good], tasks.no
    # Q-Align rating: severity -> level
    severity = int(rng.integers(5))
    kind = DEGRADATIONS[rng.integers(len(DEGRADATIONS))]
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    return tasks.rating(), [degrade(render(s, clean=True), kind, severity, generator)], tasks.levels[severity]


def _load_vlm_weights(model: torch.nn.Module, folder: str | Path) -> None:
    """Copy a saved toy-vlm's weights into ``model`` (the same architecture), or say what differs."""
    from transformers import LlavaForConditionalGeneration

    if not (Path(folder) / "config.json").exists():
        raise FileNotFoundError(f"init {str(folder)!r} is not a saved toy-vlm folder: config.json missing")
    saved = LlavaForConditionalGeneration.from_pretrained(str(folder)).state_dict()
    ours = model.state_dict()
    differs = sorted(
        name
        for name in ours.keys() | saved.keys()
        if name not in saved or name not in ours or saved[name].shape != ours[name].shape
    )
    if differs:
        raise ValueError(
            f"init {str(folder)!r} has another architecture than the recipe: {len(differs)} tensors differ, "
            f"e.g. {differs[:3]}"
        )
    model.load_state_dict(saved)


def train_vlm(
    recipe: VLMRecipe, bank: SceneBank | None = None, log: Callable[[str], None] = logger.info
) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """Train toy-vlm: (model, processor, log with ``losses``, ``seconds``, ``parameters``)."""
    from genalign.rewards.vlm import VLMJudge

    start = time.time()
    rng = np.random.default_rng(recipe.seed)
    if bank is None:
        bank = build_bank(train_prompts(), recipe.scenes_per_prompt, recipe.render_size, recipe.seed)
    model, processor = build_vlm(recipe)
    if recipe.init is not None:
        _load_vlm_weights(model, recipe.init)
    judge = VLMJudge(model, processor, batch_size=recipe.batch_size)
    tasks = VLMTasks(judge)
    model.train().requires_grad_(True)
    optimizer = torch.optim.AdamW(_parameter_groups(model, recipe), lr=recipe.lr, betas=(0.9, 0.98))
    mix = _task_mix(recipe)
    losses: list[float] = []
    caption_losses: list[float] = []
    question_losses: list[float] = []
    for step in range(recipe.steps):
        progress = training_progress(step, recipe.steps, start, recipe.max_minutes)
        if progress >= 1:
            break
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr * group["lr_scale"] * warmup_cosine(step, progress, recipe.warmup)
        texts, images, answers, yes_no = _vlm_batch(bank, recipe, rng, tasks, mix)
        inputs = judge.encode(texts, images)
        keep = {} if recipe.question_weight > 0 else {"logits_to_keep": 1}
        all_logits = model(**inputs, use_cache=False, **keep).logits
        answer_tensor = torch.tensor(answers)
        loss = answer_loss = F.cross_entropy(all_logits[:, -1].float(), answer_tensor)
        rows = torch.tensor(yes_no) & (answer_tensor == tasks.yes)
        if recipe.question_weight > 0 and rows.any():
            asked = question_loss(all_logits, inputs, model.config.image_token_id, rows)
            question_losses.append(float(asked.detach()))
            loss = loss + recipe.question_weight * asked
        if recipe.caption_weight > 0:
            described = _caption_task_loss(model, judge, bank, recipe, rng, tasks)
            caption_losses.append(float(described.detach()))
            loss = loss + recipe.caption_weight * described
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(answer_loss.detach()))
        if recipe.log_every and step % recipe.log_every == 0:
            recent = float(np.mean(losses[-recipe.log_every :]))
            described = (
                f" caption {np.mean(caption_losses[-recipe.log_every :]):.4f}" if caption_losses else ""
            )
            if question_losses:
                described += f" question {np.mean(question_losses[-recipe.log_every :]):.4f}"
            log(
                f"toy-vlm step {step} answer loss {answer_loss:.4f} (mean {recent:.4f}){described} "
                f"({time.time() - start:.0f}s)"
            )
    model.eval().requires_grad_(False)
    parameters = parameter_count(model)
    return (
        model,
        processor,
        {
            "losses": losses,
            "caption_losses": caption_losses,
            "question_losses": question_losses,
            "seconds": time.time() - start,
            "parameters": parameters,
            "steps": len(losses),
        },
    )


def _parameter_groups(model: torch.nn.Module, recipe: VLMRecipe) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices but not embeddings, biases or norms; the vision
    tower's learning rate scaled by ``recipe.vision_lr_scale`` (0 freezes it)."""
    if recipe.vision_lr_scale < 0:
        raise ValueError(f"vision_lr_scale must be >= 0, got {recipe.vision_lr_scale}")
    groups = []
    for vision in (False, True):
        named = [(n, p) for n, p in model.named_parameters() if ("vision_tower" in n) == vision]
        scale = recipe.vision_lr_scale if vision else 1.0
        if scale == 0:
            for _, param in named:
                param.requires_grad_(False)
            continue
        groups += [
            {
                "params": [p for n, p in named if p.ndim >= 2 and "embed" not in n],
                "weight_decay": recipe.weight_decay,
                "lr_scale": scale,
            },
            {
                "params": [p for n, p in named if not (p.ndim >= 2 and "embed" not in n)],
                "weight_decay": 0.0,
                "lr_scale": scale,
            },
        ]
    return groups


def _task_mix(recipe: VLMRecipe) -> np.ndarray:
    """The three tasks' probabilities (yes/no, comparative, rating), checked and normalised."""
    mix = np.asarray(recipe.task_mix, dtype=float)
    if mix.shape != (3,) or not np.isfinite(mix).all() or (mix < 0).any() or mix.sum() <= 0:
        raise ValueError(
            f"task_mix must be three non-negative shares (yes/no, comparative, rating) with a positive "
            f"sum, got {recipe.task_mix}"
        )
    return mix / mix.sum()


def _vlm_batch(
    bank: SceneBank, recipe: VLMRecipe, rng: np.random.Generator, tasks: VLMTasks, mix: np.ndarray
) -> tuple[list[str], list[list[torch.Tensor]], list[int], list[bool]]:
    """``recipe.batch_size`` training chats: (texts, their images, answer token ids, is yes/no)."""
    texts, images, answers, yes_no = [], [], [], []
    while len(texts) < recipe.batch_size:
        task = int(rng.choice(3, p=mix))
        example = _vlm_example(bank, recipe, rng, tasks, task)
        if example is not None:
            texts.append(example[0])
            images.append(example[1])
            answers.append(example[2])
            yes_no.append(task == 0)
    return texts, images, answers, yes_no


def _caption_task_loss(
    model: torch.nn.Module,
    judge: Any,
    bank: SceneBank,
    recipe: VLMRecipe,
    rng: np.random.Generator,
    tasks: VLMTasks,
) -> torch.Tensor:
    """LLaVA's captioning loss (:func:`caption_loss`) on ``recipe.caption_batch_size`` scenes."""
    chats, pictures, lengths = [], [], []
    for s in sample_scenes(bank, recipe.caption_batch_size, rng):
        text, length = tasks.description(bank.prompts[bank.prompt_index[int(s)]].caption)
        chats.append(text)
        pictures.append([_training_image(bank, int(s), recipe, rng)])
        lengths.append(length)
    return caption_loss(model, judge, chats, pictures, lengths)


def save_vlm(model: torch.nn.Module, processor: Any, folder: str | Path) -> Path:
    """``save_pretrained`` of model and processor: ``AutoModelForImageTextToText`` / ``AutoProcessor``."""
    folder = Path(folder)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
