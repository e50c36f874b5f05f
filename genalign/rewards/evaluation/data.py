"""Loading human-judgement data sets for reward evaluation.

A data set is a table (JSONL, JSON list, CSV/TSV, Parquet, or a Hugging Face ``datasets``
folder written by ``save_to_disk``) whose columns are mapped onto the canonical names below.

=============  ==============================================  ==========================================
task           required columns                                 optional columns
=============  ==============================================  ==========================================
preference     ``prompt, image_0, image_1, label``              ``category, split, id, cluster``
ranking        ``prompt, images`` (list), ``ranks`` (list)       ``category, split, id, group``
mos            ``image, mos``                                    ``prompt, category, split, id, cluster``
=============  ==============================================  ==========================================

``label`` is the probability that ``image_1`` is preferred: 0 (image_0 wins), 1 (image_1 wins)
or 0.5 (tie). ``ranks`` are human ranks, lower is better (1 = best); ties share a rank.
``mos`` is a mean opinion score, higher is better. ``split`` marks rows used to tune PickScore's
tie threshold (``validation``/``val``/``valid``). With ``group`` mapped, a ranking table is in
long format: one image per row (``images`` holds one image, ``ranks`` one number) and rows with
the same group value form one ranking. ``cluster`` labels rows that are not independent (the
degraded copies of one scene, the pairs of one prompt): the bootstrap intervals then resample
whole clusters (:func:`~genalign.rewards.evaluation.metrics.cluster_bootstrap_index`); given, it
must be set on every row. ``genalign eval-reward --cluster-by prompt`` clusters by another
column instead. A ranking sample is already one prompt, so rankings have no cluster.

Images are paths (relative to the data file, or to ``image_root``), raw bytes (Parquet /
``datasets``), ``{"bytes": ..., "path": ...}`` dicts (the ``datasets`` Image feature in Parquet),
base64 strings (``data:image/png;base64,...`` or bare base64) or PIL images.

Presets map well-known layouts without conversion:

==================  ===================================================================================
preset              mapping
==================  ===================================================================================
``pickapic``        Pick-a-Pic v1/v2: ``prompt=caption, image_0=jpg_0, image_1=jpg_1, label=label_1``
                    (``label_1`` is 1 when jpg_1 won, 0.5 on a tie; ``label_0 = 1 - label_1``)
``hpdv2``           HPDv2 test.json: ``prompt, images=image_path, ranks=rank``
``imagereward``     ImageReward test.json: ``prompt, images=generations, ranks=ranking``
``imagereward-db``  ImageRewardDB rows (long format): ``prompt, images=image, ranks=rank, group=prompt_id``
``koniq``           KonIQ-10k scores CSV: ``image=image_name, mos=MOS`` (use ``image_root``)
==================  ===================================================================================
"""

from __future__ import annotations

import base64
import binascii
import csv
import hashlib
import io
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

TASKS = ("preference", "ranking", "mos")
TASK_COLUMNS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # task: (required, optional)
    "preference": (("prompt", "image_0", "image_1", "label"), ("category", "split", "id", "cluster")),
    "ranking": (("prompt", "images", "ranks"), ("category", "split", "id", "group")),
    "mos": (("image", "mos"), ("prompt", "category", "split", "id", "cluster")),
}
# the columns every row of a task must hold: the required ones but the prompt, which a row may lack
# (the first row's columns are checked by check_columns)
_ROW_COLUMNS = {task: tuple(c for c in columns[0] if c != "prompt") for task, columns in TASK_COLUMNS.items()}
PRESETS: dict[str, dict[str, Any]] = {
    "pickapic": {
        "task": "preference",
        "columns": {"prompt": "caption", "image_0": "jpg_0", "image_1": "jpg_1", "label": "label_1"},
    },
    "hpdv2": {"task": "ranking", "columns": {"prompt": "prompt", "images": "image_path", "ranks": "rank"}},
    "imagereward": {
        "task": "ranking",
        "columns": {"prompt": "prompt", "images": "generations", "ranks": "ranking"},
    },
    "imagereward-db": {
        "task": "ranking",
        "columns": {"prompt": "prompt", "images": "image", "ranks": "rank", "group": "prompt_id"},
    },
    "koniq": {"task": "mos", "columns": {"image": "image_name", "mos": "MOS"}},
}
PREFERENCE_LABELS = (0.0, 0.5, 1.0)
VALIDATION_SPLITS = ("validation", "val", "valid")


