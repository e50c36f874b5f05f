"""Q-Hawkeye's degradation pairs (#27 item 5): deterministic given a seed, two different kinds,
each kind visibly changes the image, and a MOS folder becomes a judge's prompt pool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from genalign.utils.degradations import DEGRADATION_KINDS, FIRST_STAGE, degradation_pair, degrade_image

ROOT = Path(__file__).resolve().parents[2]


def _image(seed: int = 0, size: int = 32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    base = torch.linspace(0, 1, size).view(1, 1, size).expand(3, size, size)
    blocks = (torch.rand(3, size // 8, size // 8, generator=generator) > 0.5).float()
    return (0.6 * base + 0.4 * blocks.repeat_interleave(8, 1).repeat_interleave(8, 2)).clamp(0, 1)


def test_pairs_are_deterministic_given_a_seed_and_the_second_kind_differs():
    image = _image()
    kinds_seen = set()
    for seed in range(24):
        first, kind1, kind2 = degradation_pair(image, seed)
        again, again1, again2 = degradation_pair(image, seed)
        torch.testing.assert_close(first, again, atol=0, rtol=0)
        assert (kind1, kind2) == (again1, again2)
        assert kind1 != kind2 and {kind1, kind2} <= set(DEGRADATION_KINDS)
        kinds_seen.add((kind1, kind2))
        assert first.shape == image.shape and float(first.min()) >= 0 and float(first.max()) <= 1
        assert float((first - image).abs().mean()) > 0.01  # visibly degraded
    assert len(kinds_seen) > 4  # the seed draws the kinds
    # another seed: another pair (kinds or noise)
    assert not torch.equal(degradation_pair(image, 0)[0], degradation_pair(image, 1)[0])


@pytest.mark.parametrize("kind", DEGRADATION_KINDS)
def test_each_kind_changes_the_image_and_the_second_stage_on_top_of_the_first_differs(kind):
    image = _image(1)
    once = degrade_image(image, kind, FIRST_STAGE[kind], torch.Generator().manual_seed(0))
    assert float((once - image).abs().mean()) > 0.005
    if kind == "darken":  # brightness x0.6
        torch.testing.assert_close(once, (image * 255).round().mul(0.6).round() / 255, atol=1.5 / 255, rtol=0)
    others = [k for k in DEGRADATION_KINDS if k != kind]
    twice = degrade_image(
        once, others[0], 4.0 if others[0] == "blur" else 5, torch.Generator().manual_seed(0)
    )
    assert not torch.equal(twice, once)


def test_bad_kinds_are_refused():
    with pytest.raises(ValueError, match="degradation kind"):
        degrade_image(_image(), "sepia", 1.0)
    with pytest.raises(ValueError, match="at least two"):
        degradation_pair(_image(), 0, kinds=("blur",))


def test_a_mos_folder_becomes_a_judge_pool(tmp_path):
    from PIL import Image

    from genalign.trainers.quality_pool import QHAWKEYE_PROMPT, quality_pool, read_mos_records

    lines = []
    for i in range(3):
        pixels = (_image(i, 40).permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        Image.fromarray(pixels).save(tmp_path / f"im{i}.png")
        lines.append(json.dumps({"image": f"im{i}.png", "mos": 1.5 + i}))
    (tmp_path / "mos.jsonl").write_text("\n".join(lines) + "\n\n")
    pool = quality_pool(str(tmp_path / "mos.jsonl"), size=32, seed=3)
    assert list(pool) == [QHAWKEYE_PROMPT] * 3
    assert pool.metadata["images"].shape == pool.metadata["degraded_images"].shape == (3, 3, 32, 32)
    torch.testing.assert_close(pool.metadata["mos"], torch.tensor([1.5, 2.5, 3.5]))
    for i in range(3):  # image i's copy is degradation_pair(image, seed + i)
        copy, kind1, kind2 = degradation_pair(pool.metadata["images"][i], 3 + i)
        torch.testing.assert_close(pool.metadata["degraded_images"][i], copy, atol=0, rtol=0)
        assert (pool.metadata["first_degradation"][i], pool.metadata["second_degradation"][i]) == (
            kind1,
            kind2,
        )
    assert pool.digest() == quality_pool(str(tmp_path / "mos.jsonl"), size=32, seed=3).digest()

    (tmp_path / "bad.jsonl").write_text(json.dumps({"image": "im0.png", "mos": "high"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: need a JSON record with 'image' and a numeric 'mos'"):
        read_mos_records(tmp_path / "bad.jsonl")
    with pytest.raises(FileNotFoundError, match="MOS records not found"):
        read_mos_records(tmp_path / "missing.jsonl")


def test_the_shipped_toy_quality_set_loads_offline():
    from genalign.trainers.quality_pool import quality_pool

    pool = quality_pool("assets/eval/quality/mos.jsonl", size=32, limit=8, prompt="rate it")
    assert len(pool) == 8 and pool.metadata["images"].shape == (8, 3, 32, 32)
    assert set(pool.metadata["mos"].tolist()) <= {2.0, 3.0, 4.0, 5.0}
    assert (ROOT / "assets/eval/quality/mos.jsonl").is_file()
