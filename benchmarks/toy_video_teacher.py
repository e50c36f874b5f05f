"""Where a toy video teacher fails: drawn from noise, or continued from the true first block.

Issue #26's toy teacher (``python -m genalign.toy.generators toy-ar-video``) is a block-causal
flow model. This script renders ``--per-category`` times as many train-split videos as there are
chosen categories, each of a category drawn uniformly from them (data seed ``--data-seed``),
encodes them with each teacher's own autoencoder, and draws with the guided Euler ODE
(``ode_video_samples``, ``--guidance`` against the empty caption, ``--steps`` a block) twice from
the same noise:

* **from noise**: every block, what the teacher generates;
* **from the true first block**: the rendered video's first block as clean context
  (``prefix``), the rest drawn: whether it can continue a video it did not have to start.

For each it reports the video verifier's accuracy, the mean fraction of its checks met, per
category, and for the videos whose first clause asks for motion how that object moved (``right``:
the asked direction; ``static``; ``other``: another or oblique; ``absent``: no object of that
colour and shape). With ``--splits rl_train,rl_heldout`` it also scores the same sampler on those
prompt splits (``evaluate_video_generator(..., sampler="ode")``, ``--split-per-category`` prompts
of each category, one video each), as docs/astrolabe.md's tables do; with ``--rollout-steps N``
also with the policy's Self-Forcing rollout (N steps a block, unguided), the sampler of a reflow
student (``toy-ar-video-reflow``) and of RL. One JSON line per teacher on stdout and in ``--out``::

    python benchmarks/toy_video_teacher.py runs/s31/patch2-first3 --splits rl_train,rl_heldout --threads 1
    python benchmarks/toy_video_teacher.py STUDENT --splits rl_train,rl_heldout --rollout-steps 4 --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_CATEGORIES = ("single_motion", "one_moving")


def motion_outcome(clause: dict[str, Any], asked: str) -> str:
    """How the first clause's object moved: ``right``, ``static``, ``other`` or ``absent``."""
    motions = clause.get("motions") or []
    if not motions:
        return "absent"
    if asked in motions:
        return "right"
    return "static" if all(m == "static" for m in motions) else "other"


