"""``svg_render``: an image reward on each SVG's render (genalign.rewards.svg.rendered)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genalign.rewards import Reward, RewardOutput, load_reward
from genalign.rewards.svg import render_local

RED_SQUARE = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect x="4" y="4" width="12" height="12" fill="#ff0000"/></svg>'
BLUE_CIRCLE = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><circle cx="16" cy="16" r="10" fill="#0000ff"/></svg>'
BLANK = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"></svg>'
HOSTILE = '<!DOCTYPE svg [<!ENTITY a "aaaaaaaaaa">]><svg xmlns="http://www.w3.org/2000/svg">&a;</svg>'
BROKEN = "<svg><rect"
CIRCLE_ELEMENT = BLUE_CIRCLE[BLUE_CIRCLE.index("<circle") : BLUE_CIRCLE.index("</svg>")]  # one more shape


class Redness(Reward):
    """Mean of (red - blue) over the image, plus the prompt's length / 100; records its calls."""

    name = "redness"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, list[str], dict]] = []

    def score(self, images, prompts, **metadata):
        self.calls.append((images.shape[0], list(prompts), metadata))
        value = (images[:, 0] - images[:, 2]).mean(dim=(1, 2)) + torch.tensor([len(p) / 100 for p in prompts])
        return RewardOutput(value, {"red": images[:, 0].mean(dim=(1, 2)), "note": "not per sample"})


def test_scores_are_the_image_reward_of_each_render():
    inner = Redness()
    reward = load_reward("svg_render", reward=inner, canvas=32)
    svgs, prompts = [RED_SQUARE, BLUE_CIRCLE], ["a red square", "a blue circle"]
    out = reward(svgs, prompts)
    # independently: render in this process and score the pixels by hand
    pixels = torch.stack([render_local(svg, 32, 32).image for svg in svgs])
    expected = (pixels[:, 0] - pixels[:, 2]).mean(dim=(1, 2)) + torch.tensor([0.12, 0.13])
    assert torch.allclose(out.scores, expected, atol=1e-6)
    assert out.scores[0] > 0.12 > out.scores[1]  # red pays, blue costs
    assert torch.allclose(out.details["image/red"], pixels[:, 0].mean(dim=(1, 2)), atol=1e-6)
    assert "image/note" not in out.details  # only per-sample tensors are carried
    assert out.details["failure_count"] == 0
    assert out.details["rendered"].tolist() == [1.0, 1.0]


def test_svgs_that_do_not_render_score_the_floor_and_are_never_shown_to_the_image_reward():
    inner = Redness()
    reward = load_reward("svg_render", reward=inner, min_reward=-2.0)
    svgs = [BROKEN, RED_SQUARE, HOSTILE, BLANK, "", BLUE_CIRCLE]
    out = reward(svgs, [f"p{i}" for i in range(len(svgs))])
    assert out.scores[[0, 2, 3, 4]].tolist() == [-2.0] * 4
    assert (out.scores[[1, 5]] > -2.0).all()
    assert out.details["rendered"].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert out.details["failure_count"] == 4
    assert out.details["failure"][3] == "blank" and out.details["failure"][1] is None
    assert out.details["image/red"][[0, 2, 3, 4]].tolist() == [0.0] * 4
    ((batch, prompts, _),) = inner.calls
    assert batch == 2 and prompts == ["p1", "p5"]  # the image reward saw the renders that worked


def test_an_all_failed_batch_never_calls_the_image_reward():
    inner = Redness()
    out = load_reward("svg_render", reward=inner)([BROKEN, BLANK], ["a", "b"])
    assert out.scores.tolist() == [-1.0, -1.0] and not inner.calls


def test_only_the_named_metadata_reaches_the_image_reward_row_by_row():
    inner = Redness()
    reward = load_reward("svg_render", reward=inner, metadata_keys=["specs"])
    specs = [{"k": 0}, {"k": 1}, {"k": 2}]
    targets = torch.zeros(3, 3, 32, 32)
    reward([RED_SQUARE, BROKEN, BLUE_CIRCLE], ["a", "b", "c"], specs=specs, targets=targets)
    ((_, _, metadata),) = inner.calls
    assert metadata == {"specs": [{"k": 0}, {"k": 2}]}
    with pytest.raises(ValueError, match=r"metadata_keys \['specs'\]"):
        reward([RED_SQUARE], ["a"])


