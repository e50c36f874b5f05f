"""Whether a hub id can be loaded at all: a hub id that is neither a local folder nor in the local
hub cache while the hub cannot be reached fails at once with a message naming it."""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["hub_unreachable", "looks_like_local_path", "require_hub_access"]


def looks_like_local_path(path: str | Path) -> bool:
    """A path that cannot be a hub id ``organisation/name``: absolute, relative with ``./``,
    ``../`` or ``~``, or with more than one separator. Such a path that does not exist is a missing
    folder, which deserves that error rather than the hub's "could not connect"."""
    text = str(path)
    return text.startswith(("/", "./", "../", "~")) or "\\" in text or text.count("/") >= 2


def _is_hub_id(text: str) -> bool:
    """``organisation/name``: one separator, no scheme or prefix, not an existing path."""
    return (
        text.count("/") == 1
        and ":" not in text
        and not text.startswith(".")
        and not looks_like_local_path(text)
        and not Path(text).exists()
    )


def require_local_path(path: str | Path, what: str = "model folder") -> None:
    """Raise naming ``path`` (as ``what``) when it cannot be a hub id (:func:`looks_like_local_path`)
    and does not exist, rather than letting the hub client report a failed download; then
    :func:`require_hub_access`."""
    if looks_like_local_path(path) and not Path(path).exists():
        raise FileNotFoundError(f"{what} {path} does not exist (a hub id has the form 'organisation/name')")
    require_hub_access(path)


def require_hub_access(path: str | Path) -> None:
    """Raise naming ``path`` when it is a hub id ``organisation/name`` that is neither a local
    folder nor in the local hub cache while the hub cannot be reached (``HF_HUB_OFFLINE`` set, or
    the hub's host does not resolve). Without this check the hub client retries for about 40
    seconds, printing each retry twice, and then reports a missing ``model_index.json``."""
    text = str(path)
    if not _is_hub_id(text):
        return
    from huggingface_hub import constants

    cached = Path(constants.HF_HUB_CACHE) / ("models--" + text.replace("/", "--"))
    if cached.is_dir():
        return
    reason = hub_unreachable()
    if reason:
        raise ConnectionError(
            f"{text} is not a local folder and not in the hub cache ({constants.HF_HUB_CACHE}), and the "
            f"Hugging Face hub cannot be reached ({reason}): download it where there is a network, or "
            "give a local folder"
        )


@functools.lru_cache(maxsize=1)
def hub_unreachable() -> str | None:
    """Why the hub cannot be reached, or None when it may be (a proxy is set: its own DNS decides)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError as error:
        return f"{host} does not resolve: {error.strerror or error}"
    return None
