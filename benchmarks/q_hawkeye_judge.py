"""A toy IQA judge on the held-out quality set: SRCC / PLCC against MOS and original-above-degraded.

The numbers ``genalign eval-reward`` gives with ``--task mos`` (SRCC, raw PLCC) and ``--task
preference --tie-threshold 0`` (skip-ties accuracy: the original scored above its Q-Hawkeye degraded
copy, a tie counting a half) on the files of ``python -m genalign.toy.quality`` (docs/language.md,
section 7), in one process: ``pairs.jsonl``'s originals are ``mos.jsonl``'s images, so each image is
scored once. Also the fraction of completions whose ``<answer>`` parses (answer judges), on the
originals (``parsed``) and on the degraded copies (``parsed_degraded``), and the original-above-
degraded rate over the pairs where both answers parse (``original_above_degraded_answered``): an
unparsed answer scores the reward's floor (1), so a judge whose text breaks down on a badly
degraded copy would otherwise be credited for it. 95%
percentile bootstrap intervals, 1000 resamples, seed 0, as eval-reward::

    python -m genalign.toy.quality --split heldout --scenes 24 --out runs/toy-quality-heldout
    python benchmarks/q_hawkeye_judge.py runs/toy-q-hawkeye/final --samples 0 4
    python benchmarks/q_hawkeye_judge.py assets/models/toy-vlm          # a Q-Align judge

``--samples 0`` is the greedy answer (the iqa reward's default), N > 0 the mean of N seeded samples
at ``--temperature``. ``--readout expected`` reads each answer's digits by their expectations
(the ``iqa`` reward's ``readout``; the number as written is ``text``, the default); a baseline that
is an answer judge is read the same way. One JSON line per setting goes to ``--log``.

``--baseline JUDGE`` also scores a second judge (greedy) on the same images and reports the paired
difference (this judge minus the baseline) of SRCC, PLCC and the original-above-degraded rate with a
paired bootstrap: both judges' statistics on each resample of images, so what the two share (the
images that are hard for both) cancels out of the interval; for answer judges also the difference
of the rate over the pairs where both judges' answers parse (``..._answered_minus_baseline``). The
way to ask whether RL moved a judge beyond its own starting point::

    python benchmarks/q_hawkeye_judge.py runs/toy-q-hawkeye/final --baseline runs/toy-q-hawkeye-sft/final
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from genalign.rewards import load_reward  # noqa: E402
from genalign.rewards.evaluation import metrics  # noqa: E402
from genalign.rewards.evaluation.data import load_image_tensor  # noqa: E402


def load_set(folder: Path) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray | None]:
    """``(originals [N, 3, H, W], degraded copies [N, 3, H, W], mos [N], clusters [N] or None)`` of a
    quality set; ``clusters`` is the rows' ``cluster`` column (their scene: copies of one scene are
    not independent, so the intervals resample scenes, as eval-reward does), None without one."""
    rows = [json.loads(line) for line in (folder / "mos.jsonl").read_text().splitlines() if line]
    pairs = {
        p["image_0"]: p["image_1"] for p in map(json.loads, (folder / "pairs.jsonl").read_text().splitlines())
    }
    originals = torch.stack([load_image_tensor(r["image"], folder) for r in rows])
    degraded = torch.stack([load_image_tensor(pairs[r["image"]], folder) for r in rows])
    clusters = np.array([r["cluster"] for r in rows]) if all("cluster" in r for r in rows) else None
    return originals, degraded, np.array([r["mos"] for r in rows], dtype=float), clusters


def score(reward: torch.nn.Module, images: torch.Tensor, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores ``[N]`` and per image the fraction of its completions that parse (``[N]``; all NaN
    for a Q-Align judge, which always answers). An unparsed answer scores the reward's floor."""
    scores, parsed = [], []
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            out = reward(images[start : start + batch_size], [""] * len(images[start : start + batch_size]))
            scores.append(out.scores.float().cpu())
            if "answer_parsed" in out.details:
                parsed.append(out.details["answer_parsed"].float().cpu())
    scores_array = torch.cat(scores).numpy()
    parsed_array = torch.cat(parsed).numpy() if parsed else np.full(len(scores_array), np.nan)
    return scores_array, parsed_array


def both_answered(parsed_original: np.ndarray, parsed_degraded: np.ndarray) -> np.ndarray:
    """Per image: the original's and the copy's answers both parse (a Q-Align judge's parsed
    fractions are NaN: it always answers)."""
    return ~((parsed_original == 0) | (parsed_degraded == 0))


def above_degraded_credit(original: np.ndarray, degraded: np.ndarray) -> np.ndarray:
    """Per image: 1 when the original scores above its degraded copy, a half for a tie, else 0."""
    return metrics.preference_credit(original, degraded, np.zeros(len(original)), policy="skip-ties")


