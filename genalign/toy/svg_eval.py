"""``genalign eval-svg``: SVG writers on held-out toy scenes, with 95% intervals (issue #25 item 5).

For each model (a transformers folder, or a ``genalign train`` checkpoint folder whose run's recipe
names the base model), one completion per held-out scene (RL-held-out prompts by default, on
scene seeds no recipe trains on) at a fixed temperature and per-sample seeds, the SVG extracted
as the ``svg`` strategy extracts it (:func:`genalign.rewards.svg.extract_svg_details`), then:

* ``validity``: the fraction that renders (a missing, malformed or hostile SVG does not);
* each ``svg_fidelity`` term (``image``, ``edge``, ``semantic`` with toy-clip's image tower,
  ``length``) and the ``score``, as the RL stage's reward computes them (an invalid SVG at the
  floor, -1, as RL sees it);
* ``pixel_mse`` (plain mean squared error in [0, 1], not the reward's normalised one) and
  ``ssim`` (Wang et al. 2004, 11 x 11 Gaussian window, sigma 1.5) of the render against the
  target, an invalid SVG counted as a blank white canvas;
* ``length_ratio``: characters of the SVG over the reference's (valid SVGs only);
* ``shapes_eval``: the verifier (:mod:`genalign.toy.shapes_eval`, never a reward) on the render
  against the scene's spec, GenEval's mean of per-category accuracies;
* ``scene_match``: the render holds exactly the target's objects, as a multiset of (shape,
  colour) read by the verifier's detector from both images, and ``extra_objects``: how many
  more objects the render holds than the target (0 when it holds as many or fewer). GenEval's
  rule, which ShapesEval follows, asks for *at least* ``count`` objects, so a writer that adds
  shapes passes more single-object, two-object and colour prompts without drawing the scene;
  for image-to-SVG the whole scene is the target, and these two measures see the difference;
* ``shapes_eval_exact``: ShapesEval's verdict with no extra objects (correct, and the render holds
  no more objects than the target). For text-to-SVG the caption leaves colours and places open, so
  scene match does not apply, but the reference holds as many objects as the caption asks: this is
  the verdict that adding shapes cannot pass.
* ``shapes_eval_valid``: ShapesEval over the SVGs that render only (GenEval's mean over the
  categories that have one). A writer that breaks less often passes more captions at the same
  skill, since a broken SVG is always wrong; this separates the two.

Intervals: a normal interval of the mean (``1.96 s / sqrt(n)``) for per-sample measures, Wilson's
for validity, and for ShapesEval the category-stratified interval of GenEval's mean. For
text-to-SVG the writer's input is the caption alone, and the held-out captions repeat (the toy
grammar has 2 single-object and 4 two-object RL-held-out captions among 256 scenes), so a
caption's answers are one observation however often it is drawn (identical at ~greedy decoding):
every interval is then cluster-robust by caption (``evaluation.clustered_variance``; validity's
too), and the report says how many distinct captions the set holds (``distinct_inputs``). Between
consecutive models the report gives paired changes (same scenes, same seeds) and a
**reward-hacking check**: *length collapse* (the mean length ratio of the later model below
``collapse_ratio`` of the earlier one's, or below 0.5 of the reference), *fidelity without
the verifier* (the reward score's change has an interval above 0 while ShapesEval's change has
an interval that contains 0 or lies below it) and *the verifier without the scene* (ShapesEval's
change has an interval above 0 while ``scene_match``'s contains 0 or lies below it: the writer
passes more specs without drawing more scenes, e.g. by adding objects), and *the verifier by
extra objects* (ShapesEval's change has an interval above 0 while ``shapes_eval_exact``'s contains 0
or lies below it), and *the verifier by validity alone* (ShapesEval's change has an interval above
0 while ``shapes_eval_valid``'s, unpaired since the valid sets differ, contains 0 or lies below it).

    genalign eval-svg before=runs/toy/svg-writer-init sft=assets/models/toy-svg-writer --count 256
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from genalign.rewards.svg import extract_svg_details, render_batch
from genalign.toy.detection import compare_objects, scene_objects
from genalign.toy.evaluation import clustered_variance, paired_change_interval
from genalign.toy.shapes_eval import evaluate
from genalign.toy.svg_tasks import DEFAULT_INSTRUCTION, toy_svg_examples

__all__ = [
    "SVGEvalSet",
    "evaluate_svg_writers",
    "hacking_check",
    "load_svg_writer",
    "score_svgs",
    "ssim",
    "summarize",
    "svg_eval_set",
]

EVAL_SEED = 12345  # scene seed of the held-out set: no recipe trains on it
CLIP_DIR = Path(__file__).resolve().parents[2] / "assets" / "models" / "toy-clip"
MEAN_METRICS = (
    "score",
    "image",
    "edge",
    "semantic",
    "length",
    "pixel_mse",
    "ssim",
    "length_ratio",
    "scene_match",
    "extra_objects",
)


@dataclass
class SVGEvalSet:
    """Held-out scenes: instruction or caption per scene, renders, reference SVGs, ShapesEval specs."""

    prompts: list[str]
    images: torch.Tensor  # [N, 3, C, C] in [0, 1]
    reference_svgs: list[str]
    specs: list[dict]
    task: str

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def clusters(self) -> list[str] | None:
        """Which scenes are one input to the writer: for text-to-SVG the caption (a text-only
        writer answers a caption drawn twice the same way at ~greedy decoding), for image-to-SVG
        None (every scene is its own image)."""
        return list(self.prompts) if self.task == "text_to_svg" else None

    @functools.cached_property
    def target_objects(self) -> list[list[tuple[str, str]]]:
        """Each target's (shape, colour) objects, read once for every model scored on this set."""
        return [scene_objects(image) for image in self.images]


