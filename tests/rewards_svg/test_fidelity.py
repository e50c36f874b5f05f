"""``svg_fidelity`` (RLRF, Rodriguez et al. 2025, Sec. 3.2): the terms against hand computations,
the reward's ordering on constructed drawings, and failures scored at the minimum."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from genalign.rewards.base import load_reward
from genalign.rewards.svg import SVGRenderPool, render_local
from genalign.rewards.svg.fidelity import (
    SVGFidelityReward,
    canny_edges,
    edge_map,
    length_reward,
    normalize_per_channel,
    normalized_l2_reward,
)

NS = 'xmlns="http://www.w3.org/2000/svg"'
SIZE = 64


def scene(shift: float = 0.0, keep: tuple[int, ...] = (0, 1, 2)) -> str:
    shapes = [
        f'<circle cx="{20 + shift}" cy="{22 + shift / 2}" r="12" fill="#dd2222"/>',
        '<rect x="36" y="30" width="20" height="24" fill="#2233cc"/>',
        '<path d="M8 56 L24 34 L32 56 Z" fill="#22aa44"/>',
    ]
    return f'<svg {NS} viewBox="0 0 64 64">' + "".join(shapes[i] for i in keep) + "</svg>"


TARGET_SVG = scene()


@pytest.fixture(scope="module")
def pool():
    with SVGRenderPool(workers=2) as pool:
        yield pool


@pytest.fixture(scope="module")
def target() -> torch.Tensor:
    return render_local(TARGET_SVG, SIZE, SIZE).image  # (3, H, W)


def targets_for(target: torch.Tensor, batch: int) -> torch.Tensor:
    return target.unsqueeze(0).expand(batch, -1, -1, -1)


# -- the terms -------------------------------------------------------------------------------------


def test_normalized_l2_is_two_pearson_minus_one():
    """With population statistics mean((z - ẑ)²) = 2 (1 - ρ) per channel, so R = 2ρ̄ - 1 (clipped)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(4, 3, 16, 16, generator=generator)
    b = 0.6 * a + 0.4 * torch.rand(4, 3, 16, 16, generator=generator)
    reward, mse = normalized_l2_reward(b, a)
    for i in range(4):
        rho = torch.stack(
            [torch.corrcoef(torch.stack([a[i, c].flatten(), b[i, c].flatten()]))[0, 1] for c in range(3)]
        )
        assert mse[i] == pytest.approx(float(2 * (1 - rho).mean()), abs=1e-5)
        assert reward[i] == pytest.approx(float((2 * rho.mean() - 1).clamp(-1, 1)), abs=1e-5)
    assert torch.allclose(normalized_l2_reward(a, a)[0], torch.ones(4))
    assert torch.allclose(
        normalized_l2_reward(0.2 + 0.5 * a, a)[0], torch.ones(4), atol=1e-5
    )  # affine-invariant
    assert torch.allclose(normalized_l2_reward(1 - a, a)[0], -torch.ones(4))  # anti-correlated: clipped
    flat = normalize_per_channel(torch.full((1, 3, 4, 4), 0.7))
    assert torch.equal(flat, torch.zeros_like(flat))  # uniform channels normalise to 0, not NaN


def test_length_reward_by_hand():
    reference = torch.tensor([100.0] * 5)
    lengths = torch.tensor([30.0, 50.0, 100.0, 150.0, 300.0])
    # 1 - (max(0, L - 50) / 100)^2
    assert torch.allclose(
        length_reward(lengths, reference, low=None), torch.tensor([1.0, 1.0, 0.75, 0.0, -5.25])
    )
    assert torch.allclose(length_reward(lengths, reference), torch.tensor([1.0, 1.0, 0.75, 0.0, -1.0]))


