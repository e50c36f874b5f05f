"""Checks on a model path before diffusers loads it: a local pipeline folder that is incomplete,
or a path that cannot be a hub id, fails naming the missing file or folder; a hub id that is not
in the local cache while the hub cannot be reached fails at once, naming it."""

from __future__ import annotations

import json
from pathlib import Path

from genalign.utils.hub import looks_like_local_path, require_hub_access, require_local_path

__all__ = ["check_model_folder", "looks_like_local_path", "require_hub_access", "require_local_path"]


def check_model_folder(path: str | Path) -> None:
    """Fail early, naming the file, when a local diffusers pipeline folder is incomplete."""
    root = Path(path)
    index = root / "model_index.json"
    if not index.is_file():
        raise FileNotFoundError(f"{root} is not a diffusers pipeline folder: missing file {index}")
    components = json.loads(index.read_text())
    for name, spec in components.items():
        if name.startswith("_") or not isinstance(spec, list) or spec[0] is None:
            continue
        folder = root / name
        if not folder.is_dir():
            raise FileNotFoundError(f"model folder {root} is missing component folder {folder}")
        library, class_name = spec
        if "Scheduler" in class_name:
            needed = ["scheduler_config.json"]
        elif "Tokenizer" in class_name or "Processor" in class_name:
            continue
        else:
            needed = ["config.json"]
        for filename in needed:
            if not (folder / filename).is_file():
                raise FileNotFoundError(f"model folder {root} is missing file {folder / filename}")
        if needed == ["config.json"] and not any(
            p.suffix in {".safetensors", ".bin"} for p in folder.iterdir() if p.is_file()
        ):
            raise FileNotFoundError(f"model folder {root} is missing the weights of {name!r} in {folder}")
