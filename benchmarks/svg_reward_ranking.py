"""Does `svg_fidelity` rank an SVG writer's samples the way the verifier does? (issue #25)

RL with group advantages only sees the reward's ranking *within* a group of completions for one
input. This script draws ``--group`` completions per toy scene from a writer at RL's sampling
temperature (RLRF's 1.1), scores each with the RL recipe's ``svg_fidelity`` (every term) and
renders it for ShapesEval (the verifier; never a reward), then reports, per term:

* the within-group AUC against the verifier: P(a correct sample's term > a wrong one's) over the
  groups holding both (0.5: the term carries no signal about correctness; GRPO then pushes the
  policy in directions the verifier does not care about);
* best of group: over the mixed groups, the share whose top-scored sample is correct (what
  best-of-G selection with the term would get);
* the mean within-group std (the signal's scale, the unit group advantages divide by) and the
  fraction of groups with both a correct and a wrong sample (where the verifier has anything to
  say).

    python benchmarks/svg_reward_ranking.py --model assets/models/toy-svg-writer --scenes 96 --group 8

``--semantic NAME=FOLDER`` (repeatable) also scores with another image tower for the semantic term
(an open_clip folder, e.g. ``assets/models/toy-dreamsim``): columns ``semantic:NAME`` and
``score:NAME`` (the recipe's weights with that tower). ``--truth scene`` ranks against scene match
(the render holds exactly the target's objects) instead of ShapesEval's verdict. ``--judge
NAME=FOLDER`` (repeatable) adds a pair judge's term (``svg_fidelity``'s ``judge``, ``2 p - 1``, the
floor for a failed SVG) as ``judge:NAME``, and ``score:NAME+judgeW``: the recipe's four terms plus
the judge at weight ``--judge-weight`` W.

``--recipe FILE`` scores with that training recipe's own reward (its ``reward.name`` and
``reward.kwargs``) as the column ``reward``, on the recipe's task (``train.svg.task``): for
text-to-SVG, ``configs/toy/rlrf_text2svg.yaml`` (toy-vlm's VQAScore of the render plus the length
term), the writer ``assets/models/toy-svg-writer-t2s``. ``--truth exact`` ranks against ShapesEval
with no extra objects (the verdict adding shapes cannot pass), and ``--valid-only`` computes every
AUC among the samples that render: a broken SVG is wrong and scores the floor, which would count as
ranking. docs/language.md section 5.13 reports::

    python benchmarks/svg_reward_ranking.py --recipe configs/toy/rlrf_text2svg.yaml \
        --model assets/models/toy-svg-writer-t2s --scenes 192 --seed 7 --truth exact --valid-only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toy_reward_ranking import within_prompt_auc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TERMS = ("score", "image", "edge", "semantic", "length")


def ranking_rows(
    model: str,
    scenes: int,
    group: int,
    temperature: float,
    seed: int,
    split: str,
    semantic: dict[str, str] | None = None,
    truth: str = "correct",
    judges: dict[str, str] | None = None,
    judge_weight: float = 4.0,
    task: str = "image_to_svg",
    recipe_reward: Any = None,
) -> list[dict]:
    """One row per completion: scene id, category, verifier verdict, scene match, whether it renders
    and every reward term (``semantic``: more image towers, ``{name: folder}``; ``recipe_reward``: a
    loaded reward, the column ``reward``); ``correct`` is ``truth``'s verdict."""
    from genalign.toy.svg_eval import (
        SVGEvalSet,
        default_reward,
        load_svg_writer,
        score_svgs,
        svg_eval_set,
        write_svgs,
    )

    base = svg_eval_set(scenes, seed=seed, split=split, task=task)
    index = [i for i in range(len(base)) for _ in range(group)]
    repeated = SVGEvalSet(
        [base.prompts[i] for i in index],
        base.images[index],
        [base.reference_svgs[i] for i in index],
        [base.specs[i] for i in index],
        base.task,
    )
    svgs = write_svgs(load_svg_writer(model), repeated, temperature=temperature, seed=seed)
    measures = score_svgs(svgs, repeated, default_reward())
    extra = {}  # other towers change only the semantic term and the score: no second verdict
    for name, folder in (semantic or {}).items():
        out = default_reward(folder)(
            svgs, repeated.prompts, targets=repeated.images, reference_svgs=repeated.reference_svgs
        )
        extra[name] = {"semantic": out.details["semantic"].tolist(), "score": out.scores.tolist()}
    judged = {}
    for name, folder in (judges or {}).items():
        from genalign.rewards import load_reward

        reward = load_reward("svg_fidelity", weights={"image": 1.0, "judge": 1.0}, judge=folder)
        out = reward(svgs, repeated.prompts, targets=repeated.images, reference_svgs=repeated.reference_svgs)
        judged[name] = out.details["judge"].tolist()
    recipe_scores = None
    if recipe_reward is not None:
        out = recipe_reward(
            svgs, repeated.prompts, targets=repeated.images, reference_svgs=repeated.reference_svgs
        )
        recipe_scores = out.scores.float().tolist()
    verdict = {"correct": "shapes_eval", "scene": "scene_match", "exact": "shapes_eval_exact"}[truth]
    rows = []
    for k, scene in enumerate(index):
        row = {"prompt": f"scene-{scene}", "category": measures["category"][k]}
        row["correct"] = bool(measures[verdict][k])
        row["valid"] = bool(measures["valid"][k])
        if recipe_scores is not None:
            row["reward"] = recipe_scores[k]
        row |= {term: measures[term][k] for term in TERMS if term in measures}
        for name, other in extra.items():
            row |= {f"semantic:{name}": other["semantic"][k], f"score:{name}": other["score"][k]}
        for name, values in judged.items():
            four = sum(measures[t][k] for t in ("image", "edge", "semantic", "length"))
            row[f"judge:{name}"] = values[k]
            row[f"score:{name}+judge{judge_weight:g}"] = (four + judge_weight * values[k]) / (
                4 + judge_weight
            )
        rows.append(row)
    return rows


