"""``svg_fidelity``'s ``judge`` term and the :class:`PairJudge` it loads (docs/language.md 5.10):
the term against its definition, failures at the floor, the folder round trip, the judge's
symmetry, and one-line errors for a missing or broken folder."""

from __future__ import annotations

import pytest
import torch

from genalign.rewards.svg import SVGRenderPool, render_local
from genalign.rewards.svg.fidelity import SVGFidelityReward
from genalign.rewards.svg.judge import PairJudge, load_pair_judge

NS = 'xmlns="http://www.w3.org/2000/svg"'
TARGET = f'<svg {NS} viewBox="0 0 32 32"><circle cx="12" cy="12" r="6" fill="#dd2222"/></svg>'
MOVED = f'<svg {NS} viewBox="0 0 32 32"><circle cx="20" cy="18" r="6" fill="#dd2222"/></svg>'
BLUE = f'<svg {NS} viewBox="0 0 32 32"><rect x="8" y="8" width="10" height="10" fill="#2233cc"/></svg>'


@pytest.fixture(scope="module")
def pool():
    with SVGRenderPool(workers=1) as pool:
        yield pool


def _targets(batch: int) -> torch.Tensor:
    return render_local(TARGET, 32, 32).image.unsqueeze(0).expand(batch, -1, -1, -1)


def test_judge_term_is_twice_the_probability_minus_one(pool):
    seen = []

    def judge(renders: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seen.append((renders.shape, targets.shape))
        # "same" when the render's mean redness matches the target's: 0.9 for red, 0.2 otherwise
        red = renders[:, 0].mean((1, 2)) - renders[:, 2].mean((1, 2))
        return torch.where(red > 0.01, torch.tensor(0.9), torch.tensor(0.2))

    documents = [TARGET, MOVED, BLUE, "<svg"]
    reward = SVGFidelityReward(pool=pool, weights={"image": 1, "edge": 0, "judge": 3}, judge=judge)
    out = reward(documents, targets=_targets(4))
    assert seen == [(torch.Size([3, 3, 32, 32]), torch.Size([3, 3, 32, 32]))]  # only the renders that worked
    assert out.details["judge"].tolist() == pytest.approx([0.8, 0.8, -0.6, -1.0])
    assert out.details["judge_probability"][:3].tolist() == pytest.approx([0.9, 0.9, 0.2])
    assert torch.isnan(out.details["judge_probability"][3])
    by_hand = (out.details["image"][:3] + 3 * out.details["judge"][:3]) / 4
    assert out.scores[:3].tolist() == pytest.approx(by_hand.tolist(), abs=1e-6)
    assert out.scores[3] == -1.0
    assert out.details["weights"] == {"image": 1.0, "judge": 3.0}


def test_judge_term_is_off_by_default_and_needs_a_judge(pool, tmp_path):
    assert SVGFidelityReward(pool=pool).weights["judge"] == 0.0
    with pytest.raises(ValueError, match="needs a judge"):
        SVGFidelityReward(pool=pool, weights={"judge": 1.0})
    with pytest.raises(FileNotFoundError, match="config.json"):
        SVGFidelityReward(pool=pool, weights={"judge": 1.0}, judge=str(tmp_path / "nothing"))

    def bad(renders, targets):
        return torch.full((renders.shape[0],), float("nan"))

    reward = SVGFidelityReward(pool=pool, weights={"judge": 1.0}, judge=bad)
    with pytest.raises(ValueError, match="one finite probability"):
        reward([TARGET], targets=_targets(1))


def test_pair_judge_is_symmetric_and_round_trips(tmp_path):
    torch.manual_seed(0)
    judge = PairJudge(width=8, embed=16, hidden=16).eval()
    judge.config["image_size"] = 32
    a, b = torch.rand(5, 3, 32, 32), torch.rand(5, 3, 32, 32)
    assert torch.allclose(judge(a, b), judge(b, a), atol=1e-6)
    judge.save(tmp_path / "j", extra={"shift": 0.1})
    loaded = load_pair_judge(f"local-dir:{tmp_path / 'j'}")
    assert loaded.config == {"width": 8, "embed": 16, "hidden": 16, "image_size": 32, "shift": 0.1}
    assert torch.equal(loaded(a, b), judge(a, b))
    # images at another size are resized to the training size first
    big_a = torch.nn.functional.interpolate(a, size=(64, 64), mode="nearest")
    assert loaded.probability(big_a, b).shape == (5,)
    (tmp_path / "j" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        load_pair_judge(tmp_path / "j")


def test_a_judge_folder_drives_the_reward(pool, tmp_path):
    torch.manual_seed(1)
    PairJudge(width=8, embed=16, hidden=16).save(tmp_path / "j", extra={"image_size": 32})
    reward = SVGFidelityReward(
        pool=pool, weights={"image": 1, "judge": 1}, judge=f"local-dir:{tmp_path / 'j'}"
    )
    out = reward([TARGET, BLUE], targets=_targets(2))
    expected = load_pair_judge(tmp_path / "j").probability(
        torch.stack([render_local(s, 32, 32).image for s in (TARGET, BLUE)]), _targets(2)
    )
    assert out.details["judge_probability"].tolist() == pytest.approx(expected.tolist(), abs=1e-6)


def test_judge_log_floor_grades_the_misses(pool):
    import math

    values = torch.tensor([0.9, 1e-3, 1e-9])

    def judge(renders, targets):
        return values[: renders.shape[0]]

    reward = SVGFidelityReward(
        pool=pool, weights={"image": 0, "edge": 0, "judge": 1}, judge=judge, judge_log_floor=10.0
    )
    out = reward([TARGET, MOVED, BLUE], targets=_targets(3))
    expected = [1 + 2 * max(math.log(p), -10.0) / 10 for p in (0.9, 1e-3, 1e-9)]
    assert out.details["judge"].tolist() == pytest.approx(expected, abs=1e-6)
    assert expected[2] == -1.0 and expected[1] > -1.0  # below e^-10 the floor; above it, graded
    assert torch.equal(out.scores, out.details["judge"])
    with pytest.raises(ValueError, match="judge_log_floor"):
        SVGFidelityReward(pool=pool, weights={"judge": 1}, judge=judge, judge_log_floor=0.0)
