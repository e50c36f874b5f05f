"""Paraphrases of toy captions: the same scenes asked for in other words (issue #24 item 5).

A prompt rewriter (PromptRL, arXiv 2602.01382) has something to learn only when the generator
follows some wordings better than others. toy-sd was trained on the canonical GenEval captions
(``a photo of a red circle and a blue square``) and its text encoder's toy tokenizer spells any
word outside that vocabulary letter by letter, in a context of 16 tokens, so a paraphrase both
uses words toy-sd never saw and can push the objects past the end of its context.

Each :class:`Paraphrase` keeps its canonical caption, category and **spec** (the verifier checks
exactly what the canonical caption asks for). Three kinds of change, each meaning-preserving in
the toy world (filled shapes on a white canvas):

- ``synonym``: "a photo of" -> "a picture of" / "an image of" / "a photograph of" / nothing;
  "circle" -> "disc" / "circle shape", "diamond" -> "rhombus" / "diamond shape", "square" ->
  "square shape", "triangle" -> "triangle shape"; "three" -> "3" / "exactly three", "two" ->
  "a pair of"; "left of" -> "to the left of", "above" -> "positioned above", ...;
- ``order``: the colour after the shape ("a circle that is red", "a circle coloured red"); a
  position caption from its target ("a square with a circle left of it");
- ``verbose``: a request around the caption ("i would like to see ...", "please draw ...").

:func:`paraphrase` draws one deterministically from ``(seed, caption, index)``;
:func:`paraphrase_set` paraphrases a split (:func:`balanced_paraphrases`: as many per category); :func:`read_paraphrase` reads any paraphrase back
into its spec (the ``shapes_eval`` reward falls back on it, so a paraphrased prompt is scored by
its own spec); :func:`write_paraphrase_files` writes ``configs/prompts/toy_paraphrased_*``
(``toy_paraphrased_rl_train_balanced.txt`` is ``configs/toy/promptrl.yaml``'s prompt file).
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from genalign.toy.captions import (
    NUMBERS,
    CaptionParseError,
    Spec,
    caption_for_spec,
    parse_caption,
    plural,
    positioned_clause,
)
from genalign.toy.prompts import PromptSpec, balanced_prompts, prompts_for
from genalign.toy.scenes import json_record

__all__ = [
    "KINDS",
    "Paraphrase",
    "balanced_paraphrases",
    "paraphrase",
    "paraphrase_set",
    "read_paraphrase",
    "write_paraphrase_files",
]

KINDS: tuple[str, ...] = ("synonym", "order", "verbose")
PROMPT_DIR = Path(__file__).resolve().parents[2] / "configs" / "prompts"
PREFIX_SYNONYMS = ("a picture of ", "an image of ", "a photograph of ", "")
SHAPE_SYNONYMS: dict[str, tuple[tuple[str, str], ...]] = {  # (singular, plural)
    "circle": (("disc", "discs"), ("circle shape", "circle shapes")),
    "square": (("square shape", "square shapes"),),
    "triangle": (("triangle shape", "triangle shapes"),),
    "diamond": (("rhombus", "rhombuses"), ("diamond shape", "diamond shapes")),
}
RELATION_SYNONYMS: dict[str, tuple[str, ...]] = {
    "left of": ("to the left of", "on the left of"),
    "right of": ("to the right of", "on the right of"),
    "above": ("positioned above", "placed above"),
    "below": ("positioned below", "placed below"),
}
COLOUR_AFTER = ("{a} {shape} that is {colour}", "{a} {shape} coloured {colour}")
COLOURS_AFTER = ("{n} {shapes} that are {colour}", "{n} {shapes} coloured {colour}")
VERBOSE = (
    "i would like to see {x}",
    "please draw {x}",
    "show me {x}",
    "can you generate {x}?",
    "{x}, please",
    "could you make {x} for me?",
)


@dataclass(frozen=True)
class Paraphrase:
    """A reworded caption: ``text`` asks for exactly the scenes of ``canonical`` (same ``spec``)."""

    text: str
    canonical: str
    category: str
    spec: Spec
    kinds: tuple[str, ...]

    def prompt(self) -> PromptSpec:
        """As a :class:`PromptSpec` whose caption is the paraphrase (for ``evaluate_policy``)."""
        return PromptSpec(self.text, self.category, self.spec)

    def to_record(self) -> dict[str, Any]:
        return {"prompt": self.text, **json_record(self, "canonical", "kinds", "spec")}


# -- writing ----------------------------------------------------------------------------------------


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _noun_phrase(clause: dict[str, Any], rng: np.random.Generator, kinds: set[str]) -> str:
    """One include clause in words, with the synonyms / orders of ``kinds``."""
    shape, count, colour = clause["class"], clause["count"], clause.get("color")
    singular, plural_word = shape, plural(shape)
    if "synonym" in kinds and rng.random() < 0.6:
        singular, plural_word = SHAPE_SYNONYMS[shape][int(rng.integers(len(SHAPE_SYNONYMS[shape])))]
    if count == 1:
        if colour and "order" in kinds:
            template = COLOUR_AFTER[int(rng.integers(len(COLOUR_AFTER)))]
            return template.format(a=_article(singular), shape=singular, colour=colour)
        words = f"{colour} {singular}" if colour else singular
        return f"{_article(words)} {words}"
    number = NUMBERS[count]
    if "synonym" in kinds:
        choices = [str(count), f"exactly {number}"] + (["a pair of"] if count == 2 else [])
        number = choices[int(rng.integers(len(choices)))]
    if colour and "order" in kinds:
        template = COLOURS_AFTER[int(rng.integers(len(COLOURS_AFTER)))]
        return template.format(n=number, shapes=plural_word, colour=colour)
    return " ".join(w for w in (number, colour, plural_word) if w)


def _body(spec: Spec, rng: np.random.Generator, kinds: set[str]) -> str:
    positioned = positioned_clause(spec)
    if not positioned:
        return " and ".join(_noun_phrase(c, rng, kinds) for c in spec["include"])
    subject, relation, target = positioned
    words = relation
    if "synonym" in kinds:
        words = RELATION_SYNONYMS[relation][int(rng.integers(len(RELATION_SYNONYMS[relation])))]
    a, b = _noun_phrase(subject, rng, kinds), _noun_phrase(target, rng, kinds)
    if "order" in kinds:
        return f"{b} with {a} {words} it"
    return f"{a} {words} {b}"


def _kinds_for(spec: Spec, rng: np.random.Generator) -> set[str]:
    """A non-empty random subset of :data:`KINDS` that can change this caption."""
    possible = ["synonym", "verbose"]
    if spec["tag"] == "position" or any(c.get("color") for c in spec["include"]):
        possible.append("order")
    while True:
        kinds = {k for k in possible if rng.random() < 0.5}
        if kinds:
            return kinds


def paraphrase(
    prompt: PromptSpec, seed: int = 0, index: int = 0, kinds: tuple[str, ...] | None = None
) -> Paraphrase:
    """The ``index``-th paraphrase of ``prompt`` under ``seed``: a pure function of
    ``(seed, caption, index)`` (and ``kinds``, else a random non-empty subset of :data:`KINDS`);
    always different from the canonical caption."""
    key = zlib.crc32(prompt.caption.encode())
    for attempt in range(100):
        rng = np.random.default_rng([seed, key, index, attempt])
        chosen = set(kinds) if kinds is not None else _kinds_for(prompt.spec, rng)
        prefix = "a photo of "
        if "synonym" in chosen and rng.random() < 0.7:
            prefix = PREFIX_SYNONYMS[int(rng.integers(len(PREFIX_SYNONYMS)))]
        text = prefix + _body(prompt.spec, rng, chosen)
        if "verbose" in chosen:
            text = VERBOSE[int(rng.integers(len(VERBOSE)))].format(x=text)
        if text != prompt.caption:
            used = tuple(k for k in KINDS if k in chosen)
            return Paraphrase(text, prompt.caption, prompt.category, prompt.spec, used)
    raise RuntimeError(f"no paraphrase of {prompt.caption!r} differs from it")  # pragma: no cover


def paraphrase_set(split: str = "rl_heldout", per_prompt: int = 1, seed: int = 0) -> list[Paraphrase]:
    """``per_prompt`` paraphrases of every prompt of ``split`` (in the split's order)."""
    return [paraphrase(p, seed, i) for p in prompts_for(split) for i in range(per_prompt)]


def balanced_paraphrases(split: str = "rl_train", per_category: int = 40, seed: int = 0) -> list[Paraphrase]:
    """One paraphrase per line of :func:`~genalign.toy.prompts.balanced_prompts` (the same
    captions per category as ``configs/toy/rl_train_prompts.txt``); a repeated caption's k-th
    line gets its k-th paraphrase."""
    by_caption = {p.caption: p for p in prompts_for(split)}
    seen: dict[str, int] = {}
    items = []
    for caption in balanced_prompts(split, per_category):
        index = seen[caption] = seen.get(caption, -1) + 1
        items.append(paraphrase(by_caption[caption], seed, index))
    return items


# -- reading ----------------------------------------------------------------------------------------

_VERBOSE_PATTERNS = [
    re.compile("^" + re.escape(v).replace(re.escape("{x}"), "(?P<x>.+)") + "$") for v in VERBOSE
]
_BODY_REPLACEMENTS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b(on|to) the (left|right) of\b"), r"\2 of"),
    (re.compile(r"\b(positioned|placed) (above|below)\b"), r"\2"),
    (re.compile(r"\ba pair of\b"), "two"),
    (re.compile(r"\bexactly (\w+)\b"), r"\1"),
    (re.compile(r"\b(circle|square|triangle|diamond) shape(s?)\b"), r"\1\2"),
    (re.compile(r"\bdisc(s?)\b"), r"circle\1"),
    (re.compile(r"\brhombuses\b"), "diamonds"),
    (re.compile(r"\brhombus\b"), "diamond"),
    (re.compile(r"\b(an?|\w+) (\w+) (?:that is|that are|coloured) (\w+)\b"), r"\1 \3 \2"),
    (re.compile(r"\ban (?=[^aeiou\W])"), "a "),
    (re.compile(r"\ba (?=[aeiou])"), "an "),
]
_WITH_IT = re.compile(r"^(?P<b>.+?) with (?P<a>.+) (?P<rel>left of|right of|above|below) it$")


