"""The offline toy world: synthetic scenes of coloured shapes, GenEval-style captions and the
ShapesEval verifier (DESIGN.md, "The offline world").

- ``scenes``: :class:`Scene` / :class:`SceneObject`, SVG writing, rasterisation, random layouts
  and GenEval's relative-position rule.
- ``captions``: the six GenEval categories (Ghosh et al. 2023), caption templates, specs and a
  caption parser.
- ``prompts``: the fixed prompt sets (pretraining train / held-out; RL-train / RL-held-out inside
  the pretraining split; unseen combinations), scenes sampled for a prompt, JSONL files.
- ``paraphrase`` / ``rewriter``: captions reworded with their specs kept (synonyms, word order,
  verbose requests) and the toy prompt rewriter's recipe and measurements (PromptRL, issue #24).
- ``detection`` / ``shapes_eval``: reading scenes back from pixels; checking specs, GenEval-style
  accuracy, and the ``shapes_eval`` reward (registered on import; :mod:`genalign.rewards` lists it
  lazily).
- ``generators`` / ``reward_models``: the recipes of the shipped toy models (packages with a
  ``python -m`` command line each), sharing ``training`` (loop, EMA, schedule, model cards) and
  ``conversion`` (open_clip weights in transformers' layouts); ``eval_data`` builds assets/eval.
- ``video``: the toy video world (moving shapes, motion captions and splits, the video verifier and
  its ``toy_video_eval`` reward, ``(frames, caption)`` training data); import it from
  ``genalign.toy.video``.

    >>> from genalign.toy import sample_scene_for_prompt, render_scene, evaluate
    >>> scene, caption, spec = sample_scene_for_prompt("position", rng=0)
    >>> image = render_scene(scene, size=64)          # [3, 64, 64] in [0, 1]
    >>> evaluate(image[None], [spec])["overall"]
    1.0
"""

from __future__ import annotations

from genalign.toy.captions import (
    CATEGORIES,
    CaptionParseError,
    caption_for_spec,
    parse_caption,
    validate_spec,
)
from genalign.toy.prompts import (
    PromptSpec,
    all_prompts,
    export_prompt_sets,
    heldout_prompts,
    is_heldout,
    prompts_for,
    read_jsonl,
    rl_heldout_prompts,
    rl_train_prompts,
    sample_scene_for_prompt,
    scene_for_spec,
    train_prompts,
    unseen_combination_prompts,
    write_jsonl,
)
from genalign.toy.scenes import (
    COLOURS,
    PALETTE,
    RELATIONS,
    SHAPES,
    Scene,
    SceneObject,
    layout_objects,
    relative_position,
    render_scene,
    render_scenes,
    sample_scene,
)
from genalign.toy.shapes_eval import (
    DetectedObject,
    ShapesEvalConfig,
    ShapesEvalReward,
    SpecCheck,
    check_spec,
    detect_objects,
    evaluate,
)

__all__ = [
    "CATEGORIES",
    "COLOURS",
    "PALETTE",
    "RELATIONS",
    "SHAPES",
    "CaptionParseError",
    "DetectedObject",
    "PromptSpec",
    "Scene",
    "SceneObject",
    "ShapesEvalConfig",
    "ShapesEvalReward",
    "SpecCheck",
    "all_prompts",
    "caption_for_spec",
    "check_spec",
    "detect_objects",
    "evaluate",
    "export_prompt_sets",
    "heldout_prompts",
    "is_heldout",
    "layout_objects",
    "parse_caption",
    "prompts_for",
    "read_jsonl",
    "relative_position",
    "render_scene",
    "render_scenes",
    "rl_heldout_prompts",
    "rl_train_prompts",
    "sample_scene",
    "sample_scene_for_prompt",
    "scene_for_spec",
    "train_prompts",
    "unseen_combination_prompts",
    "validate_spec",
    "write_jsonl",
]
