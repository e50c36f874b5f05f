"""benchmarks/toy_gradient_snr.py: its cosines and total variance against hand computations, and one
short run on the tiny NFT recipe with and without ``train.group_noise``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny"


@pytest.fixture(scope="module")
def snr(benchmark_module):
    return benchmark_module("toy_gradient_snr")


def test_cosines_and_variance_by_hand(snr):
    # g_1 = (1, 0), g_2 = (0, 1), g_3 = (1, 1): mean (2/3, 2/3)
    gradients = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0])]
    result = snr.signal_fraction(gradients)
    half = 1 / 2**0.5
    assert result["cosine_mean"] == pytest.approx((0.0 + half + half) / 3)
    # squared distances to the mean: 1/9 + 4/9, 4/9 + 1/9, 1/9 + 1/9 -> 12/9, over n - 1 = 2
    assert result["variance"] == pytest.approx(12 / 9 / 2)
    assert result["pairs"] == 3
    same = snr.signal_fraction([torch.tensor([2.0, -1.0])] * 4)
    assert same["variance"] == 0.0 and same["cosine_mean"] == pytest.approx(1.0)


def test_a_short_run_records_one_gradient_per_optimiser_step(snr, tmp_path, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path / "tiny-cache"))
    recipe = str(TINY / "nft_sd_jpeg.yaml")
    for grouped in ("false", "true"):
        gradients = snr.batch_gradients([f"train.group_noise={grouped}"], 2, recipe)
        # 2 steps x (8 samples in minibatches of 4) = 4 optimiser steps, each a finite, nonzero gradient
        assert len(gradients) == 4
        assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in gradients)
        assert snr.signal_fraction(gradients)["variance"] > 0