def summarise(rows: list[dict], valid_only: bool = False) -> dict[str, dict]:
    """Per term: the within-group AUC against the verifier (overall and per category) and the mean
    within-group std; and how many groups are mixed (both a correct and a wrong sample).
    ``valid_only``: the rows of SVGs that render only (``groups`` then also counts the validity)."""
    validity = statistics.fmean(r["valid"] for r in rows) if rows and "valid" in rows[0] else None
    if valid_only:
        rows = [r for r in rows if r["valid"]]
    if not rows:
        return {"groups": {"all": 0, "mixed": 0, "verifier": None, "validity": validity}}
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["prompt"], []).append(row)
    mixed = sum(len({r["correct"] for r in g}) == 2 for g in groups.values())
    out: dict[str, dict] = {
        "groups": {
            "all": len(groups),
            "mixed": mixed,
            "verifier": statistics.fmean(r["correct"] for r in rows),
            **({} if validity is None else {"validity": validity}),
        }
    }
    for term in [*TERMS, "reward", *(k for k in rows[0] if ":" in k)]:
        if term not in rows[0]:
            continue
        table = within_prompt_auc(rows, term)
        weights = [(a, n) for a, n in table.values()]
        total = sum(n for _, n in weights)
        tops = [
            max(g, key=lambda r: r[term])["correct"]
            for g in groups.values()
            if len({r["correct"] for r in g}) == 2
        ]
        out[term] = {
            "auc": sum(a * n for a, n in weights) / total if total else None,
            "best_of_group": statistics.fmean(tops) if tops else None,
            "auc_per_category": {c: round(a, 3) for c, (a, _) in table.items()},
            "within_group_std": statistics.fmean(
                statistics.pstdev(r[term] for r in g) for g in groups.values()
            ),
        }
    return out


def recipe_reward_and_task(recipe: str) -> tuple[str, Any]:
    """A training recipe's reward, loaded as the trainer loads it, and its SVG task."""
    from genalign.rewards import load_reward
    from genalign.trainers import load_recipe
    from genalign.trainers.recipe_paths import resolve_recipe_paths

    config = resolve_recipe_paths(load_recipe(recipe), Path(recipe).parent)
    task = config.train.svg.task if config.train.svg is not None else "image_to_svg"
    return task, load_reward(config.reward.name, **config.reward.kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(ROOT / "assets/models/toy-svg-writer"))
    parser.add_argument("--scenes", type=int, default=96, help="scenes (the split's categories in turn)")
    parser.add_argument("--group", type=int, default=8, help="completions per scene (the RL recipe's group)")
    parser.add_argument("--temperature", type=float, default=1.1, help="RLRF's sampling temperature")
    parser.add_argument("--split", default="rl_train")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="also write the per-sample rows here (JSON)")
    parser.add_argument(
        "--semantic",
        action="append",
        default=[],
        metavar="NAME=FOLDER",
        help="also score with this open_clip folder as the semantic term's tower (repeatable)",
    )
    parser.add_argument(
        "--judge",
        action="append",
        default=[],
        metavar="NAME=FOLDER",
        help="also score with this pair judge folder (svg_fidelity's judge term; repeatable)",
    )
    parser.add_argument(
        "--judge-weight", type=float, default=4.0, help="the judge's weight in score:NAME+judgeW"
    )
    parser.add_argument(
        "--truth",
        choices=("correct", "scene", "exact"),
        default="correct",
        help="rank against ShapesEval's verdict, scene match, or ShapesEval with no extra objects",
    )
    parser.add_argument("--recipe", help="also score with this training recipe's reward, on its task")
    parser.add_argument("--valid-only", action="store_true", help="AUCs among the SVGs that render")
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.semantic + args.judge):
        parser.error("--semantic and --judge take NAME=FOLDER")
    if args.scenes <= 0 or args.group < 2:
        parser.error("--scenes must be positive and --group at least 2")
    torch.set_num_threads(args.threads)
    semantic = dict(item.split("=", 1) for item in args.semantic)
    task, recipe_reward = "image_to_svg", None
    if args.recipe:
        task, recipe_reward = recipe_reward_and_task(args.recipe)
    rows = ranking_rows(
        args.model,
        args.scenes,
        args.group,
        args.temperature,
        args.seed,
        args.split,
        semantic,
        args.truth,
        dict(item.split("=", 1) for item in args.judge),
        args.judge_weight,
        task,
        recipe_reward,
    )
    if args.out:
        Path(args.out).write_text(json.dumps(rows) + "\n", encoding="utf-8")
    print(json.dumps(summarise(rows, args.valid_only), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
