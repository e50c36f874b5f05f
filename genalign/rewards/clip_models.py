"""One CLIP embedding helper for every CLIP-family reward (CLIPScore, PickScore, HPS, aesthetic).

A :class:`CLIPEmbedder` wraps a CLIP model of either library behind two calls::

    image_features = embedder.encode_images(images)   # [B, 3, H, W] in [0, 1] -> [B, D], float32
    text_features = embedder.encode_texts(prompts)    # list of N strings     -> [N, D], float32

Images are preprocessed on tensors with the model's own constants (:mod:`.preprocess`), so the
image path is differentiable; the text path never needs gradients and runs under ``no_grad``,
encoding each distinct prompt once. Features are the projected, *unnormalised* embeddings; the
rewards normalise them as their papers do.

Backends:

* ``open_clip``: ``model`` is an architecture name (``"ViT-B-32"``), ``"hf-hub:org/repo"`` or
  ``"local-dir:/path"``; ``pretrained`` a tag (``"openai"``) or a checkpoint file (open_clip
  layout, ``{"state_dict": ...}`` accepted). A custom architecture is registered with
  ``model_config`` (a dict or a JSON file). QuickGELU is switched on when the pretrained tag was
  trained with it (OpenAI weights), so ``("ViT-B-32", "openai")`` gives OpenAI's CLIP.
* ``transformers``: ``model`` is a hub id or folder of a ``CLIPModel``; ``processor`` (default:
  the same) a hub id or folder holding the image processor and tokenizer.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from genalign.rewards.base import Reward
from genalign.rewards.checkpoints import looks_like_local_path, pretrained_source, require_file
from genalign.rewards.preprocess import ImagePreprocessor, PreprocessConfig
from genalign.utils.hub import require_hub_access

logger = logging.getLogger(__name__)

BACKENDS = ("open_clip", "transformers")


def _as_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    return names.get(dtype) or getattr(torch, str(dtype))


def _features(output: Any) -> torch.Tensor:
    """transformers >= 5 returns a model output from ``get_*_features``; older versions a tensor."""
    return output if torch.is_tensor(output) else output.pooler_output


class CLIPEmbedder(torch.nn.Module):
    """Base class: preprocessing + a frozen CLIP model; subclasses provide the two feature calls.

    Attributes:
        model: the wrapped CLIP model (frozen, eval mode).
        preprocess: differentiable tensor preprocessing with the model's constants.
    """

    backend: str = ""

    def __init__(self, model: torch.nn.Module, preprocess: PreprocessConfig) -> None:
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.preprocess = ImagePreprocessor(preprocess)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def embed_dim(self) -> int | None:
        """Size D of the projected features, when the model says it."""
        return None

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` in [0, 1] -> projected image features ``[B, D]`` (float32)."""
        pixels = self.preprocess(images.to(device=self.device))  # (B, 3, h, w), normalised
        return self._image_features(pixels.to(self.dtype)).float()

    @torch.no_grad()
    def encode_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """N strings -> projected text features ``[N, D]`` (float32); each distinct text encoded once."""
        unique = list(dict.fromkeys(texts))
        features = self._text_features(unique).float()  # (U, D)
        if len(unique) == len(texts):
            return features
        index = {text: i for i, text in enumerate(unique)}
        return features[torch.tensor([index[t] for t in texts], device=features.device)]

    def logit_scale(self) -> torch.Tensor:
        """CLIP's learned temperature, exponentiated (OpenAI CLIP caps it at 100)."""
        return self.model.logit_scale.detach().float().exp()

    def cosine(self, images: torch.Tensor, texts: Sequence[str]) -> torch.Tensor:
        """Cosine similarity of each image with its text, ``[B]`` in [-1, 1]."""
        image_features = torch.nn.functional.normalize(self.encode_images(images), dim=-1)
        text_features = torch.nn.functional.normalize(self.encode_texts(texts), dim=-1)
        return (image_features * text_features).sum(-1)

    def _image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _text_features(self, texts: list[str]) -> torch.Tensor:
        raise NotImplementedError


# -- open_clip -----------------------------------------------------------------------------------