def test_a_registered_image_reward_loads_by_name_and_the_toy_verifier_judges_renders():
    from genalign.toy.svg_tasks import toy_svg_pool

    pool = toy_svg_pool(count=6, seed=3, split="rl_train", svg_style="canonical", specs=True)
    wrapped = load_reward("svg_render", reward={"name": "shapes_eval", "kwargs": {}}, metadata_keys=["specs"])
    direct = load_reward("toy_svg_verifier", mode="correct")
    svgs = pool.metadata["reference_svgs"]
    out = wrapped(svgs, list(pool), specs=pool.metadata["specs"])
    assert torch.equal(out.scores, direct(svgs, list(pool), specs=pool.metadata["specs"]).scores)
    assert (
        load_reward("svg_render", reward="jpeg_compressibility").image_reward.name == "jpeg_compressibility"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reward": "keyword", "kwargs": {"keywords": ["svg"]}}, "scores text, not images"),
        ({"reward": "svg_fidelity"}, "scores svg, not images"),
        ({"reward": "jpeg_compressibility", "canvas": 0}, "canvas must be"),
        ({"reward": "jpeg_compressibility", "canvas": (32,)}, "canvas must be"),
        ({"reward": "jpeg_compressibility", "min_reward": float("nan")}, "min_reward must be finite"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_reward("svg_render", **kwargs)


def test_the_length_term_charges_svgs_longer_than_the_reference_by_hand():
    inner = Redness()
    plain = load_reward("svg_render", reward=inner)
    reward = load_reward("svg_render", reward=inner, length_weight=2.0, length_margin=0.1)
    hedge = RED_SQUARE.replace("</svg>", BLUE_CIRCLE[BLUE_CIRCLE.index("<circle") :])  # two objects
    svgs, prompts = [RED_SQUARE, hedge, BROKEN], ["a red square"] * 3
    references = [RED_SQUARE] * 3
    out = reward(svgs, prompts, reference_svgs=references)
    base = plain(svgs, prompts).scores
    ref = len(RED_SQUARE)
    by_hand = [1.0, 1.0 - (max(0.0, len(hedge) - 1.1 * ref) / ref) ** 2]
    assert len(hedge) > 1.1 * ref and by_hand[1] < 1.0
    assert torch.allclose(out.details["length"][:2], torch.tensor(by_hand), atol=1e-6)
    assert torch.allclose(out.scores[:2], base[:2] + 2.0 * torch.tensor(by_hand), atol=1e-5)
    # a failed render gets the floor of both parts: below any SVG that renders, however long
    assert out.scores[2] == -1.0 - 2.0 and out.details["length"][2] == -1.0
    far_too_long = RED_SQUARE.replace("</svg>", CIRCLE_ELEMENT * 6 + "</svg>")
    long_out = reward([far_too_long, BROKEN], ["a red square"] * 2, reference_svgs=references[:2])
    assert long_out.details["rendered"].tolist() == [1.0, 0.0]
    assert long_out.details["length"][0] == -1.0 and long_out.scores[0] > long_out.scores[1]
    with pytest.raises(ValueError, match="needs metadata `reference_svgs`"):
        reward(svgs, prompts)


def test_the_absolute_length_term_charges_both_sides_linearly_by_hand():
    inner = Redness()
    reward = load_reward(
        "svg_render", reward=inner, length_weight=1.0, length_margin=0.05, length_form="absolute"
    )
    one, two, three = (RED_SQUARE.replace("</svg>", CIRCLE_ELEMENT * k + "</svg>") for k in (0, 1, 2))
    svgs, references = [one, two, three, one, BROKEN], [two, two, two, three, two]
    out = reward(svgs, ["a red square"] * 5, reference_svgs=references)

    def by_hand(length, ref):
        return max(-1.0, 1.0 - max(0.0, abs(length - ref) - 0.05 * ref) / ref)

    expected = [by_hand(len(s), len(r)) for s, r in zip(svgs[:4], references[:4], strict=True)]
    assert expected[1] == 1.0 and expected[0] < 1.0 and expected[2] < 1.0  # shorter and longer both lose
    assert abs((1 - expected[2]) - len(CIRCLE_ELEMENT) / len(two)) < 0.06  # linear: about one shape's share
    assert torch.allclose(out.details["length"][:4], torch.tensor(expected), atol=1e-6)
    assert out.details["length"][4] == -1.0
    plain = load_reward("svg_render", reward=inner)(svgs, ["a red square"] * 5).scores
    assert torch.allclose(out.scores, plain + out.details["length"], atol=1e-5)


@pytest.mark.parametrize(
    ("key", "value"), [("length_weight", -1.0), ("length_margin", float("inf")), ("length_form", "cubic")]
)
def test_bad_length_settings_are_one_line_errors(key, value):
    with pytest.raises(ValueError, match=key):
        load_reward("svg_render", reward="jpeg_compressibility", **{key: value})


WRITER = Path(__file__).resolve().parents[2] / "assets" / "models" / "toy-svg-writer-t2s"


def test_the_length_term_counts_a_named_tokenizers_tokens_by_hand():
    """RLRF's unit: ``length_tokenizer`` (a recipe key) counts the tokens of the SVG, here in the toy
    writer's tokenizer (whole SVG pieces and colours are single tokens), not characters."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(WRITER)

    def tokens(svg: str) -> int:
        return len(tokenizer(svg, add_special_tokens=False)["input_ids"])

    inner = Redness()
    reward = load_reward(
        "svg_render", reward=inner, length_weight=1.0, length_margin=0.1, length_tokenizer=str(WRITER)
    )
    one, three = (RED_SQUARE.replace("</svg>", CIRCLE_ELEMENT * k + "</svg>") for k in (0, 2))
    out = reward([one, three], ["a red square"] * 2, reference_svgs=[one, one])
    assert tokens(one) < len(one)  # the unit differs
    ref = tokens(one)
    by_hand = [1.0, max(-1.0, 1.0 - (max(0.0, tokens(three) - 1.1 * ref) / ref) ** 2)]
    in_characters = max(-1.0, 1.0 - (max(0.0, len(three) - 1.1 * len(one)) / len(one)) ** 2)
    assert by_hand[1] != pytest.approx(in_characters)  # the test tells the units apart
    assert torch.allclose(out.details["length"], torch.tensor(by_hand), atol=1e-6)
    fidelity = load_reward("svg_fidelity", weights={"length": 1.0}, length_tokenizer=str(WRITER))
    assert fidelity.length_fn(three) == tokens(three)


def test_a_bad_length_tokenizer_is_a_one_line_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="length_tokenizer .*missing-folder does not exist"):
        load_reward(
            "svg_render", reward="jpeg_compressibility", length_tokenizer=str(tmp_path / "missing-folder")
        )
    with pytest.raises(FileNotFoundError, match="holds no tokenizer"):
        load_reward("svg_render", reward="jpeg_compressibility", length_tokenizer=str(tmp_path))
    with pytest.raises(ValueError, match="length_fn or length_tokenizer"):
        load_reward("svg_fidelity", length_fn=len, length_tokenizer=str(WRITER))
