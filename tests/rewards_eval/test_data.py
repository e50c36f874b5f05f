"""Every documented layout and preset loads; bad input fails with a useful message."""

from __future__ import annotations

import base64
import csv
import json

import pytest

from genalign.rewards.evaluation.data import (
    PRESETS,
    TASK_COLUMNS,
    load_eval_dataset,
    load_image_tensor,
    parse_columns,
)

from .conftest import png_bytes


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_csv(path, rows):
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def pixel(dataset, sample, index=0):
    return float(load_image_tensor(sample.images[index], dataset.base_dir)[0, 0, 0])


def test_canonical_preference_jsonl_with_paths(image_dir):
    rows = [
        {"prompt": "a", "image_0": "img0.png", "image_1": "img1.png", "label": 1, "category": "x"},
        {"prompt": "b", "image_0": "img2.png", "image_1": "img3.png", "label": 0.5},
    ]
    dataset = load_eval_dataset(write_jsonl(image_dir / "p.jsonl", rows), "preference")
    assert [s.target for s in dataset.samples] == [1.0, 0.5]
    assert dataset.samples[0].category == "x" and dataset.samples[1].category is None
    assert pixel(dataset, dataset.samples[1], 1) == pytest.approx(150 / 255)
    assert len({s.id for s in dataset.samples}) == 2


def test_pickapic_preset_csv_with_base64_images(tmp_path):
    data_uri = "data:image/png;base64," + base64.b64encode(png_bytes(200)).decode()
    bare = base64.b64encode(png_bytes(100)).decode()
    rows = [{"caption": "c", "jpg_0": data_uri, "jpg_1": bare, "label_0": 0.0, "label_1": 1.0}]
    dataset = load_eval_dataset(write_csv(tmp_path / "pick.csv", rows), "preference", preset="pickapic")
    sample = dataset.samples[0]
    assert sample.prompt == "c" and sample.target == 1.0
    assert pixel(dataset, sample, 0) == pytest.approx(200 / 255)
    assert pixel(dataset, sample, 1) == pytest.approx(100 / 255)


def test_column_mapping_option(image_dir):
    rows = [{"text": "a", "left": "img0.png", "right": "img1.png", "winner": 0}]
    columns = parse_columns(["prompt=text,image_0=left", "image_1=right", "label=winner"])
    dataset = load_eval_dataset(write_jsonl(image_dir / "m.jsonl", rows), "preference", columns=columns)
    assert dataset.samples[0].target == 0.0 and dataset.samples[0].prompt == "a"


def test_hpdv2_json_list(image_dir):
    rows = [{"prompt": "p", "image_path": ["img0.png", "img1.png", "img2.png"], "rank": [2, 1, 3]}]
    (image_dir / "test.json").write_text(json.dumps(rows))
    dataset = load_eval_dataset(image_dir / "test.json", "ranking", preset="hpdv2")
    assert dataset.samples[0].target == [2.0, 1.0, 3.0] and len(dataset.samples[0].images) == 3


def test_imagereward_test_json_and_db_long_format(image_dir):
    rows = [{"prompt": "p", "generations": ["img0.png", "img1.png"], "ranking": [1, 2]}]
    (image_dir / "ir.json").write_text(json.dumps(rows))
    assert load_eval_dataset(image_dir / "ir.json", "ranking", preset="imagereward").samples[0].target == [
        1.0,
        2.0,
    ]
    long_rows = [
        {"prompt_id": "a", "prompt": "pa", "image": "img0.png", "rank": 2},
        {"prompt_id": "b", "prompt": "pb", "image": "img1.png", "rank": 1},
        {"prompt_id": "a", "prompt": "pa", "image": "img2.png", "rank": 1},
        {"prompt_id": "b", "prompt": "pb", "image": "img3.png", "rank": 2},
    ]
    dataset = load_eval_dataset(
        write_csv(image_dir / "db.csv", long_rows), "ranking", preset="imagereward-db"
    )
    assert [(s.prompt, s.images, s.target) for s in dataset.samples] == [
        ("pa", ["img0.png", "img2.png"], [2.0, 1.0]),
        ("pb", ["img1.png", "img3.png"], [1.0, 2.0]),
    ]


def test_ranking_lists_as_json_strings_in_csv(image_dir):
    rows = [{"prompt": "p", "images": json.dumps(["img0.png", "img1.png"]), "ranks": "[1, 2]"}]
    dataset = load_eval_dataset(write_csv(image_dir / "r.csv", rows), "ranking")
    assert dataset.samples[0].target == [1.0, 2.0]