def register_open_clip_config(name: str, config: Mapping[str, Any] | str | os.PathLike) -> str:
    """Make a custom open_clip architecture loadable by ``name``; returns the name.

    ``config`` is the architecture dict (``embed_dim``, ``vision_cfg``, ``text_cfg``, as in
    open_clip's ``model_configs/*.json``) or a path to such a JSON file. Registration goes through
    open_clip's public ``add_model_config``, which names a config after its file, so a dict is
    written to a temporary ``<name>.json`` first.
    """
    import open_clip

    if not isinstance(config, Mapping):
        path = Path(require_file(config, "open_clip model config"))
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
    config = dict(config.get("model_cfg", config))
    missing = [key for key in ("embed_dim", "vision_cfg", "text_cfg") if key not in config]
    if missing:
        raise ValueError(f"open_clip model config for {name!r} lacks {missing}")
    with tempfile.TemporaryDirectory(prefix="genalign-open-clip-") as folder:
        path = Path(folder) / f"{name}.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        open_clip.add_model_config(path)
    if name not in open_clip.list_models():
        raise RuntimeError(f"open_clip did not register model config {name!r}")
    return name


class OpenCLIPEmbedder(CLIPEmbedder):
    """CLIP embeddings from an open_clip model (any architecture, tag or checkpoint file).

    Args:
        model: architecture name, ``"hf-hub:org/repo"``, ``"local-dir:/path"``, or a built model.
        pretrained: tag (``"openai"``, ``"laion2B-s32B-b79K"``) or checkpoint file; None for none.
        model_config: dict or JSON path registering a custom architecture under ``model``.
        tokenizer: needed when ``model`` is a built model; otherwise ``open_clip.get_tokenizer``.
        device, dtype: where and in which precision the model runs.
        **create_kwargs: passed to ``open_clip.create_model`` (``force_quick_gelu`` ...).
    """

    backend = "open_clip"

    def __init__(
        self,
        model: str | torch.nn.Module = "ViT-B-32",
        pretrained: str | os.PathLike | None = None,
        model_config: Mapping[str, Any] | str | os.PathLike | None = None,
        tokenizer: Any = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        **create_kwargs: Any,
    ) -> None:
        import open_clip

        if isinstance(model, torch.nn.Module):
            if tokenizer is None:
                raise ValueError("OpenCLIPEmbedder: pass tokenizer= together with a built model")
            clip = model
        else:
            if model_config is not None:
                register_open_clip_config(model, model_config)
            if model.startswith("hf-hub:"):
                require_hub_access(model.removeprefix("hf-hub:").split("@")[0])
            if pretrained is not None:
                pretrained = os.fspath(pretrained)
                is_tag = bool(open_clip.get_pretrained_cfg(model, pretrained))
                if not is_tag and looks_like_local_path(pretrained):
                    pretrained = require_file(pretrained, f"open_clip checkpoint for {model!r}")
                elif is_tag and open_clip.get_pretrained_cfg(model, pretrained).get("quick_gelu", False):
                    create_kwargs.setdefault("force_quick_gelu", True)
            clip = open_clip.create_model(model, pretrained=pretrained, **create_kwargs)
            tokenizer = tokenizer or open_clip.get_tokenizer(model)
            logger.info("open_clip model %s loaded (pretrained=%s)", model, pretrained)
        super().__init__(clip, PreprocessConfig.from_open_clip(clip.visual.preprocess_cfg))
        self.tokenizer = tokenizer
        self.to(device=device, dtype=_as_dtype(dtype))

    @property
    def embed_dim(self) -> int | None:
        return getattr(self.model.visual, "output_dim", None)

    def _image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(pixel_values)

    def _text_features(self, texts: list[str]) -> torch.Tensor:
        tokens = self.tokenizer(texts).to(self.device)  # (N, context_length)
        return self.model.encode_text(tokens)


# -- transformers --------------------------------------------------------------------------------


