"""The within-prompt AUC of benchmarks/toy_reward_ranking.py against hand counts."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ranking(benchmark_module):
    return benchmark_module("toy_reward_ranking")


def test_auc_by_hand(ranking):
    # positives 3, 1 over negatives 2, 1: pairs (3>2) (3>1) (1<2) (1=1 half) -> 2.5 / 4
    assert ranking.auc([3.0, 1.0], [2.0, 1.0]) == pytest.approx(0.625)
    assert ranking.auc([1.0], [0.0]) == 1.0 and ranking.auc([0.0], [1.0]) == 0.0
    assert ranking.auc([], [1.0]) is None and ranking.auc([1.0], []) is None


def test_within_prompt_auc_uses_only_mixed_groups(ranking):
    rows = [
        # prompt a (position): the reward orders its samples right -> 1.0
        {"prompt": "a", "category": "position", "correct": True, "r": 0.9},
        {"prompt": "a", "category": "position", "correct": False, "r": 0.1},
        # prompt b (position): backwards -> 0.0; the category mean is 0.5 over 2 groups
        {"prompt": "b", "category": "position", "correct": True, "r": 0.2},
        {"prompt": "b", "category": "position", "correct": False, "r": 0.8},
        # prompt c: all correct, no information on order -> left out
        {"prompt": "c", "category": "colors", "correct": True, "r": 0.5},
        {"prompt": "c", "category": "colors", "correct": True, "r": 0.7},
    ]
    assert ranking.within_prompt_auc(rows, "r") == {"position": (0.5, 2)}