def summary(
    original: np.ndarray,
    degraded: np.ndarray,
    mos: np.ndarray,
    answered: np.ndarray | None = None,
    clusters: np.ndarray | None = None,
) -> dict[str, list[float]]:
    """``{name: [value, low, high]}`` for srcc, plcc and the original-above-degraded rate; with
    ``answered`` (per image: both the original's and the copy's answers parse) also that rate over
    the answered pairs only, ``original_above_degraded_answered``: an answer judge whose text breaks
    down on a degraded copy scores the floor there, which the plain rate counts as a win. With
    ``clusters`` (per image) the intervals resample clusters (:func:`metrics.bootstrap_intervals`)."""
    point = metrics.mos_correlations(original, mos, fit=False)
    intervals = metrics.bootstrap_intervals(
        lambda index: metrics.mos_correlations(original[index], mos[index], fit=False),
        len(mos),
        clusters=clusters,
    )
    credit = above_degraded_credit(original, degraded)
    out = {name: [point[name], *intervals[name]] for name in ("srcc", "plcc")}
    out["original_above_degraded"] = [
        float(np.nanmean(credit)),
        *metrics.mean_interval(credit, clusters=clusters),
    ]
    if answered is not None:
        kept = credit[answered]
        kept_clusters = None if clusters is None else clusters[answered]
        out["original_above_degraded_answered"] = [
            float(np.mean(kept)),
            *metrics.mean_interval(kept, clusters=kept_clusters),
        ]
    return out


def paired_difference(
    ours: tuple[np.ndarray, np.ndarray],
    theirs: tuple[np.ndarray, np.ndarray],
    mos: np.ndarray,
    answered: np.ndarray | None = None,
    clusters: np.ndarray | None = None,
) -> dict[str, list[float]]:
    """``{name: [difference, low, high]}``: ours minus theirs for srcc, plcc and
    original-above-degraded, with percentile intervals from one paired bootstrap over the images
    (over their ``clusters`` when given).
    With ``answered`` (per image: every answer of both judges parses) also the difference of the
    rate over those pairs only, ``original_above_degraded_answered``: the same pairs for both, so a
    judge is not credited for a copy it could not answer, nor compared on other pairs."""
    credits = [above_degraded_credit(*judge) for judge in (ours, theirs)]

    def statistic(index: np.ndarray) -> dict[str, float]:
        a = metrics.mos_correlations(ours[0][index], mos[index], fit=False)
        b = metrics.mos_correlations(theirs[0][index], mos[index], fit=False)
        out = {name: a[name] - b[name] for name in ("srcc", "plcc")}
        out["original_above_degraded"] = float(np.nanmean(credits[0][index]) - np.nanmean(credits[1][index]))
        if answered is not None:
            kept = index[answered[index]]
            out["original_above_degraded_answered"] = float(
                np.mean(credits[0][kept]) - np.mean(credits[1][kept])
            )
        return out

    point = statistic(np.arange(len(mos)))
    intervals = metrics.bootstrap_intervals(statistic, len(mos), clusters=clusters)
    return {name: [value, *intervals[name]] for name, value in point.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="a judge folder (a q_hawkeye run's final/) or a Q-Align VLM")
    parser.add_argument("--data", default=str(ROOT / "runs/toy-quality-heldout"))
    parser.add_argument("--samples", type=int, nargs="+", default=[0], help="0: greedy; N: N samples")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--readout", choices=("text", "expected"), default="text", help="answer judges only")
    parser.add_argument("--batch-size", type=int, default=48)
    parser.add_argument("--label", default=None, help="name in the log (default: the model path)")
    parser.add_argument("--log", default=str(ROOT / "runs/q_hawkeye_judges.jsonl"))
    parser.add_argument(
        "--baseline", default=None, help="a second judge (greedy): report the paired difference to it"
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    originals, degraded, mos, clusters = load_set(Path(args.data))
    answer = (Path(args.model) / "iqa_judge.json").is_file()
    baseline = None
    if args.baseline is not None:
        reading = {"readout": args.readout} if (Path(args.baseline) / "iqa_judge.json").is_file() else {}
        reward = load_reward("iqa", model=args.baseline, batch_size=args.batch_size, **reading).eval()
        (b_original, bp_original), (b_degraded, bp_degraded) = (
            score(reward, images, args.batch_size) for images in (originals, degraded)
        )
        baseline = (b_original, b_degraded)
        baseline_answered = both_answered(bp_original, bp_degraded)
    for samples in args.samples if answer else [0]:
        start = time.perf_counter()
        options = (
            {"num_samples": samples, "seed": 0, "sample_temperature": args.temperature} if samples else {}
        )
        if answer:
            options["readout"] = args.readout
        reward = load_reward("iqa", model=args.model, batch_size=args.batch_size, **options).eval()
        s_original, p_original = score(reward, originals, args.batch_size)
        s_degraded, p_degraded = score(reward, degraded, args.batch_size)
        answered = both_answered(p_original, p_degraded) if answer else None
        row = {"judge": args.label or args.model, "samples": samples, "temperature": args.temperature}
        if answer:
            row["readout"] = args.readout
        row.update(summary(s_original, s_degraded, mos, answered, clusters))
        parsed, parsed_degraded = float(np.mean(p_original)), float(np.mean(p_degraded))
        row.update(parsed=parsed, parsed_degraded=parsed_degraded, seconds=time.perf_counter() - start)
        if baseline is not None:
            row["baseline"] = args.baseline
            both = baseline_answered & answered if answered is not None else baseline_answered
            difference = paired_difference((s_original, s_degraded), baseline, mos, both, clusters)
            row.update({f"{name}_minus_baseline": value for name, value in difference.items()})
        with open(args.log, "a", encoding="utf-8") as log:
            log.write(json.dumps(row) + "\n")
        cells = [f"{k} {v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" for k, v in row.items() if isinstance(v, list)]
        parsing = f"; parsed {parsed:.2f}, degraded copies {parsed_degraded:.2f}"
        reading = f" readout={args.readout}" if answer else ""
        print(f"{row['judge']} samples={samples}{reading}: " + "; ".join(cells) + parsing, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
