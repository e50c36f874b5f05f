"""Finding and reading reward checkpoints: local files first, the Hugging Face hub otherwise.

Reward heads ship as single files (HPS v2's ``HPS_v2.1_compressed.pt``, the LAION aesthetic
predictor's ``sac+logos+ava1-l14-linearMSE.pth``). A reward takes ``checkpoint=<local path>``, or
``None`` to fetch its default file from the hub (cached by ``huggingface_hub``). A missing local
file is an error that names the file, never a silent download or a random head.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from genalign.utils.hub import require_hub_access

SAFETENSORS_SUFFIXES = (".safetensors",)


def looks_like_local_path(name: str) -> bool:
    """True when ``name`` is meant as a path rather than a hub id (``org/name``) or a tag.

    Hub ids have at most one ``/`` and no leading ``.``, ``~`` or ``/``; anything else, and
    anything that exists on disk, is a path.
    """
    name = str(name)
    return (
        os.path.exists(name)
        or os.path.isabs(name)
        or name.startswith((".", "~"))
        or name.count("/") >= 2
        or "\\" in name
        or name.endswith((".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".json"))
    )


def pretrained_source(source: str | os.PathLike, what: str) -> str:
    """A folder or hub id for ``from_pretrained``: a local-looking path that is not a folder raises
    naming ``what`` (``~`` expanded), and a hub id that can be neither read from the cache nor
    downloaded raises at once (:func:`genalign.utils.hub.require_hub_access`)."""
    source = os.fspath(source)
    if looks_like_local_path(source):
        source = os.path.expanduser(source)
        if not os.path.isdir(source):
            raise FileNotFoundError(f"{what} folder not found: {source}")
    require_hub_access(source)
    return source


def require_file(path: str | os.PathLike, what: str = "checkpoint") -> str:
    """Return ``path`` as a string if it is a file, else raise ``FileNotFoundError`` naming it."""
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        hint = " (it is a directory)" if os.path.isdir(path) else ""
        raise FileNotFoundError(f"{what} file not found: {path}{hint}")
    return path


def resolve_checkpoint(
    checkpoint: str | os.PathLike | None, *, repo_id: str, filename: str, what: str = "checkpoint"
) -> str:
    """A local checkpoint path, or ``filename`` from hub repo ``repo_id`` when ``checkpoint`` is None."""
    if checkpoint is not None:
        return require_file(checkpoint, what)
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(repo_id=repo_id, filename=filename)
    except Exception as error:  # offline, gated, missing: say what to do instead
        raise FileNotFoundError(
            f"{what}: could not get {filename!r} from the hub repo {repo_id!r} ({type(error).__name__}: {error}); "
            f"download it and pass checkpoint=<local path>"
        ) from error


def load_state_dict_file(path: str | os.PathLike, what: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Read a state dict from ``.safetensors`` or a torch pickle (``weights_only=True``).

    Accepts a bare state dict or a training checkpoint ``{"state_dict": ...}`` (HPS v2's layout);
    strips the ``module.`` prefix that ``DistributedDataParallel`` adds.
    """
    path = require_file(path, what)
    if Path(path).suffix in SAFETENSORS_SUFFIXES:
        from safetensors.torch import load_file

        state = load_file(path, device="cpu")
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ValueError(f"{what} {path} does not hold a state dict of tensors")
    if state and all(key.startswith("module.") for key in state):
        state = {key[len("module.") :]: value for key, value in state.items()}
    return state
