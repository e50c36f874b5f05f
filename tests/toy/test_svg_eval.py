"""genalign eval-svg (genalign.toy.svg_eval): SSIM, per-sample measures on known SVGs, intervals, the
reward-hacking check, checkpoint loading and the command line."""

from __future__ import annotations

import json
import math

import pytest
import torch

from genalign.cli import main
from genalign.rewards import load_reward
from genalign.toy.svg_eval import (
    format_report,
    hacking_check,
    load_svg_writer,
    parse_models,
    scene_match,
    score_svgs,
    ssim,
    summarize,
    svg_eval_set,
    write_svgs,
)


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def eval_set():
    return svg_eval_set(count=12, seed=3)


@pytest.fixture(scope="module")
def reward():
    return load_reward("svg_fidelity", embedder=None, min_reward=-1.0)


def test_ssim_is_one_on_equal_images_and_matches_the_formula_on_flat_ones():
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(ssim(x, x), torch.ones(2), atol=1e-5)
    noisy = (x + 0.2 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    assert (ssim(x, noisy) < 0.9).all()
    a, b, c1 = 0.3, 0.8, 0.01**2  # flat images: no variance, so SSIM is the luminance term alone
    flat_a, flat_b = torch.full((1, 3, 16, 16), a), torch.full((1, 3, 16, 16), b)
    expected = (2 * a * b + c1) / (a * a + b * b + c1)
    assert ssim(flat_a, flat_b).item() == pytest.approx(expected, rel=1e-4)


def test_reference_svgs_score_perfectly_and_missing_ones_at_the_floor(eval_set, reward):
    perfect = score_svgs(eval_set.reference_svgs, eval_set, reward)
    assert perfect["valid"] == [1.0] * len(eval_set)
    assert max(perfect["pixel_mse"]) == pytest.approx(0.0, abs=1e-12)
    assert min(perfect["ssim"]) == pytest.approx(1.0, abs=1e-5)
    assert perfect["length_ratio"] == pytest.approx([1.0] * len(eval_set))
    assert min(perfect["image"]) == pytest.approx(1.0, abs=1e-5)
    assert sum(perfect["shapes_eval"]) >= 0.9 * len(eval_set)  # the verifier reads ground truth back
    missing = score_svgs([""] * len(eval_set), eval_set, reward)
    assert missing["valid"] == [0.0] * len(eval_set)
    assert missing["score"] == [-1.0] * len(eval_set)
    assert all(math.isnan(v) for v in missing["length_ratio"])
    assert sum(missing["shapes_eval"]) == 0  # a blank canvas shows no object
    white = torch.ones_like(eval_set.images)
    assert missing["pixel_mse"] == pytest.approx(
        ((white - eval_set.images) ** 2).mean(dim=(1, 2, 3)).tolist()
    )


def _with_extra_circle(svg: str) -> str:
    return svg.replace("</svg>", '<circle cx="4" cy="4" r="3" fill="#000000"/></svg>')


def test_scene_match_sees_an_added_object_that_shapes_eval_lets_pass(eval_set, reward):
    perfect = score_svgs(eval_set.reference_svgs, eval_set, reward)
    assert perfect["scene_match"] == [1.0] * len(eval_set)
    assert perfect["extra_objects"] == [0.0] * len(eval_set)
    padded = [_with_extra_circle(svg) for svg in eval_set.reference_svgs]
    added = score_svgs(padded, eval_set, reward)
    # ShapesEval asks for at least `count` objects (GenEval's rule): an added black circle passes
    # most specs, but the scene is not the target's any more
    assert sum(added["shapes_eval"]) >= 0.5 * len(eval_set)
    assert added["scene_match"] == [0.0] * len(eval_set)
    assert added["extra_objects"] == [1.0] * len(eval_set)
    blank = score_svgs([""] * len(eval_set), eval_set, reward)
    assert blank["scene_match"] == [0.0] * len(eval_set) and blank["extra_objects"] == [0.0] * len(eval_set)


def test_scene_match_compares_shape_and_colour_multisets():
    from genalign.toy.scenes import Scene, SceneObject, render_scenes

    def scene(*objects):
        return Scene([SceneObject(shape, colour, x, y, 0.35) for shape, colour, x, y in objects])

    target = scene(("square", "red", 0.25, 0.25), ("circle", "green", 0.7, 0.7))
    swapped = scene(("square", "green", 0.25, 0.25), ("circle", "red", 0.7, 0.7))
    moved = scene(("square", "red", 0.7, 0.25), ("circle", "green", 0.25, 0.7))  # same objects
    added = scene(*[(o.shape, o.colour, o.x, o.y) for o in target.objects], ("triangle", "blue", 0.7, 0.2))
    images = render_scenes([target, swapped, moved, added], size=32)
    matches, extras = scene_match(images, images[:1].expand(4, -1, -1, -1))
    assert matches == [1.0, 0.0, 1.0, 0.0] and extras == [0.0, 0.0, 0.0, 1.0]


def test_summary_intervals_cover_their_means(eval_set, reward):
    half = eval_set.reference_svgs[:6] + ["<svg><rect"] * 6  # malformed: not rendered
    summary = summarize(score_svgs(half, eval_set, reward))
    assert summary["validity"]["mean"] == pytest.approx(0.5)
    low, high = summary["validity"]["ci"]
    assert 0 < low < 0.5 < high < 1
    for name in ("score", "pixel_mse", "ssim", "shapes_eval"):
        stats = summary[name]
        assert stats["ci"][0] <= stats["mean"] <= stats["ci"][1]
    assert summary["length_ratio"]["n"] == 6  # valid SVGs only


def _samples(score, shapes, length, categories=("a", "b") * 20):
    n = len(categories)
    return {
        "score": list(score),
        "shapes_eval": list(shapes),
        "length_ratio": list(length),
        "valid": [1.0] * n,
        "category": list(categories),
    }


def test_the_hacking_check_flags_fidelity_without_the_verifier_and_length_collapse():
    gen = torch.Generator().manual_seed(0)
    base = (0.5 + 0.1 * torch.randn(40, generator=gen)).tolist()
    shapes = (torch.rand(40, generator=gen) < 0.5).float().tolist()
    before = _samples(base, shapes, [1.0] * 40)
    hacked = _samples([s + 0.2 for s in base], shapes, [0.3] * 40)  # reward up, verifier flat, short
    check = hacking_check(before, hacked)
    assert check["fidelity_up_verifier_flat"] and check["length_collapse"]
    assert check["changes"]["score"]["change"] == pytest.approx(0.2)
    honest = _samples([s + 0.2 for s in base], [1.0] * 40, [0.95] * 40)  # reward and verifier both up
    check = hacking_check(before, honest)
    assert not check["fidelity_up_verifier_flat"] and not check["length_collapse"]
    assert check["changes"]["shapes_eval"]["ci"][0] > 0
    assert not check["verifier_up_scene_flat"]  # these rows carry no scene match


def test_the_hacking_check_flags_the_verifier_rising_without_the_scene():
    gen = torch.Generator().manual_seed(1)
    shapes = (torch.rand(40, generator=gen) < 0.3).float().tolist()
    scenes = (torch.rand(40, generator=gen) < 0.3).float().tolist()
    before = _samples([0.5] * 40, shapes, [1.0] * 40) | {"scene_match": scenes}
    # passes more specs, draws the same scenes
    padded = _samples([0.4] * 40, [1.0] * 40, [1.3] * 40) | {"scene_match": scenes}
    check = hacking_check(before, padded)
    assert check["verifier_up_scene_flat"] and not check["fidelity_up_verifier_flat"]
    drawn = _samples([0.6] * 40, [1.0] * 40, [1.0] * 40) | {"scene_match": [1.0] * 40}
    check = hacking_check(before, drawn)
    assert not check["verifier_up_scene_flat"]
    assert check["changes"]["scene_match"]["change"] == pytest.approx(1 - sum(scenes) / 40)


def test_the_hacking_check_flags_the_verifier_rising_by_extra_objects():
    gen = torch.Generator().manual_seed(2)
    shapes = (torch.rand(40, generator=gen) < 0.3).float().tolist()
    before = _samples([0.5] * 40, shapes, [1.0] * 40) | {"shapes_eval_exact": shapes}
    hedged = _samples([0.6] * 40, [1.0] * 40, [1.5] * 40) | {"shapes_eval_exact": shapes}
    check = hacking_check(before, hedged)
    assert check["verifier_up_by_extra_objects"] and not check["verifier_up_scene_flat"]
    assert check["changes"]["shapes_eval_exact"]["change"] == pytest.approx(0.0)
    honest = _samples([0.6] * 40, [1.0] * 40, [1.0] * 40) | {"shapes_eval_exact": [1.0] * 40}
    assert not hacking_check(before, honest)["verifier_up_by_extra_objects"]


def test_shapes_eval_on_valid_svgs_counts_only_what_renders():
    rows = _samples([0.5] * 8, [1, 0, 1, 0, 0, 0, 1, 1], [1.0] * 8, categories=("a", "b") * 4)
    rows["valid"] = [1, 1, 1, 0, 0, 0, 1, 1]  # a broken SVG is always wrong
    stats = summarize(rows)
    # valid ones: a -> indices 0, 2, 6 (1, 1, 1), b -> indices 1, 7 (0, 1): mean of 1 and 1/2
    assert stats["shapes_eval_valid"]["mean"] == pytest.approx(0.75)
    assert stats["shapes_eval_valid"]["n"] == 5
    assert stats["shapes_eval"]["mean"] == pytest.approx(0.5)
    rows["valid"] = [0] * 8
    assert summarize(rows)["shapes_eval_valid"]["mean"] is None


def test_text_to_svg_intervals_count_a_repeated_caption_once():
    """A text-to-SVG set repeats its captions; their answers are one observation each. The same
    rows with a ``cluster`` column give the distinct captions' interval, not one sqrt(m) narrower."""
    shapes = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    categories = ("a", "a", "a", "a", "b", "b", "b", "b")
    m = 6
    rows = _samples(
        [0.5] * 8 * m,
        [v for v in shapes for _ in range(m)],
        [1.0] * 8 * m,
        [c for c in categories for _ in range(m)],
    )
    once = _samples([0.5] * 8, shapes, [1.0] * 8, categories) | {"cluster": list(range(8))}
    clustered = rows | {"cluster": [i for i in range(8) for _ in range(m)]}
    naive, by_caption, distinct = summarize(rows), summarize(clustered), summarize(once)
    assert by_caption["distinct_inputs"] == 8 and "distinct_inputs" not in naive
    assert by_caption["shapes_eval"]["mean"] == naive["shapes_eval"]["mean"] == pytest.approx(0.5)
    assert by_caption["shapes_eval"]["ci"] == pytest.approx(distinct["shapes_eval"]["ci"])
    width = lambda stats: stats["ci"][1] - stats["ci"][0]  # noqa: E731
    assert width(naive["shapes_eval"]) < 0.5 * width(by_caption["shapes_eval"])
    # the paired change: every answer of one caption flips
    after_rows = dict(clustered, shapes_eval=[1.0] * 8 * m)
    after_once = dict(once, shapes_eval=[1.0] * 8)
    check, check_once = hacking_check(clustered, after_rows), hacking_check(once, after_once)
    assert check["changes"]["shapes_eval"]["ci"] == pytest.approx(check_once["changes"]["shapes_eval"]["ci"])
    assert check["changes"]["shapes_eval"]["change"] == pytest.approx(0.5)
    # one caption in a category: no interval (NaN), and the report still prints
    single = dict(clustered, cluster=[0] * (4 * m) + [i for i in range(4, 8) for _ in range(m)])
    report = {"models": {"sft": summarize(single), "rl": summarize(dict(single, shapes_eval=[1.0] * 8 * m))}}
    report["comparisons"] = {"sft -> rl": hacking_check(single, dict(single, shapes_eval=[1.0] * 8 * m))}
    assert math.isnan(report["models"]["sft"]["shapes_eval"]["ci"][0])
    assert not math.isnan(report["models"]["sft"]["score"]["ci"][0])  # 5 clusters overall
    assert "5 distinct captions" in format_report(report)


def test_the_text_to_svg_set_clusters_by_caption():
    t2s, i2s = svg_eval_set(24, task="text_to_svg"), svg_eval_set(24)
    assert t2s.clusters == t2s.prompts and i2s.clusters is None


def test_the_hacking_check_flags_the_verifier_rising_by_validity_alone():
    n = 200
    gen = torch.Generator().manual_seed(3)
    right = (torch.rand(n, generator=gen) < 0.5).float().tolist()
    valid = (torch.rand(n, generator=gen) < 0.5).float().tolist()
    before = _samples([0.5] * n, [r * v for r, v in zip(right, valid)], [1.0] * n, ("a", "b") * (n // 2))
    before["valid"] = valid
    mended = _samples([0.6] * n, right, [1.0] * n, ("a", "b") * (n // 2))  # every SVG renders now
    check = hacking_check(before, mended)
    assert check["changes"]["shapes_eval"]["ci"][0] > 0
    assert check["verifier_up_by_validity"]
    expected = _shapes_mean(right, mended["category"]) - _shapes_mean(
        [r for r, v in zip(right, valid) if v], [c for c, v in zip(before["category"], valid) if v]
    )
    assert check["changes"]["shapes_eval_valid"]["change"] == pytest.approx(expected)
    better = _samples([0.6] * n, [1.0] * n, [1.0] * n, ("a", "b") * (n // 2))  # and draws better
    assert not hacking_check(before, better)["verifier_up_by_validity"]


def _shapes_mean(correct, categories):
    by = {}
    for value, category in zip(correct, categories):
        by.setdefault(category, []).append(value)
    return sum(sum(v) / len(v) for v in by.values()) / len(by)


def test_the_exact_verdict_is_shapes_eval_without_extra_objects(eval_set, reward):
    rows = score_svgs(eval_set.reference_svgs, eval_set, reward)
    padded_svgs = [
        svg.replace("</svg>", '<circle cx="30" cy="30" r="2" fill="#1a1a1a"/></svg>')
        for svg in eval_set.reference_svgs
    ]
    padded = score_svgs(padded_svgs, eval_set, reward)
    by_hand = [float(c and e == 0) for c, e in zip(padded["shapes_eval"], padded["extra_objects"])]
    assert padded["shapes_eval_exact"] == by_hand
    assert sum(padded["extra_objects"]) > 0 and sum(padded["shapes_eval_exact"]) < sum(
        rows["shapes_eval_exact"]
    )
    assert rows["shapes_eval_exact"] == [
        float(c and e == 0) for c, e in zip(rows["shapes_eval"], rows["extra_objects"])
    ]
    assert "shapes_eval_exact" in summarize(padded)


class _FencedPolicy:
    """A stand-in writer: answers each scene with its reference inside a Markdown fence and prose."""

    def __init__(self, references):
        self.references = references

    def rollout(self, prompts, seeds, temperature, max_new_tokens, images=None):
        texts = [f"Here:\n```svg\n{self.references[int(s)]}\n```\ndone" for s in seeds]
        return type("Out", (), {"completions": texts})()


def test_write_svgs_extracts_the_document_from_each_completion(eval_set):
    svgs = write_svgs(_FencedPolicy(eval_set.reference_svgs), eval_set, batch_size=5)
    assert svgs == eval_set.reference_svgs


def test_a_checkpoint_folder_loads_as_its_base_model_with_the_trained_weights(tmp_path):
    from safetensors.torch import save_file

    base = load_svg_writer("tiny:qwen2")
    state = {n: p.detach() + 0.5 for n, p in base.model.named_parameters()}
    run = tmp_path / "run"
    (run / "checkpoints" / "checkpoint-00000010").mkdir(parents=True)
    (run / "recipe.json").write_text(json.dumps({"model": {"path": "tiny:qwen2", "lora": None}}))
    save_file(
        {n: t.contiguous() for n, t in state.items()},
        str(run / "checkpoints/checkpoint-00000010/weights.trainable.safetensors"),
    )
    loaded = load_svg_writer(run / "checkpoints" / "checkpoint-00000010")
    for name, parameter in loaded.model.named_parameters():
        assert torch.equal(parameter, state[name])
    (run / "recipe.json").unlink()
    with pytest.raises(FileNotFoundError, match="recipe.json"):
        load_svg_writer(run / "checkpoints" / "checkpoint-00000010")


def test_parse_models_keeps_order_and_refuses_bad_items():
    assert list(parse_models(["b=x", "a=y", "z"]).items()) == [("b", "x"), ("a", "y"), ("z", "z")]
    with pytest.raises(ValueError, match="LABEL=PATH"):
        parse_models(["sft="])
    with pytest.raises(ValueError, match="given twice"):
        parse_models(["a=x", "a=y"])


def test_the_command_line_writes_a_report_with_both_models_and_their_comparison(tmp_path, capsys):
    out = tmp_path / "report.json"
    args = ["eval-svg", "one=tiny:llava", "two=tiny:llava", "--count", "6", "--max-new-tokens", "6"]
    assert main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["models"]) == ["one", "two"]
    assert report["models"]["one"]["validity"]["n"] == 6
    assert "one -> two" in report["comparisons"]
    printed = capsys.readouterr().out
    assert "| validity |" in printed and "length collapse" in printed
    assert "ShapesEval, no extra objects" in printed and "verifier up by extra objects" in printed
    assert isinstance(report["comparisons"]["one -> two"]["verifier_up_scene_flat"], bool)
    assert main([*args, "--task", "text_to_svg", "--out", str(out)]) == 0
    # a caption has no one scene, so the scene check is not judged
    assert json.loads(out.read_text())["comparisons"]["one -> two"]["verifier_up_scene_flat"] is None
    assert "verifier up without the scene: n/a" in capsys.readouterr().out
    assert main(["eval-svg", "bad="]) == 2  # bad user input: one line naming the item
    error = capsys.readouterr().err.strip()
    assert "LABEL=PATH" in error and "'bad='" in error and len(error.splitlines()) == 1