class TransformersCLIPEmbedder(CLIPEmbedder):
    """CLIP embeddings from a transformers ``CLIPModel`` (hub id, folder, or built model).

    Args:
        model: hub id or folder of a ``CLIPModel``, or a built ``CLIPModel``.
        processor: hub id or folder with the image processor and tokenizer (default: ``model``),
            or a built ``CLIPProcessor``.
        device, dtype: where and in which precision the model runs.
    """

    backend = "transformers"

    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module = "openai/clip-vit-large-patch14",
        processor: str | os.PathLike | Any = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
    ) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

        if isinstance(model, torch.nn.Module):
            clip = model
            if processor is None:
                raise ValueError("TransformersCLIPEmbedder: pass processor= together with a built model")
        else:
            model = pretrained_source(model, "CLIP model")
            clip = CLIPModel.from_pretrained(model)
            processor = processor if processor is not None else model
            logger.info("transformers CLIPModel loaded from %s", model)
        if isinstance(processor, (str, os.PathLike)):
            source = pretrained_source(processor, "CLIP processor")
            image_processor = AutoImageProcessor.from_pretrained(source)
            tokenizer = AutoTokenizer.from_pretrained(source)
        else:
            image_processor = processor.image_processor
            tokenizer = processor.tokenizer
        super().__init__(clip, PreprocessConfig.from_image_processor(image_processor))
        self.tokenizer = tokenizer
        self.max_length = int(clip.config.text_config.max_position_embeddings)
        self.to(device=device, dtype=_as_dtype(dtype))

    @property
    def embed_dim(self) -> int | None:
        return int(self.model.config.projection_dim)

    def _image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return _features(self.model.get_image_features(pixel_values=pixel_values))

    def _text_features(self, texts: list[str]) -> torch.Tensor:
        inputs = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        return _features(
            self.model.get_text_features(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
            )
        )


def load_clip_embedder(backend: str = "open_clip", **kwargs: Any) -> CLIPEmbedder:
    """Build a :class:`CLIPEmbedder` for ``backend`` ("open_clip" or "transformers")."""
    if backend == "open_clip":
        return OpenCLIPEmbedder(**kwargs)
    if backend == "transformers":
        return TransformersCLIPEmbedder(**kwargs)
    raise ValueError(f"unknown CLIP backend {backend!r}; choose one of {BACKENDS}")


def load_backend_embedder(
    backend: str,
    model: Any,
    pretrained: Any = None,
    model_config: Any = None,
    processor: Any = None,
    **kwargs: Any,
) -> CLIPEmbedder:
    """:func:`load_clip_embedder` from a reward's usual arguments: ``pretrained`` and
    ``model_config`` go to open_clip, ``processor`` (when given) to transformers; the other backend
    ignores them."""
    if backend == "open_clip":
        kwargs.update(pretrained=pretrained, model_config=model_config)
    elif processor is not None:
        kwargs.update(processor=processor)
    return load_clip_embedder(backend, model=model, **kwargs)


class CLIPBackendReward(Reward):
    """Base of the rewards scored with a CLIP model of either backend (``clip``, ``clip_iqa``,
    ``aesthetic``): it builds :attr:`embedder` from the arguments they all take.

    Args:
        backend: "open_clip" or "transformers".
        model: open_clip architecture name (``"ViT-B-32"``, ``"hf-hub:..."``, ``"local-dir:..."``),
            a transformers ``CLIPModel`` hub id / folder, or a built model; None: the subclass's
            ``default_models[backend]``.
        pretrained: open_clip tag (``"openai"``) or checkpoint file (open_clip backend only).
        model_config: custom open_clip architecture (dict or JSON path), registered as ``model``.
        processor: transformers processor hub id / folder (default: ``model``).
        device, dtype: where and in which precision the CLIP model runs.
        strict: raise on NaN scores.
        **backend_kwargs: further keyword arguments of the embedder.

    Differentiable: images are preprocessed as tensors (:mod:`genalign.rewards.preprocess`).
    """

    differentiable = True
    default_models: Mapping[str, str]  # backend -> the model loaded when ``model`` is None

    def __init__(
        self,
        backend: str = "open_clip",
        model: str | os.PathLike | torch.nn.Module | None = None,
        pretrained: str | os.PathLike | None = "openai",
        model_config: Mapping[str, Any] | str | os.PathLike | None = None,
        processor: str | os.PathLike | Any = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        strict: bool = False,
        **backend_kwargs: Any,
    ) -> None:
        super().__init__(strict=strict)
        if model is None:
            model = self.default_models.get(backend, self.default_models["open_clip"])
        self.embedder = load_backend_embedder(
            backend, model, pretrained, model_config, processor, device=device, dtype=dtype, **backend_kwargs
        )


# Deprecated aliases: class names spell acronyms in upper case (#22); the old names keep working.
ClipEmbedder = CLIPEmbedder
OpenClipEmbedder = OpenCLIPEmbedder
TransformersClipEmbedder = TransformersCLIPEmbedder