def _normalise(text: str) -> str:
    text = " ".join(text.lower().strip().split())
    for pattern in _VERBOSE_PATTERNS:
        match = pattern.match(text)
        if match:
            text = match["x"]
            break
    text = text.rstrip("?.")
    for prefix in ("a photo of ", "a photograph of ", "a picture of ", "an image of "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    for pattern, replacement in _BODY_REPLACEMENTS:
        text = pattern.sub(replacement, text)
    match = _WITH_IT.match(text)
    if match:
        text = f"{match['a']} {match['rel']} {match['b']}"
    return text


def read_paraphrase(text: str) -> Spec:
    """The spec of a caption :func:`~genalign.toy.captions.parse_caption` reads (as it reads it)
    or of any paraphrase :func:`paraphrase` writes (its ``prompt`` then the canonical caption);
    raises :class:`CaptionParseError` on anything else."""
    try:
        return parse_caption(text)
    except CaptionParseError:
        spec = parse_caption(_normalise(text))
    spec["prompt"] = caption_for_spec(spec)
    return spec


# -- files ------------------------------------------------------------------------------------------


def write_paraphrase_files(
    directory: str | Path = PROMPT_DIR, per_prompt: int = 2, seed: int = 0
) -> dict[str, Path]:
    """Write ``toy_paraphrased_{rl_train,rl_heldout}.txt`` (one paraphrase a line, behind a
    header comment) and ``.jsonl`` (records: ``prompt``, ``canonical``, ``kinds``, ``spec``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in ("rl_train", "rl_heldout"):
        items = paraphrase_set(split, per_prompt, seed)
        header = (
            f"# Paraphrases of the toy world's {split} captions: genalign.toy.paraphrase.paraphrase_set("
            f"{split!r}, per_prompt={per_prompt}, seed={seed}).\n"
            "# Written by write_paraphrase_files(); do not edit by hand. Specs in the .jsonl beside it.\n"
        )
        txt = directory / f"toy_paraphrased_{split}.txt"
        txt.write_text(header + "".join(p.text + "\n" for p in items), encoding="utf-8")
        jsonl = directory / f"toy_paraphrased_{split}.jsonl"
        jsonl.write_text(
            "".join(json.dumps(p.to_record(), sort_keys=True) + "\n" for p in items), encoding="utf-8"
        )
        paths[split], paths[f"{split}_records"] = txt, jsonl
    balanced = directory / "toy_paraphrased_rl_train_balanced.txt"
    header = (
        f"# RL-train prompts for PromptRL: genalign.toy.paraphrase.balanced_paraphrases('rl_train', 40, seed={seed}),\n"
        "# one paraphrase per line of configs/toy/rl_train_prompts.txt (40 per category). Written by\n"
        "# write_paraphrase_files(); do not edit by hand. The shapes_eval reward reads their specs back.\n"
    )
    items = balanced_paraphrases("rl_train", 40, seed)
    balanced.write_text(header + "".join(p.text + "\n" for p in items), encoding="utf-8")
    paths["rl_train_balanced"] = balanced
    return paths