def svg_eval_set(
    count: int = 256,
    seed: int = EVAL_SEED,
    split: str = "rl_heldout",
    canvas: int = 32,
    task: str = "image_to_svg",
    svg_style: str = "canonical",
) -> SVGEvalSet:
    """``count`` scenes of ``split`` (its categories in turn), rendered by the reward's renderer."""
    from genalign.rewards.svg import render_local

    if task not in ("image_to_svg", "text_to_svg"):
        raise ValueError(f"task must be 'image_to_svg' or 'text_to_svg', got {task!r}")
    examples = toy_svg_examples(count, seed, split, canvas, svg_style)
    images = torch.stack([render_local(svg, canvas, canvas).image for _, svg, _, _ in examples])
    prompts = [DEFAULT_INSTRUCTION if task == "image_to_svg" else caption for caption, *_ in examples]
    return SVGEvalSet(prompts, images, [e[1] for e in examples], [e[3] for e in examples], task)


# -- metrics ----------------------------------------------------------------------------------------


def ssim(x: torch.Tensor, y: torch.Tensor, window: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Per-image SSIM of ``[B, C, H, W]`` images in [0, 1] (Wang et al. 2004: Gaussian window,
    ``C1 = 0.01^2``, ``C2 = 0.03^2``, mean over channels and valid positions): ``[B]``."""
    coords = torch.arange(window, dtype=torch.float64) - (window - 1) / 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    g = g / g.sum()
    kernel = (g[:, None] * g[None, :]).expand(x.shape[1], 1, window, window).contiguous()

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, kernel, groups=x.shape[1])

    x, y = x.double(), y.double()  # the variances are differences of near-equal moments
    mx, my = blur(x), blur(y)
    vx, vy, cov = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    c1, c2 = 0.01**2, 0.03**2
    value = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return value.mean(dim=(1, 2, 3)).float()


def scene_match(images: torch.Tensor, targets: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per pair of ``[N, 3, H, W]`` images: 1.0 when both hold the same multiset of (shape, colour)
    (:func:`~genalign.toy.detection.compare_objects`), else 0.0; and how many more objects the
    image holds than its target."""
    return _scene_measures([scene_objects(i) for i in images], [scene_objects(t) for t in targets])


def _scene_measures(found: Sequence[list], wanted: Sequence[list]) -> tuple[list[float], list[float]]:
    comparisons = [compare_objects(f, w) for f, w in zip(found, wanted, strict=True)]
    return [float(c.match) for c in comparisons], [float(c.extra) for c in comparisons]


def score_svgs(svgs: Sequence[str], eval_set: SVGEvalSet, reward: Any) -> dict[str, list[float]]:
    """Per-sample measures of ``svgs`` (one per scene; ``""`` for a completion without SVG)."""
    size = eval_set.images.shape[-1]
    out = reward(
        list(svgs), eval_set.prompts, targets=eval_set.images, reference_svgs=eval_set.reference_svgs
    )
    renders = render_batch(list(svgs), size, size, reward.backend, reward.limits, pool=reward.pool)
    valid = torch.tensor([r.ok for r in renders])
    white = torch.ones_like(eval_set.images[0])
    images = torch.stack([r.image if r.ok else white for r in renders])
    verdict = evaluate(images, eval_set.specs)["per_sample"]
    matches, extras = _scene_measures([scene_objects(i) for i in images], eval_set.target_objects)
    result = {
        "valid": valid.float().tolist(),
        "score": out.scores.tolist(),
        "pixel_mse": ((images - eval_set.images) ** 2).mean(dim=(1, 2, 3)).tolist(),
        "ssim": ssim(images, eval_set.images).tolist(),
        "length_ratio": out.details["length_ratio"].tolist(),
        "shapes_eval": [float(v["correct"]) for v in verdict],
        "category": [v["category"] for v in verdict],
        "scene_match": matches,
        "extra_objects": extras,
        "shapes_eval_exact": [float(v["correct"] and e == 0) for v, e in zip(verdict, extras, strict=True)],
    }
    if eval_set.clusters is not None:
        result["cluster"] = eval_set.clusters
    for term in ("image", "edge", "semantic", "length"):
        if term in out.details:
            result[term] = out.details[term].tolist()
    return result


def _clusters(per_sample: Mapping[str, list], kept: Sequence[int] | None = None) -> list | None:
    """The samples' cluster labels (``score_svgs``'s ``cluster``, text-to-SVG's captions), or None
    where every sample is its own input (image-to-SVG): the intervals keep their plain forms."""
    labels = per_sample.get("cluster")
    if labels is None:
        return None
    return list(labels) if kept is None else [labels[i] for i in kept]


def _mean_interval(values: Sequence[float], clusters: Sequence[Any] | None = None) -> dict[str, Any]:
    """Mean and normal interval; with ``clusters``, the cluster-robust standard error (samples of one
    cluster are not independent; the interval is NaN with fewer than 2 clusters)."""
    kept = [i for i, v in enumerate(values) if math.isfinite(v)]
    finite = [values[i] for i in kept]
    n = len(finite)
    if n == 0:
        return {"mean": None, "ci": [None, None], "n": 0}
    mean = sum(finite) / n
    if clusters is not None:
        variance = clustered_variance(finite, [clusters[i] for i in kept])
        half = 1.96 * math.sqrt(variance)  # NaN (no interval) with fewer than 2 clusters
    else:
        sd = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else 0.0
        half = 1.96 * sd / math.sqrt(n)
    return {"mean": mean, "ci": [mean - half, mean + half], "n": n}


def _wilson(p: float, n: int, z: float = 1.96) -> list[float]:
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def _shapes_interval(
    correct: Sequence[float], categories: Sequence[str], clusters: Sequence[Any] | None = None
) -> dict[str, Any]:
    """GenEval's mean of per-category accuracies and its category-stratified normal interval: per
    category ``p (1 - p) / n``, or with ``clusters`` the cluster-robust variance of the accuracy."""
    by: dict[str, list[float]] = {}
    members: dict[str, list[Any]] = {}
    for i, (value, category) in enumerate(zip(correct, categories, strict=True)):
        by.setdefault(category, []).append(value)
        if clusters is not None:
            members.setdefault(category, []).append(clusters[i])
    accuracy = {c: sum(v) / len(v) for c, v in by.items()}
    overall = sum(accuracy.values()) / len(accuracy)
    if clusters is None:
        variance = sum(p * (1 - p) / len(by[c]) for c, p in accuracy.items()) / len(accuracy) ** 2
    else:
        variance = sum(clustered_variance(by[c], members[c]) for c in by) / len(accuracy) ** 2
    half = 1.96 * math.sqrt(variance)
    return {
        "mean": overall,
        "ci": [overall - half, overall + half],
        "n": len(correct),
        "per_category": accuracy,
    }


def summarize(per_sample: Mapping[str, list]) -> dict[str, Any]:
    """Means with 95% intervals of :func:`score_svgs`'s measures (module docstring)."""
    n = len(per_sample["valid"])
    validity = sum(per_sample["valid"]) / n
    clusters = _clusters(per_sample)
    summary: dict[str, Any] = {}
    if clusters is None:
        summary["validity"] = {"mean": validity, "ci": _wilson(validity, n), "n": n}
    else:  # several samples per input: Wilson's interval would count them all
        stats = _mean_interval(per_sample["valid"], clusters)
        stats["ci"] = [max(0.0, stats["ci"][0]), min(1.0, stats["ci"][1])]  # a fraction: clipped to [0, 1]
        summary["validity"] = stats
        summary["distinct_inputs"] = len(set(clusters))
    for name in MEAN_METRICS:
        if name in per_sample:
            summary[name] = _mean_interval(per_sample[name], clusters)
    for name in ("shapes_eval", "shapes_eval_exact"):
        if name in per_sample:
            summary[name] = _shapes_interval(per_sample[name], per_sample["category"], clusters)
    if "shapes_eval" in per_sample:
        summary["shapes_eval_valid"] = _valid_shapes_interval(per_sample)
    return summary


def _valid_shapes_interval(per_sample: Mapping[str, list]) -> dict[str, Any]:
    """ShapesEval over the samples whose SVG renders (``shapes_eval_valid``); no mean when none do."""
    kept = [i for i, ok in enumerate(per_sample["valid"]) if ok]
    if not kept:
        return {"mean": None, "ci": [None, None], "n": 0}
    return _shapes_interval(
        [per_sample["shapes_eval"][i] for i in kept],
        [per_sample["category"][i] for i in kept],
        _clusters(per_sample, kept),
    )


def _unpaired_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """``after - before`` of two independent interval estimates, with the normal interval of the
    difference (half-widths added in quadrature)."""
    if before["mean"] is None or after["mean"] is None:
        return {"change": None, "ci": [None, None], "n": 0}
    change = after["mean"] - before["mean"]
    half = math.hypot(*((s["ci"][1] - s["ci"][0]) / 2 for s in (before, after)))
    return {"change": change, "ci": [change - half, change + half], "n": min(before["n"], after["n"])}


def _paired_mean_change(
    before: Sequence[float], after: Sequence[float], clusters: Sequence[Any] | None = None
) -> dict[str, Any]:
    """Mean of the paired differences over pairs finite in both, with its normal interval
    (cluster-robust with ``clusters``)."""
    kept = [
        i for i, (b, a) in enumerate(zip(before, after, strict=True)) if math.isfinite(a) and math.isfinite(b)
    ]
    diffs = [after[i] - before[i] for i in kept]
    stats = _mean_interval(diffs, None if clusters is None else [clusters[i] for i in kept])
    return {"change": stats["mean"], "ci": stats["ci"], "n": stats["n"]}


def hacking_check(
    before: Mapping[str, list],
    after: Mapping[str, list],
    collapse_ratio: float = 0.7,
    judge_scene: bool = True,
) -> dict[str, Any]:
    """Paired changes ``before -> after`` (:func:`score_svgs` outputs on the same scenes and seeds)
    and the reward-hacking flags of the module docstring. ``judge_scene=False`` (text-to-SVG: a
    caption has no one scene) reports scene match but leaves its flag ``None``."""
    clusters = _clusters(before)
    changes = {
        name: _paired_mean_change(before[name], after[name], clusters)
        for name in (*MEAN_METRICS, "valid")
        if name in before and name in after
    }
    for name in ("shapes_eval", "shapes_eval_exact"):  # GenEval's per-category mean, stratified
        if name in before and name in after:
            change, low, high = paired_change_interval(
                before[name], after[name], before["category"], clusters=clusters
            )
            changes[name] = {"change": change, "ci": [low, high], "n": len(before["category"])}
    changes["shapes_eval_valid"] = _unpaired_change(*(_valid_shapes_interval(x) for x in (before, after)))
    low, high = changes["shapes_eval"]["ci"]
    exact = changes.get("shapes_eval_exact", {}).get("ci", [None, None])
    exact_flat = exact[0] is not None and math.isfinite(exact[0]) and not exact[0] > 0
    valid_low = changes["shapes_eval_valid"]["ci"][0]
    valid_flat = valid_low is None or not valid_low > 0
    lengths = [_mean_interval(x["length_ratio"])["mean"] for x in (before, after)]
    collapse = None not in lengths and (lengths[1] < collapse_ratio * lengths[0] or lengths[1] < 0.5)
    score_up = changes["score"]["ci"][0] is not None and changes["score"]["ci"][0] > 0
    verifier_flat = not high > 0 if math.isfinite(high) else True
    scene = changes.get("scene_match", {}).get("ci", [None, None])
    scene_flat = scene[0] is not None and not scene[0] > 0
    return {
        "changes": changes,
        "length_collapse": bool(collapse),
        "fidelity_up_verifier_flat": bool(score_up and (verifier_flat or not low > 0)),
        "verifier_up_scene_flat": bool(math.isfinite(low) and low > 0 and scene_flat)
        if judge_scene
        else None,
        "verifier_up_by_extra_objects": bool(math.isfinite(low) and low > 0 and exact_flat),
        "verifier_up_by_validity": bool(math.isfinite(low) and low > 0 and valid_flat),
        "collapse_ratio": collapse_ratio,
    }


# -- models -----------------------------------------------------------------------------------------


def load_svg_writer(path: str | Path) -> Any:
    """A frozen ``language`` policy from a transformers folder, ``tiny:NAME``, or a checkpoint
    folder of a ``genalign train`` run (``weights.trainable.safetensors`` applied to the base
    model its run's ``recipe.json`` names, resolved from the working directory)."""
    from safetensors.torch import load_file

    from genalign.policies import load_policy

    folder = Path(path)
    weights = folder / "weights.trainable.safetensors"
    if not weights.is_file():
        return load_policy("language", str(path), lora=None, train=False)
    recipe = folder.parent.parent / "recipe.json"
    if not recipe.is_file():
        raise FileNotFoundError(f"checkpoint {folder}: its run's recipe.json ({recipe}) is missing")
    model = json.loads(recipe.read_text())["model"]
    if model.get("lora") is not None:
        raise ValueError(f"checkpoint {folder}: a LoRA run; evaluate its exported final/ folder instead")
    policy = load_policy("language", model["path"], lora=None, train=False)
    missing, unexpected = policy.model.load_state_dict(load_file(str(weights)), strict=False)
    if unexpected:
        raise ValueError(f"checkpoint {folder} does not fit {model['path']}: unexpected {unexpected[:3]}")
    return policy


@torch.no_grad()
def write_svgs(
    policy: Any,
    eval_set: SVGEvalSet,
    temperature: float = 0.01,
    max_new_tokens: int = 200,
    seed: int = 0,
    batch_size: int = 64,
) -> list[str]:
    """One completion per scene (per-sample seeds ``seed + i``), its SVG extracted (``""`` if none)."""
    svgs = []
    for start in range(0, len(eval_set), batch_size):
        stop = min(start + batch_size, len(eval_set))
        images = eval_set.images[start:stop] if eval_set.task == "image_to_svg" else None
        out = policy.rollout(
            eval_set.prompts[start:stop],
            seeds=torch.arange(start, stop) + seed,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            images=images,
        )
        for text in out.completions:
            found = extract_svg_details(text, repair=True)
            svgs.append(found.svg if found.svg is not None else "")
    return svgs


def default_reward(tower: str | Path | None = None) -> Any:
    """The RL recipe's reward (``configs/toy/rlrf_im2svg.yaml``): every term weight 1, toy-clip's
    image tower (or the open_clip folder ``tower``) for the semantic term, floor -1."""
    from genalign.rewards import load_reward

    return load_reward(
        "svg_fidelity",
        weights={"image": 1.0, "edge": 1.0, "semantic": 1.0, "length": 1.0},
        embedder="clip",
        embedder_kwargs={"model": f"local-dir:{tower or CLIP_DIR}", "pretrained": None},
        min_reward=-1.0,
    )


def evaluate_svg_writers(
    models: Mapping[str, str],
    count: int = 256,
    seed: int = EVAL_SEED,
    split: str = "rl_heldout",
    task: str = "image_to_svg",
    temperature: float = 0.01,
    max_new_tokens: int = 200,
    reward: Any = None,
    keep_samples: bool = False,
) -> dict[str, Any]:
    """Every model in ``models`` (label -> path, in report order) on one held-out set: summaries,
    and paired changes with the hacking check between consecutive models."""
    if not models:
        raise ValueError("eval-svg needs at least one model")
    torch.manual_seed(0)
    eval_set = svg_eval_set(count, seed, split, task=task)
    reward = reward if reward is not None else default_reward()
    per_model: dict[str, dict[str, list]] = {}
    report: dict[str, Any] = {
        "set": {"count": count, "seed": seed, "split": split, "task": task},
        "sampling": {"temperature": temperature, "max_new_tokens": max_new_tokens},
        "models": {},
        "comparisons": {},
    }
    for label, path in models.items():
        svgs = write_svgs(load_svg_writer(path), eval_set, temperature, max_new_tokens)
        per_model[label] = score_svgs(svgs, eval_set, reward)
        report["models"][label] = {"path": str(path), **summarize(per_model[label])}
        if keep_samples:
            report["models"][label]["samples"] = svgs[:8]
    labels = list(models)
    for first, second in zip(labels, labels[1:]):
        report["comparisons"][f"{first} -> {second}"] = hacking_check(
            per_model[first], per_model[second], judge_scene=task == "image_to_svg"
        )
    return report


# -- the table ----------------------------------------------------------------------------------------

TABLE_ROWS = (
    ("validity", "validity", 100),
    ("shapes_eval", "ShapesEval on render", 100),
    ("shapes_eval_exact", "ShapesEval, no extra objects", 100),
    ("shapes_eval_valid", "ShapesEval, valid SVGs only", 100),
    ("scene_match", "scene match", 100),
    ("extra_objects", "extra objects", 1),
    ("score", "svg_fidelity score", 1),
    ("image", "image term", 1),
    ("edge", "edge term", 1),
    ("semantic", "semantic term", 1),
    ("length", "length term", 1),
    ("pixel_mse", "pixel MSE", 1),
    ("ssim", "SSIM", 1),
    ("length_ratio", "length / reference", 1),
)


def _cell(stats: Mapping[str, Any] | None, scale: float) -> str:
    if not stats or stats.get("mean") is None:
        return "-"
    low, high = stats["ci"]
    digits = 1 if scale == 100 else 3
    return f"{stats['mean'] * scale:.{digits}f} [{low * scale:.{digits}f}, {high * scale:.{digits}f}]"


def format_report(report: Mapping[str, Any]) -> str:
    """The report as a Markdown table (one column per model) and the hacking checks."""
    labels = list(report["models"])
    lines = ["| measure | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    distinct = report["models"][labels[0]].get("distinct_inputs")
    if distinct is not None:
        lines.insert(0, f"{distinct} distinct captions: intervals are cluster-robust by caption\n")
    for key, title, scale in TABLE_ROWS:
        cells = [_cell(report["models"][label].get(key), scale) for label in labels]
        if any(c != "-" for c in cells):
            lines.append(f"| {title} | " + " | ".join(cells) + " |")
    for name, check in report["comparisons"].items():
        shapes, score = check["changes"]["shapes_eval"], check["changes"]["score"]
        lines.append("")
        lines.append(
            f"{name}: ShapesEval {_signed(shapes, 100)} points, score {_signed(score, 1)}; "
            f"length collapse: {'YES' if check['length_collapse'] else 'no'}; "
            f"fidelity up while the verifier is flat: {'YES' if check['fidelity_up_verifier_flat'] else 'no'}; "
            f"scene match {_signed(check['changes'].get('scene_match', {}), 100)} points; "
            f"verifier up without the scene: {_flag(check.get('verifier_up_scene_flat'))}; "
            f"ShapesEval with no extra objects {_signed(check['changes'].get('shapes_eval_exact', {}), 100)} "
            f"points; verifier up by extra objects: "
            f"{'YES' if check.get('verifier_up_by_extra_objects') else 'no'}; "
            f"ShapesEval on valid SVGs {_signed(check['changes'].get('shapes_eval_valid', {}), 100)} points; "
            f"verifier up by validity alone: {'YES' if check.get('verifier_up_by_validity') else 'no'}"
        )
    return "\n".join(lines)


def _flag(value: bool | None) -> str:
    return "n/a" if value is None else "YES" if value else "no"


def _signed(stats: Mapping[str, Any], scale: float) -> str:
    if stats.get("change") is None:
        return "n/a"
    low, high = stats["ci"]
    digits = 1 if scale == 100 else 3
    return f"{stats['change'] * scale:+.{digits}f} [{low * scale:+.{digits}f}, {high * scale:+.{digits}f}]"


def parse_models(items: Sequence[str]) -> dict[str, str]:
    """``LABEL=PATH`` or ``PATH`` items (a bare path is its own label) as an ordered mapping."""
    models: dict[str, str] = {}
    for item in items:
        label, sep, path = item.partition("=")
        label, path = (label, path) if sep else (item, item)
        if not label or not path:
            raise ValueError(f"eval-svg model {item!r}: expected LABEL=PATH or PATH")
        if label in models:
            raise ValueError(f"eval-svg model label {label!r} given twice")
        models[label] = path
    return models
