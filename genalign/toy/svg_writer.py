"""The toy SVG writer (``assets/models/toy-svg-writer``, issue #25 item 4): a small LLaVA that
writes the SVG code of a toy render (image-to-SVG), RLRF's stage-1 model on the toy world. The same
architecture trained on captions alone (no image input) is the text-to-SVG writer
``assets/models/toy-svg-writer-t2s`` (``configs/toy/svg_writer_t2s_sft.yaml``; ``card --task
text_to_svg``).

RLRF (Rodriguez et al. 2025, arXiv 2505.20793) starts from a VLM that already writes SVG and
fine-tunes it on (image, SVG) pairs before any RL. The tiny random LLaVA (``tiny:llava``) cannot be
taught that in minutes: its BPE of 400 ids spells a toy scene's compact SVG in ~106 tokens (up to
242, past the RL recipe's 200-token budget), and a 2-layer, 32-wide LM with a random vision tower
learned nothing a short SFT could show (all SVGs invalid after 30 steps). The writer fixes the
setup, not the method (the SFT run is ``genalign train``, method ``sft``):

* **Data**: the toy scenes in the ``canonical`` SVG serialisation
  (:func:`genalign.toy.svg_tasks.compact_svg`: integer coordinates on a 32 grid, no background,
  elements left to right), so a scene has one reference document.
* **Tokenizer**: a byte-level BPE trained on those documents and the captions, plus whole SVG
  pieces (the root, each element's opening, attribute separators, each palette colour's
  ``fill`` and the close) and the integers 0..32 as single added tokens, as SVG writers give
  coordinates and commands their own tokens (OmniSVG, StarVector). A scene is ~20 tokens (at most
  ~32), not ~106; any other text still tokenizes byte by byte.
* **Model**: LLaVA-1.5-style (:func:`genalign.toy.reward_models.vlm_model.build_vlm`): toy-clip's
  image tower (48 px, patch 8, 37 tokens with CLS, penultimate layer), a two-layer projector, a
  Qwen2 LM; the whole model is fine-tuned.

Recipe (``assets/models/toy-svg-writer/README.md`` records the exact commands and numbers)::

    python -m genalign.toy.svg_writer init --out runs/toy/svg-writer-init
    genalign train configs/toy/svg_writer_sft.yaml
    python -m genalign.toy.svg_writer card --model runs/toy-svg-writer-sft/final --out assets/models/toy-svg-writer
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from genalign.toy.scenes import PALETTE, hex_colour
from genalign.toy.svg_tasks import DEFAULT_INSTRUCTION, toy_svg_records

__all__ = ["SVGWriterRecipe", "build_svg_writer", "svg_pieces", "svg_writer_tokenizer"]

WRITER_DIR = Path(__file__).resolve().parents[2] / "assets" / "models" / "toy-svg-writer"
CLIP_DIR = Path(__file__).resolve().parents[2] / "assets" / "models" / "toy-clip"
SIZE_BUDGET_BYTES = 8_000_000


@dataclass
class SVGWriterRecipe:
    """Architecture of the writer's LM (the vision tower is toy-clip's) and its tokenizer."""

    seed: int = 0
    canvas: int = 32
    hidden_size: int = 128
    intermediate_size: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    vocab_size: int = 512
    vision_init: str = str(CLIP_DIR)
    vision_feature_layer: int = -2
    corpus_scenes: int = 3000


# the writer recipe's fields that are the VLM recipe's (:func:`build_svg_writer`)
VLM_FIELDS = (
    "seed",
    "hidden_size",
    "intermediate_size",
    "layers",
    "heads",
    "kv_heads",
    "vision_init",
    "vision_feature_layer",
)


def svg_pieces(canvas: int = 32) -> list[str]:
    """The added tokens: whole pieces of the canonical toy SVG and the integers ``0..canvas``."""
    pieces = [f'<svg viewBox="0 0 {canvas} {canvas}">', "</svg>"]
    pieces += ['<circle cx="', '" cy="', '" r="', '<rect x="', '" y="', '" width="', '" height="']
    pieces += ['<polygon points="']
    pieces += [f'" fill="{hex_colour(rgb)}"/>' for rgb in PALETTE.values()]
    return pieces + [str(i) for i in range(canvas + 1)]


def svg_writer_tokenizer(recipe: SVGWriterRecipe | None = None) -> Any:
    """A ``Qwen2Tokenizer`` (chat template, ``<image>``): a BPE trained on canonical SVGs of every
    split's scenes (seed 1000, never a training or evaluation seed), their captions and the
    instruction, with :func:`svg_pieces` added as whole tokens."""
    from transformers import AddedToken

    from genalign.tiny.language import qwen_chat_tokenizer
    from genalign.tiny.tokenizers import train_bpe_tokenizer

    recipe = recipe or SVGWriterRecipe()
    records = toy_svg_records(recipe.corpus_scenes, 1000, "all", recipe.canvas, "canonical")
    corpus = [svg for _, svg, _ in records] + [caption for caption, _, _ in records]
    corpus += [DEFAULT_INSTRUCTION] * 50
    tokenizer = qwen_chat_tokenizer(train_bpe_tokenizer(corpus, vocab_size=recipe.vocab_size), 512)
    tokenizer.add_tokens([AddedToken(piece, normalized=False) for piece in svg_pieces(recipe.canvas)])
    return tokenizer


def build_svg_writer(out: str | Path, recipe: SVGWriterRecipe | None = None) -> tuple[Any, Any]:
    """A freshly initialised writer (toy-clip's image tower, random LM) saved to ``out``: the SFT
    recipe's starting point and the evaluation's "before SFT" model."""
    from genalign.toy.reward_models.vlm_model import VLMRecipe, build_vlm

    recipe = recipe or SVGWriterRecipe()
    vlm = VLMRecipe(**{name: getattr(recipe, name) for name in VLM_FIELDS})
    with torch.random.fork_rng(devices=[]):
        model, processor = build_vlm(vlm, tokenizer=svg_writer_tokenizer(recipe))
    out = Path(out)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    (out / "writer_recipe.json").write_text(json.dumps(asdict(recipe), indent=2) + "\n")
    return model, processor


# -- the card -----------------------------------------------------------------------------------------


def _training_summary(run_dir: Path, steps: int | None = None) -> dict[str, Any]:
    """Steps, wall seconds of the steps (layout and update) and first / last SFT loss of a
    ``genalign train`` run (its metrics.jsonl), the first ``steps`` steps when given."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return {}
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "sft_loss" in r and (steps is None or r["step"] < steps)]
    if not rows:
        return {}
    seconds = sum(float(r.get("time_rollout", 0.0)) + float(r.get("time_update", 0.0)) for r in rows)
    return {
        "steps": len(rows),
        "seconds": round(seconds, 1),
        "first_loss": rows[0]["sft_loss"],
        "final_loss": rows[-1]["sft_loss"],
    }