def summarise(result: dict[str, Any], specs: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy, clause fraction, per category and the motion outcomes of ``evaluate_videos``."""
    outcomes: Counter[str] = Counter()
    for sample, spec in zip(result["per_sample"], specs, strict=True):
        asked = spec["include"][0].get("motion")
        if asked and asked != "static":
            outcomes[motion_outcome(sample["clauses"][0], asked)] += 1
    return {
        "accuracy": round(float(result["video_accuracy"]), 4),
        "fraction": round(float(result["mean_fraction"]), 4),
        "per_category": {k: round(float(v), 4) for k, v in result["per_category"].items()},
        "motion": {k: outcomes[k] for k in ("right", "static", "other", "absent")},
    }


@torch.no_grad()
def measure(
    path: str | Path | Any,
    per_category: int = 24,
    categories: tuple[str, ...] = DEFAULT_CATEGORIES,
    data_seed: int = 777,
    guidance: float = 3.0,
    steps: int = 16,
    batch_size: int = 16,
) -> dict[str, Any]:
    """Both draws of one teacher (a folder or a loaded ``ar_video`` policy) on the same videos."""
    from genalign.policies import DiffusionPolicy, load_policy
    from genalign.toy.generators.video import video_latents
    from genalign.toy.generators.video_reflow import ode_video_samples
    from genalign.toy.generators.video_train import prompt_embeddings
    from genalign.toy.video import evaluate_videos, parse_video_caption, toy_video_dataset

    policy = path if isinstance(path, DiffusionPolicy) else load_policy("ar_video", str(path), train=False)
    videos, captions = toy_video_dataset(
        per_category * len(categories), seed=data_seed, categories=list(categories)
    )
    specs = [parse_video_caption(caption) for caption in captions]
    pipe = policy.pipeline
    negative = prompt_embeddings(pipe, [""])
    latents = video_latents(pipe.vae, videos)
    block = policy.block_size
    drawn: dict[str, list[torch.Tensor]] = {"from_noise": [], "from_first_block": []}
    for start in range(0, len(captions), batch_size):
        chunk = slice(start, start + batch_size)
        embeds = prompt_embeddings(pipe, captions[chunk])
        noise = torch.stack(
            [
                torch.randn(latents.shape[1:], generator=torch.Generator().manual_seed(data_seed + i))
                for i in range(start, start + len(embeds))
            ]
        )
        for name, prefix in (("from_noise", None), ("from_first_block", latents[chunk, :, :block])):
            clean = ode_video_samples(policy, noise, embeds, steps, guidance, negative, prefix=prefix)
            drawn[name].append(policy.decode(clean, None).float().cpu())
    out: dict[str, Any] = {
        "teacher": str(getattr(path, "name_or_path", path)),
        "videos": len(captions),
        "categories": list(categories),
        "data_seed": data_seed,
        "guidance": guidance,
        "steps": steps,
    }
    for name, chunks in drawn.items():
        out[name] = summarise(evaluate_videos(torch.cat(chunks), specs), specs)
    return out


def measure_splits(
    path: str | Path | Any,
    splits: tuple[str, ...],
    per_category: int = 20,
    guidance: float = 3.0,
    steps: int = 16,
    sampler: str = "ode",
) -> dict[str, Any]:
    """The verifier's accuracy (with its 95% interval), clause fraction and per-category accuracy on
    each prompt split in ``splits``: of the guided ODE, or with ``sampler="self_forcing"`` of the
    policy's few-step rollout (``steps`` a block, no guidance: how a distilled student samples)."""
    from genalign.toy.generators.video_eval import evaluate_video_generator

    out = {}
    for split in splits:
        result = evaluate_video_generator(
            path,
            split=split,
            per_category=per_category,
            steps=steps,
            sampler=sampler,
            guidance_scale=guidance,
        )
        out[split] = {
            "accuracy": round(float(result["overall"]), 4),
            "interval": result["interval"],
            "fraction": round(float(result["mean_fraction"]), 4),
            "per_category": {k: round(float(v), 4) for k, v in result["per_category"].items()},
            "sampler": result["settings"]["sampler"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("teachers", nargs="+", help="toy-ar-video folders")
    parser.add_argument("--per-category", type=int, default=24)
    parser.add_argument("--categories", default=",".join(DEFAULT_CATEGORIES))
    parser.add_argument("--data-seed", type=int, default=777)
    parser.add_argument("--guidance", type=float, default=3.0)
    parser.add_argument("--steps", type=int, default=16, help="Euler steps a block")
    parser.add_argument(
        "--splits", default="", help="also score these prompt splits, e.g. rl_train,rl_heldout"
    )
    parser.add_argument("--split-per-category", type=int, default=20)
    parser.add_argument(
        "--rollout-steps",
        type=int,
        default=0,
        help="also score --splits with the Self-Forcing rollout at this many steps a block, "
        "unguided (a reflow student's sampler; 0: off)",
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="append the JSON lines here")
    args = parser.parse_args(argv)
    from genalign.policies import load_policy
    from genalign.toy.training import torch_threads

    categories = tuple(c.strip() for c in args.categories.split(",") if c.strip())
    if args.rollout_steps > 0 and not args.splits.strip():
        parser.error("--rollout-steps scores the prompt splits: give --splits too, e.g. rl_train,rl_heldout")
    with torch_threads(args.threads):
        for teacher in args.teachers:
            if not Path(teacher).is_dir():
                parser.error(f"{teacher}: not a folder (give a toy-ar-video output folder)")
            policy = load_policy("ar_video", teacher, train=False)  # loaded once for every measure
            row = measure(policy, args.per_category, categories, args.data_seed, args.guidance, args.steps)
            row["teacher"] = teacher
            splits = tuple(x.strip() for x in args.splits.split(",") if x.strip())
            if splits:
                row["splits"] = measure_splits(
                    policy, splits, args.split_per_category, args.guidance, args.steps
                )
            if splits and args.rollout_steps > 0:
                row["rollout_steps"] = args.rollout_steps
                row["splits_self_forcing"] = measure_splits(
                    policy, splits, args.split_per_category, 1.0, args.rollout_steps, "self_forcing"
                )
            line = json.dumps(row)
            print(line, flush=True)
            if args.out is not None:
                with open(args.out, "a") as handle:
                    handle.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
