"""``tiny:NAME`` model paths: build a tiny model once, save it, and load it like any folder.

Recipes under ``configs/tiny/`` name models as ``tiny:sd``, ``tiny:flux`` ... (``tiny:qwen2`` and
``tiny:llava`` and ``tiny:qwen25_vl`` are the language family's transformers folders). The first use
builds the model with its :mod:`genalign.tiny` builder (seed 0), saves it with
``save_pretrained`` into a cache folder (keyed by a hash of the builders' source, so an edited
builder never serves a stale model), and every use then loads that folder through the same
``from_pretrained`` path a hub model takes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from genalign.policies.model_folder import require_local_path

TINY_PREFIX = "tiny:"


def _builders() -> dict[str, Callable]:
    from genalign.tiny import diffusion, language, video

    return {
        "qwen2": language.qwen2_lm,  # transformers folders: the language family
        "llava": language.llava_vlm,
        "qwen25_vl": language.qwen25_vl,  # Qwen2.5-VL: 3-D rotary positions, packed pixel_values
        "qwen2_vl": language.qwen2_vl,
        "sd": diffusion.sd_pipeline,
        "sdxl": diffusion.sdxl_pipeline,
        "sd3": diffusion.sd3_pipeline,
        "flux": diffusion.flux_pipeline,
        "sana": diffusion.sana_pipeline,
        "lcm": diffusion.lcm_pipeline,
        "pixart": diffusion.pixart_pipeline,
        "ar_video": video.ar_video_pipeline,  # the ar_video family's block-causal video pipeline
    }


# saved by transformers (config.json), not diffusers
LANGUAGE_MODELS = ("qwen2", "llava", "qwen25_vl", "qwen2_vl")


def _complete_marker(name: str) -> str:
    """The file a finished save of tiny model ``name`` holds."""
    return "config.json" if name in LANGUAGE_MODELS else "model_index.json"


def _builder_fingerprint(name: str = "sd") -> str:
    """Changes whenever the builders or their library change, so a stale cached model is never
    reused (diffusers' builders and version for pipelines, transformers' for language models)."""
    import hashlib

    from genalign.tiny import tokenizers

    if name in LANGUAGE_MODELS:
        import transformers as library

        from genalign.tiny import language as builders
    else:
        import diffusers as library

        from genalign.tiny import diffusion as builders
    modules = [builders, tokenizers]
    if name == "ar_video":  # built in its own module (on diffusion's tokenizer and helpers)
        from genalign.tiny import video

        modules.append(video)
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(module.__file__).read_bytes())
    digest.update(library.__version__.encode())
    return digest.hexdigest()[:10]


def tiny_cache_dir() -> Path:
    return Path(os.environ.get("GENALIGN_TINY_CACHE", Path.home() / ".cache" / "genalign" / "tiny"))


def _wait_for(path: Path, timeout: float = 900.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for local rank 0 to build {path.parent}")
        time.sleep(0.2)


def materialize(path: str | Path) -> str:
    """Resolve ``tiny:NAME`` to a saved folder (building it on first use); other paths pass through,
    except a local-looking path (``./``, ``/``, ``~``, two separators) that does not exist, which
    raises naming it rather than letting the hub client report a failed download."""
    text = str(path)
    if not text.startswith(TINY_PREFIX):
        require_local_path(text)
        return text
    name = text[len(TINY_PREFIX) :]
    builders = _builders()
    if name not in builders:
        raise KeyError(f"unknown tiny model {name!r}; known: {', '.join(sorted(builders))}")
    folder = tiny_cache_dir() / f"{name}-{_builder_fingerprint(name)}"
    marker = folder / _complete_marker(name)
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank not in (None, "0") and not marker.is_file():
        # one builder per machine: under torchrun/accelerate only local rank 0 builds (saving
        # from other ranks is unreliable: transformers skips writes off the main process)
        _wait_for(marker)
    if not marker.is_file():
        staging = folder.with_name(f"{name}.tmp-{os.getpid()}")
        builders[name](seed=0, save_to=staging)
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(staging, folder)
        except OSError:  # another process finished first
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
    return str(folder)