def write_card(
    model: Path, out: Path, evaluation: dict[str, Any], command: str, steps: int | None = None
) -> dict[str, Any]:
    """Copy the exported model (``model``) to ``out`` and write ``card.json``."""
    from genalign.policies import load_policy

    if model.resolve() != out.resolve():
        shutil.copytree(model, out, dirs_exist_ok=True)
    for stray in ("training_state.pt", "optimizer.pt"):
        (out / stray).unlink(missing_ok=True)
    policy = load_policy("language", str(out), lora=None, train=False)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    if size > SIZE_BUDGET_BYTES:
        raise RuntimeError(f"{out} is {size / 1e6:.2f} MB, over the {SIZE_BUDGET_BYTES / 1e6:.0f} MB budget")
    card = {
        "name": out.name,
        "command": command,
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "size_mb": round(size / 1e6, 2),
        "training": _training_summary(model.parent, steps),
        "eval": evaluation,
    }
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m genalign.toy.svg_writer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("command", choices=("init", "card"))
    parser.add_argument("--out", type=Path, default=WRITER_DIR)
    parser.add_argument("--model", type=Path, help="card: the SFT run's final/ folder")
    parser.add_argument("--init", type=Path, help="card: the untrained writer (evaluated as 'before SFT')")
    parser.add_argument("--count", type=int, default=256, help="card: held-out scenes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--task",
        default="image_to_svg",
        choices=("image_to_svg", "text_to_svg"),
        help="card: the task the writer was trained for",
    )
    parser.add_argument(
        "--steps", type=int, help="card: the SFT steps the model was trained for (metrics rows)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.command == "init":
        start = time.perf_counter()
        model, _ = build_svg_writer(args.out, SVGWriterRecipe(seed=args.seed))
        parameters = sum(p.numel() for p in model.parameters())
        print(
            json.dumps(
                {"out": str(args.out), "parameters": parameters, "seconds": time.perf_counter() - start}
            )
        )
        return 0
    from genalign.toy.svg_eval import evaluate_svg_writers

    if args.model is None:
        parser.error("card needs --model (the SFT run's final/ folder)")
    models = {"after SFT": str(args.model)}
    if args.init is not None:
        models = {"before SFT": str(args.init), **models}
    evaluation = evaluate_svg_writers(models, count=args.count, task=args.task)
    command = " ".join(["python -m genalign.toy.svg_writer", *(argv or __import__("sys").argv[1:])])
    card = write_card(args.model, args.out, evaluation, command, args.steps)
    print(json.dumps({k: card[k] for k in ("parameters", "size_mb", "training")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