def test_one_sided_length_reward_by_hand():
    reference = torch.tensor([100.0] * 6)
    lengths = torch.tensor([30.0, 100.0, 110.0, 120.0, 160.0, 400.0])
    # margin 0.1: 1 - (max(0, L - 110) / 100)^2 -> 1, 1, 1, 1 - 0.01, 1 - 0.25, 1 - 8.41 (clipped to -1)
    expected = torch.tensor([1.0, 1.0, 1.0, 0.99, 0.75, -7.41])
    assert torch.allclose(length_reward(lengths, reference, low=None, free_fraction=1.1), expected)
    assert torch.allclose(length_reward(lengths, reference, free_fraction=1.1), expected.clamp_min(-1.0))


def test_canny_finds_the_outline_of_a_square():
    image = torch.ones(1, 3, 32, 32)
    image[:, :, 8:24, 8:24] = torch.tensor([1.0, 1.0, 0.0]).view(
        1, 3, 1, 1
    )  # yellow on white: luma contrast 0.11
    edges = canny_edges(image)[0, 0]
    rows, cols = edges.nonzero(as_tuple=True)
    distance_to_outline = torch.minimum(
        torch.minimum((rows - 7.5).abs(), (rows - 23.5).abs()),
        torch.minimum((cols - 7.5).abs(), (cols - 23.5).abs()),
    )
    assert distance_to_outline.max() <= 1.0  # thin edges, on the boundary (no ghost edges inside)
    ring = torch.zeros(32, 32, dtype=torch.bool)
    ring[7:25, 7:25] = True
    ring[9:23, 9:23] = False
    covered = (F.max_pool2d(edges[None, None], 3, 1, 1)[0, 0].bool() & ring).sum() / ring.sum()
    assert covered > 0.85  # the whole outline, corners included, hysteresis closing gaps
    assert canny_edges(torch.ones(1, 3, 16, 16)).sum() == 0
    blurred = edge_map(image)
    assert blurred.shape == (1, 1, 32, 32) and 0 <= blurred.min() and blurred.max() <= 1


# -- the reward ------------------------------------------------------------------------------------


def test_the_targets_own_svg_scores_the_maximum(pool, target):
    reward = SVGFidelityReward(pool=pool)
    out = reward([TARGET_SVG, scene(3)], targets=targets_for(target, 2))
    assert out.scores[0] == pytest.approx(1.0, abs=1e-6)
    assert out.details["image"][0] == pytest.approx(1.0, abs=1e-6) and out.details["edge"][
        0
    ] == pytest.approx(1.0, abs=1e-6)
    assert out.scores[1] < out.scores[0]
    assert out.details["failure"] == [None, None] and out.details["failure_count"] == 0
    assert out.details["weights"] == {"image": 1.0, "edge": 1.0}


@pytest.mark.parametrize(
    "sequence",
    [
        [scene(shift) for shift in (0, 1, 2, 4, 8, 16, 32)],
        [scene(keep=keep) for keep in ((0, 1, 2), (1, 2), (2,))]
        + [f'<svg {NS} viewBox="0 0 64 64"><circle cx="60" cy="4" r="2" fill="#999"/></svg>'],
    ],
    ids=["displaced", "removed"],
)
@pytest.mark.parametrize("backend", ["cairosvg", "skia"])
def test_worse_drawings_score_lower(pool, target, sequence, backend):
    out = SVGFidelityReward(pool=pool, backend=backend)(sequence, targets=targets_for(target, len(sequence)))
    assert out.details["failure_count"] == 0
    for name in ("image", "edge"):
        assert (out.details[name].diff() <= 1e-6).all(), (name, out.details[name])
    assert (out.scores.diff() < 0).all(), out.scores


