"""toy-scene-judge (genalign/toy/reward_models/scene_judge.py): the pair loss against a hand
computation, a short training run, its folder and card, and the evaluation's fields."""

from __future__ import annotations

import json
import math

import pytest
import torch

from genalign.rewards.svg.judge import PairJudge, load_pair_judge
from genalign.toy.reward_models import scene_judge
from genalign.toy.reward_models.similarity import VIEWS


def test_pair_loss_is_weighted_bce_over_the_four_pairs():
    torch.manual_seed(0)
    judge = PairJudge(width=8, embed=16, hidden=16)
    views = {k: torch.rand(3, 3, 32, 32) for k in VIEWS}
    loss, accuracy = scene_judge.pair_loss(judge, views)
    e = {k: judge.embed(v) for k, v in views.items()}
    pairs = [("ref", "same", 1.0, 1.0), ("ref", "edit1", 0.0, 1 / 3), ("same", "edit1", 0.0, 1 / 3)]
    pairs.append(("ref", "edit2", 0.0, 1 / 3))
    total, right = 0.0, {}
    for a, b, label, weight in pairs:
        p = torch.sigmoid(judge.compare(e[a], e[b]))
        total += weight * -(label * p.log() + (1 - label) * (1 - p).log()).sum().item()
        right[(a, b)] = ((p > 0.5).float() == label).float()
    assert loss.item() == pytest.approx(total / 6, rel=1e-5)  # positives and negatives weigh n each
    assert accuracy["acc_same"] == pytest.approx(right[("ref", "same")].mean().item())
    edit1 = torch.cat([right[("ref", "edit1")], right[("same", "edit1")]])
    assert accuracy["acc_edit1"] == pytest.approx(edit1.mean().item())


def test_a_short_run_saves_a_loadable_judge_with_its_card(tmp_path):
    recipe = scene_judge.JudgeRecipe(scenes=12, steps=6, batch_size=4, width=8, embed=16, hidden=16, warmup=2)
    views = scene_judge.render_views(12, 0, "train", 32, recipe.shift, recipe.scale)
    uint8 = {k: (v * 255).round().to(torch.uint8) for k, v in views.items()}
    judge, history = scene_judge.train_judge(recipe, uint8)
    assert len(history) == 6 and all(math.isfinite(h["loss"]) for h in history)
    judge.config.update(shift=recipe.shift, scale=recipe.scale)
    scores = scene_judge.evaluate_judge(judge, items=4, splits={"rl_heldout": 1})
    assert set(scores["rl_heldout"]) == {"same", "edit1", "edit2", "auc_same_vs_edit1", "f1_mae"}
    folder = scene_judge.save_judge(judge, recipe, tmp_path / "judge", scores)
    card = json.loads((folder / "card.json").read_text())
    assert card["recipe"]["steps"] == 6 and card["scores"] == scores
    assert "| rl_heldout |" in (folder / "README.md").read_text()
    loaded = load_pair_judge(folder)
    a, b = views["ref"][:2], views["edit1"][:2]
    assert torch.allclose(loaded.probability(a, b), judge.probability(a, b))


def test_cli_names_an_unknown_field(capsys):
    with pytest.raises(SystemExit):
        scene_judge.main(["--out", "x", "--set", "stepz=3"])
    assert "unknown field 'stepz'" in capsys.readouterr().err
    for argv, message in (
        (["--set", "steps=many"], "'many' is not a valid int"),
        (["--set", "target=both"], "target must be 'same' or 'f1'"),
        (["--views", "no/such/file.pt"], "no/such/file.pt: no such file"),
    ):
        with pytest.raises(SystemExit):
            scene_judge.main(["--out", "x", *argv])
        assert message in capsys.readouterr().err


def test_multiset_f1_by_hand():
    a = [("circle", "red"), ("square", "blue")]
    assert scene_judge.multiset_f1(a, a) == 1.0
    assert scene_judge.multiset_f1(a, [("circle", "red"), ("square", "green")]) == 0.5
    assert scene_judge.multiset_f1(a, [("circle", "red")]) == pytest.approx(2 / 3)
    assert scene_judge.multiset_f1([("circle", "red")] * 2, [("circle", "red")]) == pytest.approx(2 / 3)
    assert scene_judge.multiset_f1(a, [("triangle", "red")]) == 0.0


def test_f1_views_match_the_plain_views_and_their_scenes():
    plain = scene_judge.render_views(6, 3, "train", 32, 0.15, 0.25)
    graded = scene_judge.render_views_f1(6, 3, "train", 32, 0.15, 0.25)
    assert all(torch.equal(plain[k], graded[k]) for k in VIEWS)  # the same items, one RNG stream
    f1 = graded["f1"]
    assert f1.shape == (6, 5) and (f1[:, 0] == 1).all()  # ref and same hold the same objects
    assert (f1[:, 1:3] < 1).all() and (f1[:, 3] < 1).all()  # an edit always changes the multiset
    assert torch.equal(f1[:, 1], f1[:, 2])  # ref and same are one scene


def test_f1_target_trains_on_soft_labels():
    torch.manual_seed(0)
    judge = PairJudge(width=8, embed=16, hidden=16)
    views = {k: torch.rand(3, 3, 32, 32) for k in VIEWS}
    views["f1"] = torch.tensor([[1.0, 0.5, 0.5, 0.0, 0.5]] * 3)
    loss, stats = scene_judge.pair_loss(judge, views)
    e = {k: judge.embed(views[k]) for k in VIEWS}
    p = torch.stack([torch.sigmoid(judge.compare(e[a], e[b])) for a, b in scene_judge.F1_PAIRS], dim=1)
    t = views["f1"]
    by_hand = -(t * p.log() + (1 - t) * (1 - p).log()).mean()
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)
    assert stats["f1_mae"] == pytest.approx((p - t).abs().mean().item(), rel=1e-5)
    recipe = scene_judge.JudgeRecipe(target="f1", steps=1, width=8, embed=16, hidden=16)
    with pytest.raises(ValueError, match="needs views with an 'f1' entry"):
        scene_judge.train_judge(recipe, {k: v for k, v in views.items() if k != "f1"})
    with pytest.raises(ValueError, match="target must be"):
        scene_judge.train_judge(scene_judge.JudgeRecipe(target="both"), views)