@dataclass
class EvalSample:
    """One evaluation unit: a pair, a ranked group or a rated image.

    Attributes:
        id: the data's id, else a hash of the prompt and image references; joins scores to rows
            (the score cache keys on :func:`content_key`, the images' bytes).
        row: index of the (first) source row.
        prompt: the text prompt ("" when the task has none).
        images: raw image references (paths, bytes, dicts, base64, PIL), 2 for a pair.
        target: label (preference), list of ranks (ranking) or MOS (mos).
        category: optional category for per-category breakdowns.
        split: optional split name.
        line: where the (first) source row is, for messages: ``"line 7"`` (JSONL, CSV) or
            ``"row 7"`` (1-based, other formats).
        cluster: optional cluster label (preference and mos): the bootstrap resamples whole
            clusters when samples have one.
    """

    id: str
    row: int
    prompt: str
    images: list[Any]
    target: Any
    category: str | None = None
    split: str | None = None
    line: str = ""
    id_given: bool = False  # the id came from the data's id column (not a content hash)
    cluster: str | None = None


@dataclass
class EvalDataset:
    """Samples plus where they came from (``base_dir`` resolves relative image paths)."""

    task: str
    samples: list[EvalSample]
    base_dir: Path
    source: str
    columns: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def has_categories(self) -> bool:
        return any(sample.category is not None for sample in self.samples)


# -- tables ------------------------------------------------------------------------------------------


def load_table(path: str | os.PathLike, split: str | None = None) -> list[dict[str, Any]]:
    """Rows of a JSONL / JSON / CSV / TSV / Parquet file or a ``datasets`` folder, as dicts."""
    return load_table_with_lines(path, split)[0]


