"""The training budget the toy generators' recipes share (issue #22): each recipe's defaults, its
keywords by their old names, and loud failures for a keyword it does not take."""

from __future__ import annotations

from dataclasses import replace

import pytest

from genalign.toy.generators import (
    TrainBudget,
    train_ar_video,
    train_flow,
    train_lcm,
    train_sd,
    train_vae,
    train_video_vae,
)
from genalign.toy.generators.budget import recipe_budget
from genalign.toy.generators.flow import FLOW_BUDGET
from genalign.toy.generators.train import LCM_BUDGET, SD_BUDGET, VAE_BUDGET
from genalign.toy.generators.video import VIDEO_VAE_BUDGET
from genalign.toy.generators.video_train import AR_VIDEO_BUDGET

# the recipes' defaults as their signatures had them before the budget was written once
DEFAULTS = {
    "vae": (VAE_BUDGET, dict(steps=600, batch_size=16, lr=2e-3, num_examples=4000, log_every=100)),
    "sd": (
        SD_BUDGET,
        dict(steps=6000, batch_size=64, lr=5e-4, num_examples=30000, log_every=200, ema_decay=0.99),
    ),
    "lcm": (
        LCM_BUDGET,
        dict(steps=2000, batch_size=64, lr=2e-4, num_examples=20000, log_every=100, ema_decay=0.95),
    ),
    "flow": (
        FLOW_BUDGET,
        dict(steps=6000, batch_size=64, lr=5e-4, num_examples=30000, log_every=200, ema_decay=0.99),
    ),
    "video-vae": (VIDEO_VAE_BUDGET, dict(steps=600, batch_size=6, lr=1e-3, num_examples=1500, log_every=50)),
    "ar-video": (
        AR_VIDEO_BUDGET,
        dict(steps=4000, batch_size=16, lr=1e-3, num_examples=3000, log_every=100, ema_decay=0.995),
    ),
}


@pytest.mark.parametrize("name", DEFAULTS)
def test_each_recipe_keeps_its_defaults(name):
    budget, expected = DEFAULTS[name]
    assert budget == TrainBudget(**{"seed": 0, "max_minutes": None, "snapshot_every": None, **expected})


def test_keywords_override_a_budget_under_the_recipes_own_names():
    images = recipe_budget("train_sd", SD_BUDGET, {"steps": 3, "num_images": 8, "max_minutes": None})
    assert images == replace(SD_BUDGET, steps=3, num_examples=8)
    videos = recipe_budget("train_ar_video", AR_VIDEO_BUDGET, {"num_videos": 6}, data="num_videos")
    assert videos == replace(AR_VIDEO_BUDGET, num_examples=6)
    given = replace(SD_BUDGET, steps=10, lr=1.0)
    assert recipe_budget("train_sd", given, {"steps": 2}) == replace(given, steps=2)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: train_vae(stepz=3), "train_vae() got an unexpected keyword argument 'stepz'"),
        (lambda: train_vae(max_minutes=1.0), "train_vae() got an unexpected keyword argument 'max_minutes'"),
        (lambda: train_vae(ema_decay=0.9), "train_vae() got an unexpected keyword argument 'ema_decay'"),
        (lambda: train_vae(budget=SD_BUDGET), "train_vae() does not use a budget's ema_decay"),
        (lambda: train_sd(None, num_videos=3), "train_sd() got an unexpected keyword argument 'num_videos'"),
        (lambda: train_sd(None, num_examples=3), "unexpected keyword argument 'num_examples'"),
        (lambda: train_lcm(None, snapshot_every=2), "train_lcm() got an unexpected keyword argument"),
        (lambda: train_flow(None, ema_decay=None), "train_flow() needs a budget with an ema_decay"),
        (lambda: train_video_vae(num_images=3), "train_video_vae() got an unexpected keyword argument"),
        (lambda: train_video_vae(ema_decay=0.9), "train_video_vae() got an unexpected keyword argument"),
        (lambda: train_ar_video(None, "x", num_images=3), "train_ar_video() got an unexpected keyword"),
        (lambda: train_sd(None, None, 100), "positional argument"),
    ],
)
def test_a_keyword_a_recipe_does_not_take_fails_before_training(call, message):
    with pytest.raises(TypeError) as error:
        call()
    assert message in str(error.value)