def test_invalid_blank_and_hostile_svgs_score_the_minimum_with_a_reason(pool, target):
    documents = [
        TARGET_SVG,
        "not an svg at all",
        f'<svg {NS} viewBox="0 0 64 64"/>',  # blank: white
        f'<svg {NS} viewBox="0 0 64 64"><rect width="64" height="64" fill="#dd2222"/></svg>',  # uniform colour
        f'<svg {NS}><image href="file:///etc/passwd" width="9" height="9"/></svg>',
        f'<!DOCTYPE svg [<!ENTITY x SYSTEM "file:///etc/passwd">]><svg {NS}><text>&x;</text></svg>',
        TARGET_SVG[: len(TARGET_SVG) // 2],
    ]
    reward = SVGFidelityReward(pool=pool, embedder=lambda x: F.adaptive_avg_pool2d(x, 4).flatten(1))
    out = reward(
        documents, targets=targets_for(target, len(documents)), reference_svgs=[TARGET_SVG] * len(documents)
    )
    assert out.details["failure"] == [
        None,
        "parse_error",
        "blank",
        "blank",
        "external_reference",
        "forbidden_entity",
        "parse_error",
    ]
    assert out.details["failure_count"] == 6
    assert torch.all(out.scores[1:] == -1.0)
    for name in ("image", "edge", "semantic", "length"):
        assert torch.all(out.details[name][1:] == -1.0), name
        assert out.details[name][0] > 0.7
    assert torch.isnan(out.details["image_mse"][1:]).all() and not torch.isnan(out.details["image_mse"][0])
    assert out.details["nan_count"] == 0


def test_a_white_canvas_is_never_a_near_match_of_a_mostly_white_target(pool):
    sparse = f'<svg {NS} viewBox="0 0 64 64"><circle cx="32" cy="32" r="1.5" fill="#000"/></svg>'
    target = render_local(sparse, SIZE, SIZE).image
    blank = f'<svg {NS} viewBox="0 0 64 64"><rect width="64" height="64" fill="white"/></svg>'
    out = SVGFidelityReward(pool=pool, min_reward=-0.5)([blank, sparse], targets=targets_for(target, 2))
    assert out.details["failure"] == ["blank", None]
    assert out.scores.tolist() == pytest.approx([-0.5, 1.0])


def test_semantic_term_is_pluggable(pool, target):
    class Embedder(torch.nn.Module):
        def encode_images(self, images: torch.Tensor) -> torch.Tensor:
            return F.adaptive_avg_pool2d(images, 2).flatten(1) - 0.5

    documents = [TARGET_SVG, scene(8)]
    for embedder in (Embedder(), lambda x: F.adaptive_avg_pool2d(x, 2).flatten(1) - 0.5):
        reward = SVGFidelityReward(pool=pool, embedder=embedder, weights={"image": 0, "edge": 0})
        out = reward(documents, targets=targets_for(target, 2))
        assert out.details["weights"] == {"semantic": 1.0}
        assert out.details["semantic"][0] == pytest.approx(1.0, abs=1e-6)
        cosine = out.details["cosine"][1]
        assert out.details["semantic"][1] == pytest.approx(float(2 * cosine - 1), abs=1e-6)
        assert torch.equal(out.scores, out.details["semantic"])


def test_match_term_is_the_embedders_same_image_decision(pool, target):
    def embed(images: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(images, 2).flatten(1) - 0.5

    documents = [TARGET_SVG, scene(8), "<svg"]
    weights = {"image": 0, "edge": 0, "semantic": 1, "match": 3}
    for threshold in (1e-6, 1.5):
        reward = SVGFidelityReward(pool=pool, embedder=embed, weights=weights, match_threshold=threshold)
        out = reward(documents, targets=targets_for(target, 3))
        distance = 1 - out.details["cosine"][:2]
        expected = (distance < threshold).float()
        assert out.details["match"][:2].tolist() == expected.tolist()
        assert out.details["match"][2] == -1.0  # a failed SVG gets the floor in every term
        by_hand = (out.details["semantic"][:2] + 3 * expected) / 4
        assert out.scores[:2].tolist() == pytest.approx(by_hand.tolist(), abs=1e-6)
        assert out.details["weights"] == {"semantic": 1.0, "match": 3.0}
    assert 1 - out.details["cosine"][1] > 1e-6  # the shifted scene is not the target by the first threshold
    assert SVGFidelityReward(pool=pool, embedder=embed).weights["match"] == 0.0  # off by default
    with pytest.raises(ValueError, match="needs an embedder"):
        SVGFidelityReward(pool=pool, weights={"match": 1.0})
    with pytest.raises(ValueError, match="match_threshold"):
        SVGFidelityReward(pool=pool, embedder=embed, match_threshold=0)


def test_clip_embedder_by_name(pool, target, tmp_path):
    pytest.importorskip("open_clip")
    from genalign.tiny.clip import OPEN_CLIP_WEIGHTS_NAME, TINY_OPEN_CLIP_NAME, open_clip_model

    open_clip_model(seed=1, save_to=tmp_path)
    reward = SVGFidelityReward(
        pool=pool,
        embedder="clip",
        embedder_kwargs={"model": TINY_OPEN_CLIP_NAME, "pretrained": str(tmp_path / OPEN_CLIP_WEIGHTS_NAME)},
    )
    out = reward([TARGET_SVG, scene(16)], targets=targets_for(target, 2))
    assert out.details["semantic"][0] == pytest.approx(1.0, abs=1e-5)
    assert out.details["semantic"][1] < 1.0


def test_length_term_and_reference_rendering(pool, target):
    long_svg = TARGET_SVG.replace("<circle", "<!--" + "x" * 400 + "--><circle")  # same pixels, longer code
    reward = load_reward("svg_fidelity", pool=pool, render_size=(SIZE, SIZE))
    out = reward(
        [TARGET_SVG, long_svg], reference_svgs=[TARGET_SVG, TARGET_SVG]
    )  # targets rendered from refs
    ratio = len(long_svg) / len(TARGET_SVG)
    assert out.details["length_ratio"].tolist() == pytest.approx([1.0, ratio])
    assert out.details["length"].tolist() == pytest.approx([0.75, max(-1.0, 1 - (ratio - 0.5) ** 2)])
    assert out.details["image"].tolist() == pytest.approx([1.0, 1.0], abs=1e-6)
    assert out.scores[0] == pytest.approx((1 + 1 + 0.75) / 3) and out.scores[1] < out.scores[0]
    by_count = reward([TARGET_SVG], reference_lengths=[len(TARGET_SVG) * 2], reference_svgs=[TARGET_SVG])
    assert by_count.details["length"][0] == pytest.approx(1.0)  # reference_lengths override


def test_length_margin_option(pool, target):
    pad = len(TARGET_SVG) * 2 // 5  # a comment of 0.4 L_ref - 7 characters: the SVG is ~1.4 L_ref
    long_svg = TARGET_SVG.replace("<circle", "<!--" + "x" * (pad - 7) + "--><circle")
    reward = load_reward("svg_fidelity", pool=pool, render_size=(SIZE, SIZE), length_margin=0.2)
    out = reward([TARGET_SVG, long_svg], reference_svgs=[TARGET_SVG, TARGET_SVG])
    ratio = len(long_svg) / len(TARGET_SVG)
    assert 1.3 < ratio < 1.5
    # the paper's term pays 0.75 at the reference's length; with the margin, 1 (free up to 1.2 L_ref)
    assert out.details["length"].tolist() == pytest.approx([1.0, 1 - (ratio - 1.2) ** 2])
    assert "length_margin=0.2" in repr(reward)
    with pytest.raises(ValueError, match="length_margin"):
        SVGFidelityReward(pool=pool, length_margin=-0.1)


def test_argument_checks(pool, target):
    reward = SVGFidelityReward(pool=pool)
    with pytest.raises(ValueError, match="targets"):
        reward([TARGET_SVG])
    with pytest.raises(ValueError, match="2 targets"):
        reward([TARGET_SVG], targets=targets_for(target, 2))
    with pytest.raises(ValueError, match="list of SVG strings"):
        reward(TARGET_SVG, targets=targets_for(target, 1))
    with pytest.raises(ValueError, match="unknown svg_fidelity weight"):
        SVGFidelityReward(weights={"pixels": 1.0})
    with pytest.raises(ValueError, match="positive weight"):
        SVGFidelityReward(weights={"image": 0, "edge": 0})
    assert SVGFidelityReward.input_kind == "svg" and not SVGFidelityReward.differentiable
