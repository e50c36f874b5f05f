"""eval-reward never reports wrong numbers silently (issue 23.5): duplicate ids, a cache keyed on
contents, nothing scored, rows named by line number."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from genalign.cli import main
from genalign.rewards.base import Reward, RewardOutput
from genalign.rewards.evaluation.data import load_eval_dataset
from genalign.rewards.evaluation.run import EvalConfig, RewardSpec, evaluate_rewards


def png_bytes(value: int, size: int = 8) -> bytes:
    """A flat grey PNG (``value`` in 0..255) as bytes."""
    buffer = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), value, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


class Brightness(Reward):
    """Mean pixel value; counts the images it scored."""

    name = "brightness_test"

    def __init__(self) -> None:
        super().__init__()
        self.images_scored = 0

    def score(self, images, prompts, **metadata):
        self.images_scored += images.shape[0]
        return RewardOutput(images.mean(dim=(1, 2, 3)))


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def images(tmp_path) -> Path:
    for k in range(4):
        (tmp_path / f"img{k}.png").write_bytes(png_bytes(60 * k))
    return tmp_path


def test_duplicate_ids_are_an_error_naming_the_rows(images):
    rows = [{"id": f"s{k % 2 if k < 3 else k}", "image": f"img{k}.png", "mos": float(k)} for k in range(4)]
    with pytest.raises(ValueError, match=r"id 's0' at line 1, line 3"):
        load_eval_dataset(_write(images / "mos.jsonl", rows), "mos")


def test_the_cache_keys_on_image_contents(images, tmp_path):
    data = _write(images / "mos.jsonl", [{"image": f"img{k}.png", "mos": float(k)} for k in range(4)])
    config = EvalConfig(bootstrap=0, progress=False)
    spec = RewardSpec("brightness_test")
    first = Brightness()
    out = tmp_path / "out"
    evaluate_rewards(load_eval_dataset(data, "mos"), [spec], out, config, lambda s: first)
    assert first.images_scored == 4
    (images / "img2.png").write_bytes(png_bytes(255))  # replaced under the same name
    second = Brightness()
    evaluate_rewards(load_eval_dataset(data, "mos"), [spec], out, config, lambda s: second)
    assert second.images_scored == 1  # only the replaced image is scored again
    scores = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert scores[2]["scores"][spec.key][0] == pytest.approx(1.0)


def test_nothing_scored_exits_non_zero(images, tmp_path, capsys):
    data = _write(images / "mos.jsonl", [{"image": f"gone{k}.png", "mos": float(k)} for k in range(3)])
    argv = ["eval-reward", "--reward", "jpeg_compressibility", "--data", str(data), "--task", "mos",
            "--out", str(tmp_path / "out"), "--bootstrap", "0", "--no-progress"]  # fmt: skip
    assert main(argv) == 1
    error = capsys.readouterr().err
    assert "scored none of 3 samples" in error and "line 1" in error


def test_rows_are_named_by_line_number(images):
    path = images / "bad.jsonl"
    path.write_text('{"image": "img0.png", "mos": 1}\n\n{"image": "img1.png", "mos": "high"}\n')
    with pytest.raises(ValueError, match="line 3: column 'mos' must be a number"):
        load_eval_dataset(path, "mos")
    path.write_text('{"image": "img0.png", "mos": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: expected a JSON object, got list"):
        load_eval_dataset(path, "mos")
