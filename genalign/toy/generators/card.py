"""Model cards of the toy generators: ``card.json`` and the README rendered from it, and the
records that chain training stages (their commands, steps and seconds)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from genalign.toy.training import folder_megabytes, write_card_files


def write_card(out: str | Path, card: dict[str, Any]) -> None:
    """Write ``card.json`` and a README.md rendered from it."""
    out = Path(out)
    card = dict(card, size_mb=folder_megabytes(out))
    write_card_files(out, card, _readme(card))


def _table(result: dict[str, Any]) -> str:
    """A ShapesEval result as a markdown table (per category, then overall)."""
    rows = [
        f"| {c} | {result['per_category'][c]:.3f} | {result['counts'][c]} |" for c in result["per_category"]
    ]
    return "\n".join(
        [
            "| category | accuracy | images |",
            "|---|---|---|",
            *rows,
            f"| **overall** | **{result['overall']:.3f}** | |",
        ]
    )


def _readme(card: dict[str, Any]) -> str:
    full, subset = card["eval"], card["eval_subset"]
    table = _table
    extra = "".join(
        f"\n### {name}\n\n{table(result)}\n\nSettings: `{json.dumps(result['settings'])}`\n"
        for name, result in card.get("extra_evals", {}).items()
    )
    params = ", ".join(f"{k} {v:,}" for k, v in card["parameters"].items())
    return f"""# {card["name"]}

{card["description"]}

Built by `genalign/toy/generators/` (issue #6). Load it with
`{card["load"]}` or `genalign.policies.load_policy("{card["family"]}", "assets/models/{card["name"]}")`.

## Recipe

```
{chr(10).join(card["commands"])}
```

- Data: {card["data"]}
- Parameters: {params} (fp32); {card["size_mb"]} MB on disk.
- Training: {card["train"]}
{card.get("notes", "")}

## ShapesEval (held-out prompts)

Settings: `{json.dumps(full["settings"])}`

{table(full)}

Small fixed subset (re-scored by `tests/toy/test_toy_generators.py`):
settings `{json.dumps(subset["settings"])}`, overall {subset["overall"]:.4f}.
{extra}
Reproduce: `evaluate_generator(path, family, **settings)` in `genalign.toy.generators`
(`steps`, `guidance`, `seed`, `num_per_prompt`, `split`, `per_category` as above).
"""


def add_previous_stages(info: dict[str, Any], init: str | None) -> tuple[float, int]:
    """Add the stages ``init`` was trained in to ``info``'s seconds and ``total_train_steps``;
    returns this stage's ``(seconds, total steps over all stages)``."""
    stage_seconds, total_steps = info["train_seconds"], info["steps"]
    if init:
        previous = json.loads((Path(init) / "card.json").read_text())
        info["train_seconds"] += previous["train_seconds"]
        total_steps += previous.get("total_train_steps", previous["train_steps"])
    info["total_train_steps"] = total_steps
    return stage_seconds, total_steps


def command_line() -> str:
    """The command being run, as a card records it (the shipped models' commands are replayed
    from their cards)."""
    return "python -m genalign.toy.generators " + " ".join(sys.argv[1:])


def previous_commands(out: Path) -> list[str]:
    card = out / "card.json"
    return json.loads(card.read_text())["commands"] if card.exists() else []


def stage_commands(previous: Sequence[str], vae_command: str, command: str) -> list[str]:
    """The commands that reproduce a stage: the earlier stages', then the VAE's when it is not among
    them (a first stage, or a stage that moves to another VAE), then this stage's."""
    return [*previous, *([] if vae_command in previous else [vae_command]), command]