def load_table_with_lines(
    path: str | os.PathLike, split: str | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`load_table` plus where each row is (``"line 7"`` for JSONL and CSV, else ``"row 7"``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data not found: {path}")
    suffix = path.suffix.lower()
    if path.is_file() and suffix in (".jsonl", ".ndjson"):
        return _load_jsonl(path)
    if path.is_file() and suffix in (".csv", ".tsv"):
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle, delimiter="\t" if suffix == ".tsv" else ",")
            rows, lines = [], []
            for row in reader:
                rows.append(row)
                lines.append(f"line {reader.line_num}")
            return rows, lines
    rows = _load_other(path, split, suffix)
    return rows, [f"row {index + 1}" for index in range(len(rows))]


def _load_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    rows, lines = [], []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not valid JSON ({error})") from error
            if not isinstance(row, dict):
                raise ValueError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
            lines.append(f"line {number}")
    return rows, lines


def _load_other(path: Path, split: str | None, suffix: str) -> list[dict[str, Any]]:
    if path.is_dir():
        return _load_hf_folder(path, split)
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from error
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
        bad = [index + 1 for index, row in enumerate(data) if not isinstance(row, dict)]
        if bad:
            raise ValueError(f"{path}: rows {bad[:10]} are not JSON objects")
        return data
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as error:
            raise ImportError("reading Parquet needs pyarrow: pip install pyarrow") from error
        return pq.read_table(path).to_pylist()
    raise ValueError(
        f"{path}: unknown data format {suffix!r}; use .jsonl, .json, .csv, .tsv, .parquet or a folder"
    )


def _load_hf_folder(path: Path, split: str | None) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as error:
        raise ImportError(
            f"{path} is a folder: reading a saved Hugging Face dataset needs `datasets`"
        ) from error
    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        if split is None:
            raise ValueError(f"{path} holds splits {list(data)}; choose one with split=")
        data = data[split]
    for name, feature in data.features.items():  # keep encoded bytes: decoding happens per batch
        if isinstance(feature, datasets.Image):
            data = data.cast_column(name, datasets.Image(decode=False))
    return list(data)


# -- mapping -----------------------------------------------------------------------------------------


def resolve_columns(
    task: str, columns: Mapping[str, str] | None = None, preset: str | None = None
) -> dict[str, str]:
    """Canonical name -> file column: identity, then the preset, then explicit ``columns``."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks are {TASKS}")
    required, optional = TASK_COLUMNS[task]
    mapping = {name: name for name in required + optional}
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; presets are {sorted(PRESETS)}")
        if PRESETS[preset]["task"] != task:
            raise ValueError(f"preset {preset!r} is for task {PRESETS[preset]['task']!r}, not {task!r}")
        mapping.update(PRESETS[preset]["columns"])
    for name, column in (columns or {}).items():
        if name not in mapping:
            raise ValueError(f"unknown column name {name!r} for task {task!r}; names are {sorted(mapping)}")
        mapping[name] = column
    return mapping


def check_columns(
    rows: Sequence[Mapping[str, Any]], task: str, mapping: Mapping[str, str], source: str
) -> None:
    """Raise naming the missing columns and listing what the file has."""
    if not rows:
        raise ValueError(f"{source}: the data set is empty")
    present = set().union(*(row.keys() for row in rows[:100]))
    required = TASK_COLUMNS[task][0]
    missing = [
        f"{mapping[name]!r}" + (f" (for {name})" if mapping[name] != name else "") for name in required
    ]
    missing = [m for m, name in zip(missing, required) if mapping[name] not in present]
    if missing:
        raise ValueError(
            f"{source}: missing column(s) {', '.join(missing)} for task {task!r}; "
            f"the file has columns: {', '.join(sorted(present))}. Map them with --columns name=column or --preset."
        )


def parse_columns(items: Sequence[str] | str | None) -> dict[str, str]:
    """``["prompt=caption", "image_0=jpg_0"]`` or ``"prompt=caption,image_0=jpg_0"`` -> dict."""
    if not items:
        return {}
    if isinstance(items, str):
        items = [items]
    mapping = {}
    for item in items:
        for part in item.split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise ValueError(f"column mapping {part!r} must look like name=column")
            name, column = part.split("=", 1)
            mapping[name.strip()] = column.strip()
    return mapping


def _as_list(value: Any, name: str, where: str) -> list[Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{where}: column {name!r} must be a list (JSON in CSV), got {value[:60]!r}"
            ) from error
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise ValueError(f"{where}: column {name!r} must be a list, got {type(value).__name__}")
    return value


def _as_float(value: Any, name: str, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: column {name!r} must be a number, got {value!r}") from error
    if not math.isfinite(number):
        raise ValueError(f"{where}: column {name!r} must be finite, got {value!r}")
    return number


def _optional(row: Mapping[str, Any], mapping: Mapping[str, str], name: str) -> str | None:
    value = row.get(mapping[name])
    if value is None or value == "":
        return None
    return str(value)


def image_fingerprint(value: Any) -> str:
    """A short string identifying an image reference without decoding it."""
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return image_fingerprint(value["bytes"])
        return str(value.get("path"))
    if isinstance(value, (bytes, bytearray)):
        return "sha1:" + hashlib.sha1(bytes(value)).hexdigest()
    if isinstance(value, str) and len(value) > 512:  # embedded base64
        return "sha1:" + hashlib.sha1(value.encode()).hexdigest()
    if hasattr(value, "tobytes"):  # PIL image
        return "sha1:" + hashlib.sha1(value.tobytes()).hexdigest()
    return str(value)


def image_content_hash(value: Any, base_dir: Path) -> str:
    """A hash of an image's bytes: a path is read, so a replaced file gets a new hash."""
    if isinstance(value, dict) and value.get("bytes") is None and value.get("path"):
        value = value["path"]
    if isinstance(value, str) and not value.startswith("data:") and len(value) <= 4096:
        path = Path(value) if Path(value).is_absolute() else base_dir / value
        try:
            if path.is_file():
                return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:  # a name the OS rejects (too long): not a file
            pass
    return image_fingerprint(value)


def content_key(sample: EvalSample, base_dir: Path) -> str:
    """The score cache's key: a hash of the prompt and the images' bytes (not their paths)."""
    payload = json.dumps([sample.prompt, [image_content_hash(image, base_dir) for image in sample.images]])
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def sample_id(prompt: str, images: Sequence[Any]) -> str:
    """Hash of what a reward sees: equal inputs share cached scores."""
    payload = json.dumps([prompt, [image_fingerprint(image) for image in images]])
    return hashlib.sha1(payload.encode()).hexdigest()[:16]


def rows_to_samples(
    rows: Sequence[Mapping[str, Any]],
    task: str,
    mapping: Mapping[str, str],
    source: str = "data",
    lines: Sequence[str] | None = None,
) -> list[EvalSample]:
    """Turn mapped rows into :class:`EvalSample` s, validating targets.

    ``lines`` names each row in messages (``"line 7"``; default ``"row <1-based index>"``). Ids
    given in the ``id`` column must be unique: rows sharing one would share one cached score
    (:func:`check_unique_ids`).
    """
    lines = list(lines) if lines is not None else [f"row {index + 1}" for index in range(len(rows))]
    check_columns(rows, task, mapping, source)
    if task == "ranking" and any(mapping["group"] in row for row in rows[:100]):
        samples = _long_ranking_samples(rows, mapping, lines)
        check_unique_ids(samples, source)
        return samples
    samples = []
    bad_labels = []
    for index, row in enumerate(rows):
        where = lines[index]
        missing = [mapping[key] for key in _ROW_COLUMNS[task] if mapping[key] not in row]
        if missing:
            raise ValueError(
                f"{source}, {where}: missing column {', '.join(map(repr, missing))} (every {task} row needs "
                f"{', '.join(repr(mapping[key]) for key in _ROW_COLUMNS[task])}; --columns renames them)"
            )
        prompt = "" if row.get(mapping["prompt"]) is None else str(row.get(mapping["prompt"]))
        if task == "preference":
            images = [row[mapping["image_0"]], row[mapping["image_1"]]]
            try:
                target = _as_float(row[mapping["label"]], mapping["label"], where)
            except ValueError:
                target = None
            if target not in PREFERENCE_LABELS:
                bad_labels.append((where, row[mapping["label"]]))
                continue
        elif task == "ranking":
            images = _as_list(row[mapping["images"]], mapping["images"], where)
            target = [
                _as_float(r, mapping["ranks"], where)
                for r in _as_list(row[mapping["ranks"]], mapping["ranks"], where)
            ]
            if len(images) != len(target):
                raise ValueError(f"{source}, {where}: {len(images)} images but {len(target)} ranks")
            if len(images) < 2:
                raise ValueError(f"{source}, {where}: a ranking needs at least 2 images, got {len(images)}")
        else:
            images = [row[mapping["image"]]]
            target = _as_float(row[mapping["mos"]], mapping["mos"], where)
        given_id = _optional(row, mapping, "id")
        samples.append(
            EvalSample(
                id=given_id or sample_id(prompt, images),
                row=index,
                prompt=prompt,
                images=images,
                target=target,
                category=_optional(row, mapping, "category"),
                split=_optional(row, mapping, "split"),
                line=where,
                id_given=given_id is not None,
                cluster=_optional(row, mapping, "cluster") if "cluster" in mapping else None,
            )
        )
    if bad_labels:
        shown = ", ".join(f"{i}: {v!r}" for i, v in bad_labels[:10])
        raise ValueError(
            f"{source}: {len(bad_labels)} preference label(s) outside {{0, 1, 0.5}} in column "
            f"{mapping['label']!r} ({shown})"
        )
    check_unique_ids(samples, source)
    check_clusters_complete(samples, mapping, source)
    return samples


def check_clusters_complete(samples: Sequence[EvalSample], mapping: Mapping[str, str], source: str) -> None:
    """Raise naming the rows when some rows have a cluster and others none: a row without one
    would silently become a cluster of its own (or all of them one cluster)."""
    missing = [sample.line or f"row {sample.row + 1}" for sample in samples if sample.cluster is None]
    if missing and len(missing) < len(samples):
        raise ValueError(
            f"{source}: column {mapping['cluster']!r} (for cluster) is empty in {len(missing)} of "
            f"{len(samples)} rows ({', '.join(missing[:10])}); give every row a cluster or none"
        )


def check_unique_ids(samples: Sequence[EvalSample], source: str) -> None:
    """Raise naming the rows when ids from the data's ``id`` column repeat.

    Scores are cached and joined by id, so rows sharing an id would silently share one score
    (issue 23.5: an SRCC of -0.884 became -0.447, reported as fully scored). Ids computed from
    the content (no ``id`` column) repeat only for identical inputs, whose scores are equal.
    """
    where: dict[str, list[str]] = {}
    for sample in samples:
        where.setdefault(sample.id, []).append(sample.line or f"row {sample.row + 1}")
    repeated = {key: places for key, places in where.items() if len(places) > 1}
    given = {sample.id for sample in samples if sample.id_given}
    repeated = {key: places for key, places in repeated.items() if key in given}
    if repeated:
        shown = "; ".join(f"id {key!r} at {', '.join(places)}" for key, places in list(repeated.items())[:10])
        raise ValueError(
            f"{source}: {len(repeated)} id(s) used by more than one row ({shown}); every row needs its own "
            "id (fix the id column, or drop it to use content hashes)"
        )


def _long_ranking_samples(
    rows: Sequence[Mapping[str, Any]], mapping: Mapping[str, str], lines: Sequence[str]
) -> list[EvalSample]:
    groups: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault(str(row[mapping["group"]]), []).append(index)
    samples = []
    for key, indices in groups.items():
        first = rows[indices[0]]
        prompt = str(first.get(mapping["prompt"]) or "")
        images = [rows[i][mapping["images"]] for i in indices]
        ranks = [_as_float(rows[i][mapping["ranks"]], mapping["ranks"], lines[i]) for i in indices]
        if len(images) < 2:
            raise ValueError(f"group {key!r}: a ranking needs at least 2 images, got {len(images)}")
        samples.append(
            EvalSample(
                id=_optional(first, mapping, "id") or sample_id(prompt, images),
                row=indices[0],
                prompt=prompt,
                images=images,
                target=ranks,
                category=_optional(first, mapping, "category"),
                split=_optional(first, mapping, "split"),
                line=lines[indices[0]],
                id_given=_optional(first, mapping, "id") is not None,
            )
        )
    return samples


def load_eval_dataset(
    path: str | os.PathLike,
    task: str,
    columns: Mapping[str, str] | None = None,
    preset: str | None = None,
    split: str | None = None,
    image_root: str | os.PathLike | None = None,
) -> EvalDataset:
    """Load a data set for ``task`` (see the module docstring for layouts and presets).

    Args:
        path: data file or ``datasets`` folder.
        task: "preference", "ranking" or "mos".
        columns: canonical name -> column overrides (applied after the preset).
        preset: a key of :data:`PRESETS`.
        split: split of a ``DatasetDict`` folder.
        image_root: folder relative image paths are resolved against (default: the data file's folder).
    """
    path = Path(path)
    mapping = resolve_columns(task, columns, preset)
    rows, lines = load_table_with_lines(path, split)
    samples = rows_to_samples(rows, task, mapping, source=str(path), lines=lines)
    base_dir = Path(image_root) if image_root is not None else (path if path.is_dir() else path.parent)
    logger.info("loaded %d %s samples from %s", len(samples), task, path)
    return EvalDataset(task=task, samples=samples, base_dir=base_dir, source=str(path), columns=mapping)


# -- images ------------------------------------------------------------------------------------------


def _decode_base64(text: str) -> bytes | None:
    if text.startswith("data:"):
        text = text.split(",", 1)[-1]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def open_image(value: Any, base_dir: Path):
    """Open an image reference as an RGB PIL image; raises ``OSError``/``ValueError`` if unreadable."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            value = value["bytes"]
        elif value.get("path"):
            value = value["path"]
        else:
            raise ValueError("image dict has neither bytes nor path")
    if isinstance(value, (bytes, bytearray)):
        return Image.open(io.BytesIO(bytes(value))).convert("RGB")
    if not isinstance(value, str) or not value:
        raise ValueError(f"not an image reference: {type(value).__name__}")
    if value.startswith("data:"):
        data = _decode_base64(value)
        if data is None:
            raise ValueError("invalid base64 data URI")
        return Image.open(io.BytesIO(data)).convert("RGB")
    path = Path(value) if Path(value).is_absolute() else base_dir / value
    if path.exists():
        return Image.open(path).convert("RGB")
    data = _decode_base64(value) if len(value) > 64 else None
    if data is not None:
        return Image.open(io.BytesIO(data)).convert("RGB")
    raise FileNotFoundError(f"image not found: {path}")


def load_image_tensor(value: Any, base_dir: Path, size: int | None = None) -> torch.Tensor:
    """An image reference as float ``[3, H, W]`` in [0, 1] (resized to ``size`` x ``size`` if given)."""
    import numpy as np

    image = open_image(value, base_dir)
    if size is not None and image.size != (size, size):
        image = image.resize((size, size), resample=3)  # bicubic
    pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy())  # (H, W, 3)
    return pixels.permute(2, 0, 1).float() / 255.0
