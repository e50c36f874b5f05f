"""Model cards of the toy reward models: ``card.json`` (recipe, training, eval settings and scores)
and the README rendered from it."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from genalign.toy.prompts import heldout_prompts
from genalign.toy.reward_models.evaluate import EVAL_PER_CATEGORY, EVAL_SEED, subset_indices
from genalign.toy.training import folder_megabytes, write_card_files


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{100 * value:.1f}%" if "accuracy" in key or "within" in key else f"{value:.3f}"
    return str(value)


_EVAL_NOTES = {
    "toy-clip": "Pair accuracy: cosine(image, true caption) > cosine(image, one-attribute-changed caption). "
    "Retrieval: the best of all 208 held-out captions is true of the scene (checked on the scene).",
    "toy-vlm": "Yes/no on the noisy renders with a threshold of 0.5 on P(yes)/(P(yes)+P(no)) for the true, the "
    "one-attribute-changed and a random false held-out caption; pair = P(yes|true) > P(yes|changed). Comparative: "
    "(noisy render of the prompt vs clean render of the changed caption) and (clean vs blur severity 3), both "
    "orders, correct when P(yes) is on the right side of 0.5. Rating: renders degraded by one of blur / noise / "
    "JPEG / downsampling at severity 0-4 (case index mod 5); accuracy = most likely level word is the severity's; "
    "Spearman between the Q-Align score and -severity.",
}


def write_card(
    name: str,
    folder: str | Path,
    recipe: Any,
    training: dict[str, Any],
    scores: dict[str, Any],
    subset: dict[str, float],
    command: str,
) -> None:
    """``card.json`` (recipe, training, eval settings and scores) and a ``README.md`` from it."""
    folder = Path(folder)
    eval_settings = {
        "eval_set": "genalign.toy.reward_models.heldout_eval_set",
        "seed": EVAL_SEED,
        "per_category": EVAL_PER_CATEGORY,
        "categories": sorted({p.category for p in heldout_prompts()}),
        "subset_indices": subset_indices(),
        "subset_tolerance": 2e-3,
        "renderer": "cairosvg, 64 px",
        "noisy": "Gaussian blur sigma 0.8 px + Gaussian noise std 0.03",
    }
    card = {
        "name": name,
        "command": command,
        "recipe": asdict(recipe),
        "parameters": training["parameters"],
        "training_seconds": round(training["seconds"], 1),
        "training": training,
        "size_mb": folder_megabytes(folder, megabyte=1e6),
        "eval": eval_settings,
        "scores": scores,
        "subset_scores": subset,
    }
    lines = [
        f"# {name}",
        "",
        *_introduction(name, recipe),
        *_recipe_and_scores(name, card, training, scores, subset, command),
    ]
    write_card_files(folder, card, "\n".join(lines))


def _introduction(name: str, recipe: Any) -> list[str]:
    """What the model is, how to load it and how it was trained."""
    lines: list[str] = []
    if name == "toy-clip":
        lines += [
            "An open_clip CLIP trained from scratch on the toy shape world (genalign issue #6) to serve as a",
            "reward (`clip`) in toy RL runs. Load it with",
            '`load_reward("clip", model="local-dir:assets/models/toy-clip", pretrained=None)`',
            '(add `convention="cosine"` for the raw cosine).',
            "",
            "Training: symmetric InfoNCE over all 400 train captions with every caption true of a scene as",
            "a positive, plus NegCLIP-style hard negatives (the same scene with one colour, count, shape or",
            "relation changed); augmented renders (colour jitter, blur, noise, JPEG, down-up, 48 px).",
            "Weights are stored in float16 (open_clip hub layout).",
        ]
    else:
        lines += [
            "A LLaVA-style VLM (CLIP vision tower, Qwen2 LM) trained on the toy shape world",
            '(genalign issue #6) to serve as a judge: `load_reward("vlm_yes", model="assets/models/toy-vlm")`',
            '(VQAScore), `mode="comparative"` (RewardDance) and `load_reward("iqa", model=..., preset="qalign")`.',
            "",
            "Training: next-token cross-entropy on the answer token of (a) VQAScore yes/no questions (true,",
            "one-attribute-changed and random captions), (b) RewardDance comparisons (prompt match, less",
            "degraded) and (c) Q-Align ratings of renders degraded by blur/noise/JPEG/downsampling at",
            "severities 0-4 (excellent ... bad).",
        ]
        if recipe.vision_init:
            frozen = "frozen" if recipe.vision_lr_scale == 0 else f"lr x{recipe.vision_lr_scale:g}"
            lines += [
                f"The vision tower starts from toy-clip's image encoder ({recipe.vision_init}, {frozen}); the",
                "projector and the LM are trained from scratch.",
            ]
        if recipe.question_weight > 0:
            lines += [
                f"Plus (weight {recipe.question_weight:g}) a next-token loss on the question of every true yes/no",
                "chat: the quoted caption predicted from the image. Without it the answer token stayed at its",
                "prior; see `VLMRecipe.question_weight`.",
            ]
        if recipe.caption_weight > 0:
            lines += [
                f"Plus (weight {recipe.caption_weight:g}) LLaVA's captioning task on every caption token."
            ]
    return lines


def _recipe_and_scores(
    name: str,
    card: dict[str, Any],
    training: dict[str, Any],
    scores: dict[str, Any],
    subset: dict[str, float],
    command: str,
) -> list[str]:
    """The recipe's commands, the training record and the held-out scores as a table."""
    lines = [
        "",
        "Data: scenes of `genalign.toy.train_prompts()` only; held-out prompts are never seen.",
        "",
        "## Recipe",
        "",
        *(f"    {line}" for line in command.splitlines()),
        "",
        f"Parameters: {training['parameters']:,}; size on disk {card['size_mb']} MB; training time "
        f"{training['seconds'] / 60:.1f} min ({training['steps']} steps) on one CPU thread of a shared, loaded machine; loss "
        f"{training['first_loss']:.3f} (first 50 steps) -> {training['final_loss']:.3f} (last 50).",
        "",
        "## Scores (held-out prompts)",
        "",
        f'Measured by `evaluate_reward_model("{name}", <folder>)` on `heldout_eval_set()`: {EVAL_PER_CATEGORY} cases per',
        "held-out category (seed {EVAL_SEED}, cairosvg 64 px); 'noisy' = blur 0.8 px + noise 0.03.".replace(
            "{EVAL_SEED}", str(EVAL_SEED)
        ),
        "",
        _EVAL_NOTES[name],
        "",
        "| metric | value |",
        "|---|---|",
    ]
    for key, value in scores.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {_fmt(key, v)}" for k, v in value.items())
        else:
            value = _fmt(key, value)
        lines.append(f"| {key} | {value} |")
    lines += [
        "",
        f"Subset scores (cases {subset_indices()}; tests reproduce them within 2e-3): "
        + ", ".join(f"{k} {v:.4f}" for k, v in subset.items()),
        "",
    ]
    return lines


def continued_record(
    previous: dict[str, Any], command: str, training: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The card record of a run continued from a model whose card is ``previous``: every stage's
    command (one per line, first to last), the steps and seconds of all stages, the first stage's
    first loss and this stage's final loss."""
    before = previous["training"]
    total = dict(training, first_loss=before["first_loss"])
    for key in ("seconds", "steps"):
        total[key] = training[key] + before[key]
    return f"{previous['command']}\n{command}", total
