"""The toy prompt rewriter (``assets/models/toy-rewriter``, issue #24 item 5) and the generator's
paraphrase gap.

PromptRL's rewriter (arXiv 2602.01382) is a pretrained LM; a random tiny LM almost never writes
an ``<answer>`` tag, so RL has nothing to start from. The toy rewriter is a small Qwen2 trained
offline, by the library's own trainer (``genalign train``, method ``sft``), to answer UniRL's
rewrite template (:data:`genalign.algorithms.prompt_rewrite.GENEVAL_TEMPLATE`) with
``<answer>CANONICAL</answer>``: the canonical caption of a paraphrase (:mod:`genalign.toy.paraphrase`)
or a copy of a canonical input, on RL-train captions only. Trained briefly, so its answers are
well formed but not always canonical: room for RL.

Recipe (``assets/models/toy-rewriter/README.md`` records the exact commands)::

    python -m genalign.toy.rewriter init --out runs/toy/rewriter-init
    genalign train configs/toy/rewriter_sft.yaml
    python -m genalign.toy.rewriter card --model runs/toy-rewriter-sft/final --out assets/models/toy-rewriter
    python -m genalign.toy.rewriter gap --images 216     # toy-sd on canonical vs paraphrased captions
    python -m genalign.toy.rewriter gap --family flow    # toy-flow, as configs/toy/promptrl_flow.yaml samples
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from genalign.algorithms.prompt_rewrite import GENEVAL_TEMPLATE, extract_answer
from genalign.tiny.language import qwen2_config, qwen_chat_tokenizer, set_chat_generation_defaults
from genalign.tiny.tokenizers import train_bpe_tokenizer
from genalign.toy.evaluation import eval_set_for_images, evaluate_policy, paired_change_interval
from genalign.toy.paraphrase import paraphrase, paraphrase_set
from genalign.toy.prompts import prompts_for
from genalign.trainers.prompt_pool import PromptPool

__all__ = ["generator_gap", "rewriter_pool", "rewriter_rates", "build_rewriter", "tokenizer_corpus"]

REWRITER_DIR = Path(__file__).resolve().parents[2] / "assets" / "models" / "toy-rewriter"
SIZE_BUDGET_BYTES = 4_000_000
GAP_SAMPLING = {"num_inference_steps": 10, "guidance_scale": 2.0, "eta": 1.0}
# toy-flow as configs/toy/promptrl_flow.yaml samples it: 10 steps, flow SDE (noise level 0.7) on the
# first 6 and the ODE after, guidance 4.5 (the flow-family sample_efficiency.py comparison's)
FLOW_GAP_SAMPLING = {
    "num_inference_steps": 10,
    "guidance_scale": 4.5,
    "mode": "sde",
    "noise_level": 0.7,
    "num_sde_steps": 6,
}
GAP_DEFAULTS = {
    "sd": ("assets/models/toy-sd", GAP_SAMPLING),
    "flow": ("assets/models/toy-flow", FLOW_GAP_SAMPLING),
}


def answer(caption: str) -> str:
    return f"<answer>{caption}</answer>"


# -- data and tokenizer -------------------------------------------------------------------------------


def rewriter_pool(
    split: str = "rl_train", paraphrases_per_prompt: int = 4, copies_per_prompt: int = 1, seed: int = 0
) -> PromptPool:
    """SFT pairs: prompts ``GENEVAL_TEMPLATE.format(prompt=x)``, ``completions``
    ``<answer>CANONICAL</answer>``; ``x`` is each canonical caption of ``split``
    (``copies_per_prompt`` times) and ``paraphrases_per_prompt`` of its paraphrases."""
    inputs, targets = [], []
    for prompt in prompts_for(split):
        for _ in range(copies_per_prompt):
            inputs.append(prompt.caption)
            targets.append(answer(prompt.caption))
        for index in range(paraphrases_per_prompt):
            inputs.append(paraphrase(prompt, seed, index).text)
            targets.append(answer(prompt.caption))
    return PromptPool([GENEVAL_TEMPLATE.format(prompt=x) for x in inputs], {"completions": targets})


def tokenizer_corpus() -> list[str]:
    """The BPE's training text: the template, every canonical caption and 4 paraphrases of each
    (all splits: the tokenizer must spell any toy prompt compactly; the model trains on RL-train)."""
    corpus = [GENEVAL_TEMPLATE, "<answer> </answer>"] * 50
    for prompt in prompts_for("all"):
        corpus.append(answer(prompt.caption))
        corpus += [paraphrase(prompt, 1000, i).text for i in range(4)]
    return corpus


def build_rewriter(
    out: str | Path, hidden: int = 96, layers: int = 4, vocab_size: int = 640, seed: int = 0
) -> tuple[Any, Any]:
    """A randomly initialised Qwen2 rewriter with a BPE trained on :func:`tokenizer_corpus`,
    saved to ``out`` (the SFT recipe's starting point)."""
    from transformers import Qwen2ForCausalLM

    tokenizer = qwen_chat_tokenizer(train_bpe_tokenizer(tokenizer_corpus(), vocab_size=vocab_size), 512)
    config = qwen2_config(tokenizer, hidden_size=hidden, num_hidden_layers=layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    set_chat_generation_defaults(model, tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model, tokenizer


# -- measurements -------------------------------------------------------------------------------------


@torch.no_grad()
def rewriter_rates(
    policy: Any,
    inputs: Sequence[str],
    canonicals: Sequence[str],
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 64,
    max_new_tokens: int = 48,
) -> dict[str, float]:
    """Answer-tag rate and exact-canonical rate (the last answer equals the canonical caption) of
    one rewrite per input, drawn at ``temperature`` with per-sample seeds ``seed + i``."""
    tagged = canonical = 0
    for start in range(0, len(inputs), batch_size):
        chunk = list(inputs[start : start + batch_size])
        seeds = torch.arange(start, start + len(chunk)) + seed
        out = policy.rollout(
            [GENEVAL_TEMPLATE.format(prompt=x) for x in chunk],
            seeds=seeds,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
        )
        for completion, target in zip(out.completions, canonicals[start : start + len(chunk)], strict=True):
            refined, has_tag = extract_answer(completion, "")
            tagged += has_tag
            canonical += has_tag and refined == target
    n = len(inputs)
    return {"answer_rate": tagged / n, "canonical_rate": canonical / n, "n": n}


def _proportion_interval(p: float, n: int, z: float = 1.96) -> list[float]:
    """Wilson's 95% score interval of a proportion ``p`` of ``n`` (defined at 0 and 1 too)."""
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def measure_rewriter(model: str | Path, seed: int = 0, temperatures: Sequence[float] = (1.0, 0.01)) -> dict:
    """:func:`rewriter_rates` on 3 paraphrases of each RL-held-out caption (paraphrase seed 7,
    never trained on) and on the canonical captions, at each temperature (0.01 ~ greedy)."""
    from genalign.policies import load_policy

    policy = load_policy("language", str(model), lora=None, train=False)
    heldout = paraphrase_set("rl_heldout", 3, seed=7)
    canon = prompts_for("rl_heldout")
    result: dict[str, Any] = {"parameters": sum(p.numel() for p in policy.model.parameters())}
    for t in temperatures:
        para = rewriter_rates(policy, [p.text for p in heldout], [p.canonical for p in heldout], t, seed)
        copy = rewriter_rates(policy, [p.caption for p in canon], [p.caption for p in canon], t, seed)
        for name, rates in (("paraphrased", para), ("canonical", copy)):
            for key in ("answer_rate", "canonical_rate"):
                result[f"{name}_{key}_T{t}"] = rates[key]
                result[f"{name}_{key}_T{t}_ci"] = _proportion_interval(rates[key], rates["n"])
            result[f"{name}_n"] = rates["n"]
    return result


def _score_interval(result: dict[str, Any]) -> list[float]:
    """95% normal interval of GenEval's mean of per-category accuracies (categories stratified)."""
    accuracy, counts = result["per_category"], result["counts"]
    variance = sum(p * (1 - p) / counts[c] for c, p in accuracy.items()) / len(accuracy) ** 2
    half = 1.96 * math.sqrt(variance)
    return [result["overall"] - half, result["overall"] + half]


def generator_gap(
    model: str | None = None,
    images: int = 216,
    seed: int = 0,
    family: str = "sd",
    sampling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """ShapesEval of ``model`` (a ``family`` generator; default: toy-sd or toy-flow) on RL-held-out
    captions and on one paraphrase of each, on the same specs and seeds (``sampling``; default: the
    family's, :data:`GAP_SAMPLING` as ``benchmarks/toy_rl_study.py`` samples toy-sd,
    :data:`FLOW_GAP_SAMPLING` as ``configs/toy/promptrl_flow.yaml`` samples toy-flow); the change
    paraphrased - canonical with its paired, category-stratified 95% interval."""
    from genalign.policies import load_policy

    default_model, default_sampling = GAP_DEFAULTS[family]
    model = default_model if model is None else model
    sampling = dict(default_sampling if sampling is None else sampling)
    policy = load_policy(family, model, lora=None)
    items = eval_set_for_images("rl_heldout", images, seed=seed)
    para_items = [(paraphrase(prompt, seed, index).prompt(), s) for index, (prompt, s) in enumerate(items)]
    canonical, _ = evaluate_policy(policy, items, sampling, batch_size=36)
    paraphrased, _ = evaluate_policy(policy, para_items, sampling, batch_size=36)
    scores = {
        name: [float(s["correct"]) for s in r["per_sample"]]
        for name, r in (("c", canonical), ("p", paraphrased))
    }
    categories = [s["category"] for s in canonical["per_sample"]]
    change = paired_change_interval(scores["c"], scores["p"], categories)
    by_kind: dict[str, list[float]] = {}
    for index, (prompt, _) in enumerate(items):
        kinds = paraphrase(prompt, seed, index).kinds
        for kind in kinds:
            by_kind.setdefault(kind, []).append(scores["p"][index] - scores["c"][index])
    return {
        "family": family,
        "model": str(model),
        "images": len(items),
        "sampling": sampling,
        "canonical": canonical["overall"],
        "canonical_ci": _score_interval(canonical),
        "paraphrased": paraphrased["overall"],
        "paraphrased_ci": _score_interval(paraphrased),
        "change": change[0],
        "change_ci": [change[1], change[2]],
        "per_category_canonical": canonical["per_category"],
        "per_category_paraphrased": paraphrased["per_category"],
        "mean_change_by_kind": {k: sum(v) / len(v) for k, v in by_kind.items()},
    }


# -- command line -------------------------------------------------------------------------------------


def _card(out: Path, measured: dict, gap: dict | None) -> None:
    (out / "card.json").write_text(json.dumps({"rewriter": measured, "generator_gap": gap}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m genalign.toy.rewriter", description=__doc__.split("\n")[0]
    )
    parser.add_argument("command", choices=("init", "card", "measure", "gap"))
    parser.add_argument("--out", type=Path, default=REWRITER_DIR)
    parser.add_argument("--model", type=Path, default=REWRITER_DIR)
    parser.add_argument("--images", type=int, default=216)
    parser.add_argument(
        "--family", choices=sorted(GAP_DEFAULTS), default="sd", help="gap: the generator's family"
    )
    parser.add_argument(
        "--generator", help="gap: the generator (default: toy-sd, or toy-flow for --family flow)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=96)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.command == "init":
        model, _ = build_rewriter(args.out, args.hidden, args.layers, seed=args.seed)
        print(json.dumps({"out": str(args.out), "parameters": sum(p.numel() for p in model.parameters())}))
    elif args.command == "gap":
        gap = generator_gap(args.generator, images=args.images, seed=args.seed, family=args.family)
        print(json.dumps(gap, indent=2))
    elif args.command == "measure":
        print(json.dumps(measure_rewriter(args.model, args.seed), indent=2))
    else:
        if args.model.resolve() != args.out.resolve():
            shutil.copytree(args.model, args.out, dirs_exist_ok=True)
        measured = measure_rewriter(args.out, args.seed)
        previous = (
            json.loads((args.out / "card.json").read_text()) if (args.out / "card.json").is_file() else {}
        )
        _card(args.out, measured, previous.get("generator_gap"))  # `gap` measures it (toy-sd, slower)
        print(json.dumps(measured, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
