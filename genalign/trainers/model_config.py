"""Recipe schemas of what a run loads: ``model`` (:class:`ModelConfig`, with ``model.lora``,
:class:`LoRAConfig`) and the prompt rewriter of a joint run (``rewriter``, :class:`RewriterConfig`).
Re-exported by :mod:`genalign.trainers.config`, which holds the rest of a recipe."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from genalign.config import ConfigError


@dataclass
class LoRAConfig:
    """``model.lora``: LoRA adapters on the denoiser (:class:`genalign.policies.LoRASpec`).

    ``rank``: the adapters' rank; ``alpha``: their scale numerator (None: ``rank``, a scale of 1);
    ``target_modules``: names of the adapted linear layers; ``dropout``: LoRA dropout; ``seed``:
    the adapters' initialisation is drawn from it, not from the global RNG.
    """

    rank: int = 4
    alpha: float | None = None
    target_modules: list[str] = field(default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0"])
    dropout: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rank <= 0:
            raise ConfigError(f"model.lora.rank must be positive, got {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout must lie in [0, 1), got {self.dropout}")


DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class ModelConfig:
    """``model``: what to load and train.

    ``family``: a registered policy family (``genalign list``); ``path``: hub id, local folder or
    ``tiny:NAME``; ``lora``: LoRA adapters (None: full fine-tuning of the denoiser); ``dtype``:
    weight dtype of the frozen parts, e.g. "bfloat16" (None: the checkpoint's); ``frozen``: under
    full fine-tuning of a ``language`` model, parameter-name prefixes kept frozen (e.g.
    ``[model.vision_tower]``: a VLM's image encoder, which Adam's normalised noise would move);
    ``local_window``: ``[local_frames, sink_frames]`` of an ``ar_video`` model, LongLive's short
    window with sink frames (``[12, 3]`` for LongLive-1.3B; None: full block-causal attention);
    ``processor``: keyword arguments of a ``language`` model's processor (a VLM's) or tokenizer
    ``from_pretrained``, e.g. ``{max_pixels: 786432}``: the largest image area a Qwen2-VL /
    Qwen2.5-VL processor passes on (larger images are resized to fit; the checkpoint's own
    setting otherwise). The trained model's folder saves the processor with them.
    """

    family: str = "sd"
    path: str = ""
    lora: LoRAConfig | None = field(default_factory=LoRAConfig)
    dtype: str | None = None
    frozen: list[str] = field(default_factory=list)
    local_window: list[int] | None = None
    processor: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("model.path is required (a hub id or a local diffusers folder)")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(
                f"model.dtype must be one of {', '.join(DTYPES)} (or unset), got {self.dtype!r}"
            )
        if self.local_window is not None:
            window = self.local_window
            if self.family != "ar_video":
                raise ConfigError(
                    f"model.local_window is for the 'ar_video' family, but model.family is {self.family!r}"
                )
            if len(window) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in window):
                raise ConfigError(
                    f"model.local_window must be [local_frames, sink_frames] (two integers), got {window!r}"
                )
            if not 0 <= window[1] < window[0]:
                raise ConfigError(f"model.local_window {window!r}: need local_frames > sink_frames >= 0")
        if self.processor and self.family != "language":
            raise ConfigError(
                f"model.processor is for the 'language' family, but model.family is {self.family!r}"
            )

    def policy_options(self) -> dict[str, Any]:
        """The family-specific keyword arguments of ``load_policy`` this section sets."""
        options: dict[str, Any] = {"frozen": list(self.frozen)} if self.frozen else {}
        if self.local_window is not None:
            options["local_window"] = tuple(self.local_window)
        if self.processor:
            options["processor_kwargs"] = dict(self.processor)
        return options


@dataclass
class RewriterConfig:
    """``rewriter``: the prompt rewriter of a joint run (PromptRL's language model; strategy
    ``prompt_rewrite``), loaded beside the generator of ``model``.

    ``family``: ``language``; ``path``: hub id, local transformers folder or ``tiny:qwen2``;
    ``lora``: LoRA adapters on the LM's layers (None: full fine-tuning with a frozen reference
    copy, as UniRL trains it); ``dtype``: the frozen weights' dtype; ``learning_rate``: the
    rewriter's AdamW learning rate (UniRL: 1e-6 beside the DiT's 2e-7; None:
    ``train.policy_learning_rates.rewriter`` or ``train.learning_rate``).
    """

    family: str = "language"
    path: str = ""
    lora: LoRAConfig | None = None
    dtype: str | None = None
    learning_rate: float | None = None

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("rewriter.path is required (a hub id, a local folder or tiny:qwen2)")
        if self.family != "language":
            raise ConfigError(f"rewriter.family must be 'language', got {self.family!r}")
        if self.lora is not None and list(self.lora.target_modules) == LoRAConfig().target_modules:
            raise ConfigError(
                f"rewriter.lora.target_modules {list(self.lora.target_modules)} are a diffusers denoiser's "
                "layers; a language model's are e.g. [q_proj, k_proj, v_proj, o_proj]"
            )
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ConfigError(f"rewriter.learning_rate must be positive, got {self.learning_rate}")
