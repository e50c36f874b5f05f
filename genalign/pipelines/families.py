"""The one table of model families: a diffusers pipeline class name -> what genalign runs on it.

Adding a model family is one row here (plus its pipeline modules): the policy family that
trains it (``genalign.policies`` names, read by the CLI's ``sample --family`` detection), its
RLG pipeline and its ReNO pipeline, named as lazy ``"module:Class"`` strings so that reading
the table imports neither diffusers nor any pipeline. :class:`PipelineDispatcher` turns a
row into a loaded pipeline (``RLGPipeline`` and ``ReNOPipeline`` are its two instances).
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from genalign.registry import import_object

__all__ = [
    "MODEL_FAMILIES",
    "ModelFamily",
    "PipelineDispatcher",
    "pipeline_class_for",
    "pipeline_classes",
    "policy_families",
]

_RLG = "genalign.pipelines.rlg"
_RENO = "genalign.pipelines.reno"


@dataclass(frozen=True)
class ModelFamily:
    """What genalign runs on one diffusers pipeline class.

    Attributes:
        policy: the policy family that trains it (``"sd"``, ``"flow"``, ``"consistency"``);
            None when no policy does.
        rlg: ``"module:Class"`` of its RLG pipeline (Jin et al. 2025); None when unsupported.
        reno: ``"module:Class"`` of its ReNO pipeline (Eyring et al., NeurIPS 2024); None when
            unsupported.
    """

    policy: str | None = None
    rlg: str | None = None
    reno: str | None = None


MODEL_FAMILIES: dict[str, ModelFamily] = {
    "StableDiffusionPipeline": ModelFamily(
        policy="sd",
        rlg=f"{_RLG}.sd:RLGStableDiffusionPipeline",
        reno=f"{_RENO}.sd:ReNOStableDiffusionPipeline",
    ),
    "StableDiffusionXLPipeline": ModelFamily(
        policy="sd",
        rlg=f"{_RLG}.sdxl:RLGStableDiffusionXLPipeline",
        reno=f"{_RENO}.sdxl:ReNOStableDiffusionXLPipeline",
    ),
    "StableDiffusion3Pipeline": ModelFamily(policy="flow", rlg=f"{_RLG}.sd3:RLGStableDiffusion3Pipeline"),
    "FluxPipeline": ModelFamily(
        policy="flow", rlg=f"{_RLG}.flux:RLGFluxPipeline", reno=f"{_RENO}.flux:ReNOFluxPipeline"
    ),
    "SanaPipeline": ModelFamily(policy="flow", rlg=f"{_RLG}.sana:RLGSanaPipeline"),
    "LatentConsistencyModelPipeline": ModelFamily(
        policy="consistency", reno=f"{_RENO}.sd:ReNOStableDiffusionPipeline"
    ),
    "PixArtAlphaPipeline": ModelFamily(reno=f"{_RENO}.pixart:ReNOPixArtAlphaPipeline"),
}
"""Diffusers pipeline class name (a model folder's ``model_index.json`` ``_class_name``) -> family."""

_SAVED_NAMES = {"reno": {"ReNOPipeline": "StableDiffusionPipeline"}}
"""Class names older genalign versions saved (``ReNOPipeline`` was the SD-layout class)."""

_LABELS = {"rlg": "RLG", "reno": "ReNO"}


def policy_families() -> dict[str, str]:
    """Diffusers pipeline class name -> the policy family that trains it."""
    return {name: family.policy for name, family in MODEL_FAMILIES.items() if family.policy}


def pipeline_classes(method: str) -> dict[str, str]:
    """Every class name ``method`` (``"rlg"`` or ``"reno"``) accepts -> ``"module:Class"``: the
    diffusers names, genalign's own pipeline names (a saved or wrapped genalign pipeline) and
    the names older versions saved."""
    table = {name: getattr(family, method) for name, family in MODEL_FAMILIES.items()}
    table = {name: path for name, path in table.items() if path is not None}
    for path in list(table.values()):
        table[path.rpartition(":")[2]] = path
    for saved, name in _SAVED_NAMES.get(method, {}).items():
        table[saved] = table[name]
    return table


def pipeline_class_for(method: str, class_names: str | Sequence[str]) -> type:
    """The ``method`` pipeline class for a diffusers pipeline class name, or for the first known
    name of a sequence (a class hierarchy, most derived first).

    Raises:
        ValueError: no name is known, naming what is supported.
    """
    names = [class_names] if isinstance(class_names, str) else list(class_names)
    table = pipeline_classes(method)
    for name in names:
        if name in table:
            return import_object(table[name])
    raise ValueError(f"{_LABELS[method]} supports {sorted(table)} pipelines, got {names[0]}")


_CONFIG_OPTIONS = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision")


class PipelineDispatcher:
    """Picks a method's pipeline for a model family, like diffusers' ``AutoPipelineForText2Image``.

    Subclasses set ``method`` (a :class:`ModelFamily` field) and whether ``from_pipe`` matches
    the pipeline's whole class hierarchy or only its own class name.
    """

    method: str
    from_pipe_matches_subclasses: bool = False

    def __init__(self) -> None:
        name = type(self).__name__
        raise TypeError(f"use {name}.from_pretrained(...) or {name}.from_pipe(...)")

    @classmethod
    def pipeline_class_for(cls, class_names: str | Sequence[str]) -> type:
        """The pipeline class for a diffusers pipeline class name (or the first known name of a
        class hierarchy)."""
        return pipeline_class_for(cls.method, class_names)

    @classmethod
    def family(cls, class_names: str | Sequence[str]) -> type:
        """Deprecated name of :meth:`pipeline_class_for`."""
        warnings.warn(
            f"{cls.__name__}.family is deprecated; use {cls.__name__}.pipeline_class_for",
            DeprecationWarning,
            stacklevel=2,
        )
        return cls.pipeline_class_for(class_names)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any) -> Any:
        """Load a folder or hub id as the pipeline of its family."""
        from diffusers import DiffusionPipeline

        options = {key: kwargs[key] for key in _CONFIG_OPTIONS if key in kwargs}
        config = DiffusionPipeline.load_config(pretrained_model_name_or_path, **options)
        pipeline_class = cls.pipeline_class_for(config["_class_name"])
        accepted = inspect.signature(pipeline_class.__init__).parameters
        for name, value in config.items():  # components saved as absent (SD3 without T5) stay absent
            if name in accepted and isinstance(value, (list, tuple)) and list(value) == [None, None]:
                kwargs.setdefault(name, None)
        return pipeline_class.from_pretrained(pretrained_model_name_or_path, **kwargs)

    @classmethod
    def from_pipe(cls, pipeline: Any, **kwargs: Any) -> Any:
        """Wrap an existing pipeline's modules (no copy, loaded LoRA included) in the pipeline of
        its family."""
        klass = type(pipeline)
        names = [k.__name__ for k in klass.__mro__] if cls.from_pipe_matches_subclasses else klass.__name__
        return cls.pipeline_class_for(names).from_pipe(pipeline, **kwargs)
