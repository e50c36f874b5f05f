"""Cluster bootstrap: whole clusters resampled, the unit-level path unchanged, end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from genalign.rewards.base import Reward, RewardOutput
from genalign.rewards.evaluation import metrics
from genalign.rewards.evaluation.data import load_eval_dataset, resolve_columns
from genalign.rewards.evaluation.run import EvalConfig, RewardSpec, evaluate_rewards

from .conftest import png_bytes

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "eval"


def percentile_interval(draws, confidence=0.95):
    draws = np.asarray(draws, dtype=float)
    draws = draws[np.isfinite(draws)]
    alpha = 100 * (1 - confidence) / 2
    low, high = np.percentile(draws, [alpha, 100 - alpha])
    return float(low), float(high)


def rows_of(labels):
    """Cluster label -> its rows, labels in order of first appearance (written out, no numpy)."""
    members: dict = {}
    for row, label in enumerate(labels):
        members.setdefault(label, []).append(row)
    return list(members.values())


# -- metrics -----------------------------------------------------------------------------------------


def test_resamples_of_clusters_of_sizes_1_and_3_are_unions_of_whole_clusters():
    clusters = ["a", "b", "b", "b"]
    resamples = list(metrics.cluster_bootstrap_index(clusters, 4000, np.random.default_rng(0)))
    allowed = {(0, 0), (0, 1, 2, 3), (1, 1, 2, 2, 3, 3)}  # {a, a}, {a, b}, {b, b}
    assert {tuple(sorted(index.tolist())) for index in resamples} == allowed
    # every resample holds all or none of b's rows, as often each
    for index in resamples:
        counts = np.bincount(index, minlength=4)
        assert counts[1] == counts[2] == counts[3]
    # two clusters drawn per resample, each of mean size (1 + 3) / 2: the mean length is n
    assert np.mean([len(index) for index in resamples]) == pytest.approx(4, abs=0.1)


def test_cluster_index_equals_an_independent_construction():
    clusters = ["x", "y", "x", "z", "y", "y", "w"]
    members = rows_of(clusters)
    got = list(metrics.cluster_bootstrap_index(clusters, 50, np.random.default_rng(7)))
    rng = np.random.default_rng(7)
    for index in got:
        draw = rng.integers(0, len(members), size=len(members))
        expected = [row for code in draw for row in members[code]]
        assert index.tolist() == expected


def test_one_row_per_cluster_gives_exactly_the_unit_level_intervals():
    rng = np.random.default_rng(3)
    values = rng.random(37)
    values[[2, 5]] = np.nan  # a dropped pair (skip-ties) stays in the resamples
    singletons = [f"row{i}" for i in range(37)]
    for seed in (0, 4):
        assert metrics.mean_interval(values, 300, seed, clusters=singletons) == metrics.mean_interval(
            values, 300, seed
        )
    x = rng.random(23)
    y = x + rng.random(23)

    def statistic(index):
        return metrics.mos_correlations(x[index], y[index])

    assert metrics.bootstrap_intervals(statistic, 23, 60, 1, clusters=list(range(23))) == (
        metrics.bootstrap_intervals(statistic, 23, 60, 1)
    )
    generator = np.random.default_rng(2)
    for index in metrics.cluster_bootstrap_index(range(5), 3, np.random.default_rng(2)):
        assert index.tolist() == generator.integers(0, 5, size=5).tolist()


def test_the_unit_level_path_is_an_ordinary_percentile_bootstrap():
    """Without clusters the intervals are what they were: recomputed here from the same rng calls."""
    rng = np.random.default_rng(11)
    values = rng.random(29)
    values[3] = np.nan
    draws = np.random.default_rng(5).integers(0, 29, size=(400, 29))
    means = [np.nanmean(values[row]) for row in draws]
    assert metrics.mean_interval(values, 400, 5) == pytest.approx(percentile_interval(means), abs=1e-12)

    x, y = rng.random(17), rng.random(17)
    generator = np.random.default_rng(9)
    srcc = []
    for _ in range(80):
        index = generator.integers(0, 17, size=17)
        srcc.append(stats.spearmanr(x[index], y[index]).statistic)
    got = metrics.bootstrap_intervals(lambda i: metrics.mos_correlations(x[i], y[i], fit=False), 17, 80, 9)
    assert got["srcc"] == pytest.approx(percentile_interval(srcc), abs=1e-12)


def test_cluster_intervals_equal_an_independent_cluster_bootstrap():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 9, size=40).astype(str).tolist()
    values = rng.random(40)
    values[[0, 7, 8]] = np.nan
    members = rows_of(labels)
    k = len(members)

    # mean_interval draws all resamples' clusters in one call
    draws = np.random.default_rng(3).integers(0, k, size=(500, k))
    means = [np.nanmean(values[[row for code in draw for row in members[code]]]) for draw in draws]
    got = metrics.mean_interval(values, 500, 3, clusters=labels)
    assert got == pytest.approx(percentile_interval(means), abs=1e-12)

    # bootstrap_intervals draws one resample at a time, as its unit-level path does
    x = rng.random(40)
    generator = np.random.default_rng(4)
    srcc = []
    for _ in range(100):
        draw = generator.integers(0, k, size=k)
        index = [row for code in draw for row in members[code]]
        srcc.append(stats.spearmanr(x[index], np.nan_to_num(values)[index]).statistic)
    got = metrics.bootstrap_intervals(
        lambda i: metrics.mos_correlations(x[i], np.nan_to_num(values)[i], fit=False),
        40,
        100,
        4,
        clusters=labels,
    )
    assert got["srcc"] == pytest.approx(percentile_interval(srcc), abs=1e-12)


def test_cluster_bootstrap_is_wider_on_clustered_data_and_checks_its_labels():
    rng = np.random.default_rng(0)
    scenes = np.repeat(np.arange(24), 20)
    values = rng.normal(size=24)[scenes] + 0.5 * rng.normal(size=480)  # a strong scene effect
    image_level = metrics.mean_interval(values, 1000, 0)
    scene_level = metrics.mean_interval(values, 1000, 0, clusters=scenes)
    assert scene_level[1] - scene_level[0] > 2 * (image_level[1] - image_level[0])
    with pytest.raises(ValueError, match="3 labels for 4 units"):
        metrics.mean_interval([1.0, 2.0, 3.0, 4.0], 10, 0, clusters=["a", "a", "b"])
    with pytest.raises(ValueError, match="3 labels for 4 units"):
        metrics.bootstrap_intervals(lambda i: {"m": 0.0}, 4, 10, 0, clusters=["a", "a", "b"])


# -- data --------------------------------------------------------------------------------------------


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_cluster_column_for_mos_and_preference(image_dir):
    mos = [{"image": f"img{k}.png", "mos": float(k), "cluster": k // 2} for k in range(6)]
    samples = load_eval_dataset(write_jsonl(image_dir / "mos.jsonl", mos), "mos").samples
    assert [s.cluster for s in samples] == ["0", "0", "1", "1", "2", "2"]
    renamed = [{"image": f"img{k}.png", "mos": float(k), "scene": f"s{k % 3}"} for k in range(6)]
    dataset = load_eval_dataset(
        write_jsonl(image_dir / "m2.jsonl", renamed), "mos", columns={"cluster": "scene"}
    )
    assert [s.cluster for s in dataset.samples] == ["s0", "s1", "s2"] * 2
    pairs = [
        {"prompt": "p", "image_0": "img0.png", "image_1": f"img{k}.png", "label": 1, "cluster": "c"}
        for k in (1, 2)
    ]
    assert {
        s.cluster for s in load_eval_dataset(write_jsonl(image_dir / "p.jsonl", pairs), "preference").samples
    } == {"c"}
    plain = [{"image": f"img{k}.png", "mos": float(k)} for k in range(3)]
    assert all(
        s.cluster is None
        for s in load_eval_dataset(write_jsonl(image_dir / "m3.jsonl", plain), "mos").samples
    )
    partial = [*mos[:3], {"image": "img5.png", "mos": 1.0}]
    with pytest.raises(ValueError, match=r"'cluster' \(for cluster\) is empty in 1 of 4 rows \(line 4\)"):
        load_eval_dataset(write_jsonl(image_dir / "m4.jsonl", partial), "mos")
    with pytest.raises(ValueError, match="unknown column name 'cluster' for task 'ranking'"):
        resolve_columns("ranking", {"cluster": "scene"})


# -- end to end --------------------------------------------------------------------------------------


class LookupReward(Reward):
    """Scores a flat grey image by its grey level: ``table[level]``."""

    name = "lookup"

    def __init__(self, table: dict[int, float]) -> None:
        super().__init__()
        self.table = table

    def score(self, images, prompts, **metadata):
        levels = (images.mean(dim=(1, 2, 3)) * 255).round().long().tolist()
        return RewardOutput(images.new_tensor([self.table[level] for level in levels]), {})


def clustered_mos_table(folder: Path, scenes: int = 8, per_scene: int = 6):
    """MOS and reward share a scene effect: the correlation rests on ``scenes`` scenes, not on
    ``scenes * per_scene`` independent images. Returns (rows, grey level -> score)."""
    rng = np.random.default_rng(0)
    effect = rng.normal(size=scenes)
    rows, table = [], {}
    for k in range(scenes * per_scene):
        scene = k // per_scene
        (folder / f"g{k}.png").write_bytes(png_bytes(k))
        table[k] = float(effect[scene] + 0.1 * rng.normal())
        rows.append(
            {
                "image": f"g{k}.png",
                "mos": float(3 + effect[scene] + 0.1 * rng.normal()),
                "prompt": f"scene {scene}",
                "category": "ab"[k % 2],
                "cluster": scene,
            }
        )
    return rows, table


def test_evaluate_rewards_with_clusters_widens_the_mos_intervals(tmp_path):
    rows, table = clustered_mos_table(tmp_path)
    clustered = load_eval_dataset(write_jsonl(tmp_path / "mos.jsonl", rows), "mos")
    unclustered = [{k: v for k, v in row.items() if k != "cluster"} for row in rows]
    plain = load_eval_dataset(write_jsonl(tmp_path / "plain.jsonl", unclustered), "mos")
    key = RewardSpec("lookup").key

    def run(dataset, out, **options):
        config = EvalConfig(bootstrap=100, seed=2, progress=False, **options)
        return evaluate_rewards(
            dataset, [RewardSpec("lookup")], tmp_path / out, config, lambda s: LookupReward(table)
        )

    by_cluster = run(clustered, "clustered")
    by_image = run(plain, "plain")
    assert by_cluster["bootstrap_unit"] == {"unit": "clusters", "column": "cluster", "n_clusters": 8}
    assert by_image["bootstrap_unit"] == {"unit": "images"}
    report = (tmp_path / "clustered" / "report.md").read_text()
    assert "intervals resample clusters (column `cluster`, 8 clusters)" in report
    assert "intervals resample images." in (tmp_path / "plain" / "report.md").read_text()
    assert (
        json.loads((tmp_path / "clustered" / "summary.json").read_text())["bootstrap_unit"]["n_clusters"] == 8
    )

    cluster_srcc = by_cluster["rewards"][key]["metrics"]["srcc"]
    image_srcc = by_image["rewards"][key]["metrics"]["srcc"]
    assert cluster_srcc["value"] == image_srcc["value"]  # the estimate does not change
    width = {
        name: s["ci_high"] - s["ci_low"] for name, s in (("cluster", cluster_srcc), ("image", image_srcc))
    }
    assert width["cluster"] > 1.5 * width["image"]

    # per category resamples the category's clusters, with the same seed
    scores = np.array([table[k] for k in range(len(rows))])
    mos = np.array([row["mos"] for row in rows])
    in_a = np.array([row["category"] == "a" for row in rows])
    expected = metrics.bootstrap_intervals(
        lambda i: metrics.mos_correlations(scores[in_a][i], mos[in_a][i]),
        int(in_a.sum()),
        100,
        2,
        clusters=[row["cluster"] for row in rows if row["category"] == "a"],
    )["srcc"]
    got = by_cluster["rewards"][key]["per_category"]["a"]["metrics"]["srcc"]
    assert (got["ci_low"], got["ci_high"]) == expected

    # clustering by prompt (one prompt per scene) is the same bootstrap; by id, one image each,
    # is exactly the image-level one
    by_prompt = run(plain, "prompt", cluster_by="prompt")
    assert by_prompt["bootstrap_unit"] == {"unit": "clusters", "column": "prompt", "n_clusters": 8}
    assert by_prompt["rewards"][key]["metrics"] == by_cluster["rewards"][key]["metrics"]
    by_id = run(clustered, "id", cluster_by="id")
    assert by_id["rewards"][key]["metrics"] == by_image["rewards"][key]["metrics"]
    assert by_id["rewards"][key]["per_category"] == by_image["rewards"][key]["per_category"]


def test_preference_intervals_resample_prompts_when_clustered_by_prompt(image_dir, tmp_path):
    rows = [
        {
            "prompt": f"p{k // 3}",
            "image_0": f"img{k % 5}.png",
            "image_1": f"img{(k * 2) % 6}.png",
            "label": [1.0, 0.0, 0.5][k % 3] if k % 4 else 1.0,
            "category": "ab"[k % 2],
        }
        for k in range(12)
    ]
    dataset = load_eval_dataset(write_jsonl(image_dir / "pairs.jsonl", rows), "preference")
    config = EvalConfig(bootstrap=200, seed=1, tie_threshold=0.0, progress=False, cluster_by="prompt")

    class Brightness(Reward):
        name = "brightness"

        def score(self, images, prompts, **metadata):
            return RewardOutput(images.mean(dim=(1, 2, 3)), {})

    summary = evaluate_rewards(dataset, [RewardSpec("b")], tmp_path / "out", config, lambda s: Brightness())
    entry = summary["rewards"][RewardSpec("b").key]
    grey = {f"img{k}.png": 50 * k for k in range(6)}
    s0 = [grey[row["image_0"]] for row in rows]
    s1 = [grey[row["image_1"]] for row in rows]
    labels = [row["label"] for row in rows]
    prompts = [row["prompt"] for row in rows]
    for offset, policy in enumerate(("pickscore", "skip-ties", "strict")):
        credit = metrics.preference_credit(s0, s1, labels, policy, threshold=0.0)
        stats_ = entry["metrics"]["accuracy_" + policy.replace("-", "_")]
        expected = metrics.mean_interval(credit, 200, 1 + offset, clusters=prompts)
        assert (stats_["ci_low"], stats_["ci_high"]) == pytest.approx(expected, abs=1e-12)
        in_b = np.array([row["category"] == "b" for row in rows])
        per = entry["per_category"]["b"]["metrics"]["accuracy_" + policy.replace("-", "_")]
        expected = metrics.mean_interval(credit[in_b], 200, 1, clusters=np.array(prompts)[in_b])
        assert (per["ci_low"], per["ci_high"]) == pytest.approx(expected, abs=1e-12)
    assert summary["bootstrap_unit"] == {"unit": "clusters", "column": "prompt", "n_clusters": 4}


def test_bad_cluster_options_are_refused(image_dir, tmp_path):
    with pytest.raises(ValueError, match="--columns cluster=caption"):
        EvalConfig(cluster_by="caption")
    ranking = [{"prompt": "a", "images": ["img0.png", "img1.png"], "ranks": [1, 2]}]
    dataset = load_eval_dataset(write_jsonl(image_dir / "r.jsonl", ranking), "ranking")
    with pytest.raises(ValueError, match="a ranking sample is already one prompt"):
        evaluate_rewards(
            dataset, [RewardSpec("x")], tmp_path / "r", EvalConfig(cluster_by="prompt"), lambda s: None
        )
    no_prompt = [{"image": f"img{k}.png", "mos": float(k)} for k in range(3)]
    dataset = load_eval_dataset(write_jsonl(image_dir / "m.jsonl", no_prompt), "mos")
    with pytest.raises(ValueError, match="cannot cluster by 'prompt': it is empty in 3 of 3"):
        evaluate_rewards(
            dataset, [RewardSpec("x")], tmp_path / "m", EvalConfig(cluster_by="prompt"), lambda s: None
        )


def test_cli_cluster_by_flag(image_dir, tmp_path):
    from genalign.cli import main

    rows = [{"image": f"img{k}.png", "mos": float(k % 3), "prompt": f"p{k % 2}"} for k in range(6)]
    data = write_jsonl(image_dir / "mos.jsonl", rows)
    argv = ["eval-reward", "--reward", "jpeg_compressibility", "--data", str(data), "--task", "mos"]
    argv += ["--bootstrap", "20", "--no-progress", "--cluster-by", "prompt", "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["bootstrap_unit"] == {"unit": "clusters", "column": "prompt", "n_clusters": 2}


# -- the toy sets ------------------------------------------------------------------------------------


def test_the_toy_quality_sets_write_the_scene_as_cluster(tmp_path):
    from genalign.toy.quality import write_quality_set

    for path in write_quality_set(tmp_path / "toy", "heldout", scenes=2, seed=1):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        image = [row.get("image", row.get("image_0")) for row in rows]
        assert [row["cluster"] for row in rows] == [
            int(re.match(r"images/scene(\d+)_", i).group(1)) for i in image
        ]
        assert {row["cluster"] for row in rows} == {0, 1}