def test_koniq_csv_with_image_root(image_dir, tmp_path_factory):
    table_dir = tmp_path_factory.mktemp("koniq")
    rows = [
        {"image_name": "img1.png", "c1": 0, "MOS": 3.2, "SD": 0.5},
        {"image_name": "img2.png", "c1": 1, "MOS": 4.1, "SD": 0.4},
    ]
    path = write_csv(table_dir / "koniq10k_scores.csv", rows)
    dataset = load_eval_dataset(path, "mos", preset="koniq", image_root=image_dir)
    assert [s.target for s in dataset.samples] == [3.2, 4.1]
    assert pixel(dataset, dataset.samples[1]) == pytest.approx(100 / 255)


def test_parquet_with_raw_bytes_and_image_dicts(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "caption": ["c"],
            "jpg_0": [png_bytes(10)],
            "jpg_1": [{"bytes": png_bytes(20), "path": None}],
            "label_0": [1.0],
            "label_1": [0.0],
        }
    )
    pq.write_table(table, tmp_path / "pick.parquet")
    dataset = load_eval_dataset(tmp_path / "pick.parquet", "preference", preset="pickapic")
    assert dataset.samples[0].target == 0.0
    assert pixel(dataset, dataset.samples[0], 1) == pytest.approx(20 / 255)


def test_hf_datasets_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"image_name": [png_bytes(30), png_bytes(60)], "MOS": [1.0, 2.0]})
    data.save_to_disk(str(tmp_path / "koniq"))
    dataset = load_eval_dataset(tmp_path / "koniq", "mos", preset="koniq")
    assert pixel(dataset, dataset.samples[1]) == pytest.approx(60 / 255)


def test_missing_columns_are_named_with_what_the_file_has(image_dir):
    rows = [{"caption": "a", "jpg_0": "img0.png", "label_0": 1}]
    with pytest.raises(ValueError) as error:
        load_eval_dataset(write_jsonl(image_dir / "bad.jsonl", rows), "preference", preset="pickapic")
    message = str(error.value)
    assert "'jpg_1' (for image_1)" in message and "'label_1' (for label)" in message
    assert "caption, jpg_0, label_0" in message


def test_a_later_row_missing_a_column_is_named_by_its_line(image_dir):
    rows = [{"image": "img0.png", "mos": 3.0}, {"image": "img0.png", "mos": 2.0}, {"mos": 1.0}]
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 3: missing column 'image' \(every mos row needs"):
        load_eval_dataset(write_jsonl(image_dir / "bad.jsonl", rows), "mos")


def test_labels_outside_the_allowed_values(image_dir):
    rows = [
        {"prompt": "a", "image_0": "img0.png", "image_1": "img1.png", "label": 1},
        {"prompt": "a", "image_0": "img0.png", "image_1": "img1.png", "label": 2},
        {"prompt": "a", "image_0": "img0.png", "image_1": "img1.png", "label": "left"},
    ]
    with pytest.raises(ValueError, match=r"2 preference label\(s\) outside .*line 2: 2.*line 3: .left."):
        load_eval_dataset(write_jsonl(image_dir / "bad.jsonl", rows), "preference")


def test_other_bad_input(image_dir):
    with pytest.raises(ValueError, match="unknown preset"):
        load_eval_dataset(image_dir / "x.jsonl", "mos", preset="nope")
    with pytest.raises(ValueError, match="is for task 'preference'"):
        load_eval_dataset(image_dir / "x.jsonl", "mos", preset="pickapic")
    with pytest.raises(FileNotFoundError):
        load_eval_dataset(image_dir / "missing.jsonl", "mos")
    rows = [{"prompt": "p", "images": ["img0.png", "img1.png"], "ranks": [1]}]
    with pytest.raises(ValueError, match="2 images but 1 ranks"):
        load_eval_dataset(write_jsonl(image_dir / "r.jsonl", rows), "ranking")
    with pytest.raises(ValueError, match="must be a number"):
        load_eval_dataset(write_jsonl(image_dir / "m.jsonl", [{"image": "img0.png", "mos": "high"}]), "mos")
    with pytest.raises(FileNotFoundError, match="image not found"):
        load_image_tensor("nope.png", image_dir)


def test_presets_cover_the_documented_layouts():
    assert {"pickapic", "hpdv2", "imagereward", "koniq"} <= set(PRESETS)
    for preset in PRESETS.values():
        required, optional = TASK_COLUMNS[preset["task"]]
        assert set(preset["columns"]) <= set(required + optional)
