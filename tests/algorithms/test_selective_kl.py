"""Astrolabe's selective KL (#26 item 3) against hand-computed arrays: ranks and ties, the rank
disagreement, the percentile selection, the fraction b's adaptation over its 20-step window and
its clipping, the reference's reset rule, and an exact state round-trip."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from genalign.algorithms import (
    SelectiveKLConfig,
    SelectiveKLState,
    kl_selection_threshold,
    observe_reference_kl,
    rank_disagreement,
    reset_reference_at_epoch,
    reward_ranks,
    select_kl_samples,
    selective_kl_reward_names,
    update_selection_fraction,
)

# main ranks [1..5]; other ranks [5, 4, 3, 2, 1] and [3, 1, 2, 5, 4] -> mean [4, 2.5, 2.5, 3.5, 2.5]
MAIN = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
OTHERS = [torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), torch.tensor([3.0, 5.0, 4.0, 1.0, 2.0])]
DISAGREEMENT = [-3.0, -0.5, 0.5, 0.5, 2.5]


# -- ranks ---------------------------------------------------------------------------------------------


def test_ranks_start_at_one_for_the_best():
    assert reward_ranks(torch.tensor([0.3, 0.9, 0.1])).tolist() == [2, 1, 3]


def test_tied_rewards_get_consecutive_ranks_earlier_sample_first():
    assert reward_ranks(torch.tensor([1.0, 2.0, 1.0, 2.0])).tolist() == [3, 1, 4, 2]
    assert reward_ranks(torch.full((4,), 7.0)).tolist() == [1, 2, 3, 4]


def test_rank_disagreement_by_hand():
    d = rank_disagreement(MAIN, OTHERS)
    assert d.tolist() == DISAGREEMENT
    assert d.sum().item() == 0.0  # ranks of every reward sum to the same total
    assert rank_disagreement(MAIN, OTHERS[:1]).tolist() == [-4.0, -2.0, 0.0, 2.0, 4.0]
    with pytest.raises(ValueError, match="at least one"):
        rank_disagreement(MAIN, [])


def test_reward_names_as_released():
    assert selective_kl_reward_names(["avg", "mq", "hpsv3", "ta"], "hpsv3") == (["mq", "ta"], "hpsv3")
    assert selective_kl_reward_names(["a", "avg", "b", "c", "main"], "main") == (["a", "b"], "main")
    assert selective_kl_reward_names(["avg", "mq", "hps"], "avg") == (["mq", "hps"], "avg")
    with pytest.raises(KeyError, match="main"):
        selective_kl_reward_names(["avg", "mq"], "main")


# -- percentile selection ------------------------------------------------------------------------------


def test_threshold_is_the_linear_percentile_of_the_non_negative_d():
    d = torch.tensor(DISAGREEMENT)
    # non-negative d sorted [0.5, 0.5, 2.5]; the 90th percentile sits at position 0.9 * 2 = 1.8
    assert kl_selection_threshold(d, 0.1) == pytest.approx(0.5 + 0.8 * 2.0)
    assert kl_selection_threshold(d, 0.2) == pytest.approx(0.5 + 0.6 * 2.0)
    # 98th of [0, 1, 2, 3, 4]: position 3.92
    assert kl_selection_threshold(torch.tensor([-10.0, 0, 1, 2, 3, 4]), 0.02) == pytest.approx(3.92)


def test_selection_from_the_initial_state():
    state, mask, info = select_kl_samples(SelectiveKLState.initial(), MAIN, OTHERS)
    assert mask.tolist() == [False, False, False, False, True]  # only d = 2.5 > 2.1
    assert state.fraction == 0.1 and state.history == pytest.approx([3.5 / 3])
    assert info["kl_selection_threshold"] == pytest.approx(2.1)
    assert info["kl_selected_fraction"] == 0.2


def test_selection_is_strictly_above_the_threshold():
    main = torch.tensor([7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0])  # ranks 1..7
    other = torch.tensor([6.0, 5.0, 4.0, 3.0, 7.0, 2.0, 1.0])  # ranks [2, 3, 4, 5, 1, 6, 7]
    d = rank_disagreement(main, [other])
    assert d.tolist() == [-1.0, -1.0, -1.0, -1.0, 4.0, 0.0, 0.0]
    # non-negative [4, 0, 0] sorted [0, 0, 4]: 90th percentile 0 + 0.8 * 4 = 3.2 -> only the 4
    _, mask, _ = select_kl_samples(SelectiveKLState.initial(), main, [other])
    assert mask.tolist() == [False] * 4 + [True, False, False]
    # d = [-1, 1]: the non-negative set is [1], its percentile is 1, and 1 > 1 is false
    _, mask, info = select_kl_samples(
        SelectiveKLState.initial(), torch.tensor([2.0, 1.0]), [torch.tensor([1.0, 2.0])]
    )
    assert info["kl_selection_threshold"] == 1.0 and mask.tolist() == [False, False]


def test_without_other_rewards_every_sample_is_selected_and_b_stays():
    state = SelectiveKLState.initial()
    new_state, mask, _ = select_kl_samples(state, MAIN, [])
    assert mask.tolist() == [True] * 5 and new_state == state


# -- the fraction b ------------------------------------------------------------------------------------


def _run_fractions(means, config=None):
    state, fractions = SelectiveKLState.initial(config), []
    for mean in means:
        state = update_selection_fraction(state, mean, config)
        fractions.append(state.fraction)
    return state, fractions


def test_b_grows_above_the_history_max_shrinks_below_its_min_and_holds_between():
    _, fractions = _run_fractions([1.0, 2.0, 1.5, 0.5, 0.5, 3.0])
    assert fractions == pytest.approx([0.1, 0.11, 0.11, 0.099, 0.099, 0.1089])


def test_b_is_clipped_to_its_bounds():
    _, up = _run_fractions([float(i) for i in range(12)])
    assert up == pytest.approx(
        [0.1, 0.11, 0.121, 0.1331, 0.14641, 0.161051, 0.1771561, 0.19487171] + [0.2] * 4
    )
    _, down = _run_fractions([float(-i) for i in range(30)])
    assert min(down) == 0.02 and down[-1] == 0.02
    assert down[:4] == pytest.approx([0.1, 0.09, 0.081, 0.0729])


def test_the_history_holds_the_last_20_means():
    # 10, 100, then nineteen 50s: the 10 leaves the window, so 20 is below its min (50) and b shrinks
    means = [10.0, 100.0] + [50.0] * 19 + [20.0]
    state, fractions = _run_fractions(means)
    assert len(state.history) == 20 and state.history[0] == 50.0 and state.history[-1] == 20.0
    assert fractions[-2] == pytest.approx(0.11) and fractions[-1] == pytest.approx(0.099)
    # with a 21-step window the 10 is still there and b holds
    _, fractions = _run_fractions(means, SelectiveKLConfig(history_length=21))
    assert fractions[-1] == pytest.approx(0.11)


def test_the_first_update_resets_b_to_its_base():
    state = update_selection_fraction(SelectiveKLState(fraction=0.17), 3.0)
    assert state.fraction == 0.1 and state.history == [3.0]


def test_step_functions_do_not_mutate_their_state():
    state = SelectiveKLState(fraction=0.12, history=[1.0, 2.0])
    frozen = dataclasses.replace(state, history=list(state.history))
    update_selection_fraction(state, 5.0)
    select_kl_samples(state, MAIN, OTHERS)
    observe_reference_kl(state, 1.0)
    reset_reference_at_epoch(state, 40)
    assert state == frozen


# -- the lagging reference -----------------------------------------------------------------------------


def test_a_kl_above_the_threshold_marks_a_reset():
    state = SelectiveKLState.initial()
    assert not observe_reference_kl(state, 0.15).reset_pending  # strictly above
    marked = observe_reference_kl(state, 0.151)
    assert marked.reset_pending and observe_reference_kl(marked, 0.0).reset_pending


def test_reset_rules():
    pending = dataclasses.replace(SelectiveKLState.initial(), reset_pending=True)
    # epoch 0 never resets on the flag
    assert reset_reference_at_epoch(pending, 0) == (pending, False)
    # a quick reset (gap 3 < 5): min(0.15 + 0.01, 0.05) = 0.05, as released
    state, reset = reset_reference_at_epoch(pending, 3)
    assert reset and state.kl_threshold == 0.05 and state.last_reset_epoch == 3 and not state.reset_pending
    # a flagged reset with 5 <= gap <= 15 keeps the threshold
    state, reset = reset_reference_at_epoch(dataclasses.replace(pending, last_reset_epoch=2), 12)
    assert reset and state.kl_threshold == 0.15 and state.last_reset_epoch == 12
    # no flag: nothing until more than 15 epochs have passed, then the threshold drops by 0.01
    idle = SelectiveKLState.initial()
    assert reset_reference_at_epoch(idle, 15) == (idle, False)
    state, reset = reset_reference_at_epoch(idle, 16)
    assert reset and state.kl_threshold == pytest.approx(0.14) and state.last_reset_epoch == 16
    # ... to no less than 0.1 (which also lifts a threshold of 0.05 back to 0.1)
    low = dataclasses.replace(idle, kl_threshold=0.05)
    assert reset_reference_at_epoch(low, 16)[0].kl_threshold == 0.1


def test_the_cap_of_a_quick_reset_is_a_setting():
    pending = dataclasses.replace(SelectiveKLState.initial(), reset_pending=True)
    state, _ = reset_reference_at_epoch(pending, 2, SelectiveKLConfig(kl_threshold_cap=0.2))
    assert state.kl_threshold == pytest.approx(0.16)


# -- checkpoint and resume -----------------------------------------------------------------------------


def _epoch(state, epoch, generator):
    state, reset = reset_reference_at_epoch(state, epoch)
    rewards = torch.rand(3, 12, generator=generator)
    state, mask, _ = select_kl_samples(state, rewards[0], [rewards[1], rewards[2]])
    for _ in range(2):  # two optimiser steps
        state = observe_reference_kl(state, float(torch.rand(1, generator=generator)) * 0.2)
    return state, (reset, mask.tolist(), state.fraction, state.kl_threshold)


def test_state_round_trip_resumes_exactly():
    generator = torch.Generator().manual_seed(0)
    state, straight = SelectiveKLState.initial(), []
    for epoch in range(40):
        state, record = _epoch(state, epoch, generator)
        straight.append(record)
        if epoch == 17:
            saved, rng = json.dumps(state.state_dict()), generator.get_state()
    resumed = SelectiveKLState()
    resumed.load_state_dict(json.loads(saved))
    generator.set_state(rng)
    records = []
    for epoch in range(18, 40):
        resumed, record = _epoch(resumed, epoch, generator)
        records.append(record)
    assert records == straight[18:] and resumed == state
    assert any(r[0] for r in straight) and len({r[2] for r in straight}) > 1  # resets and b moved
    with pytest.raises(KeyError, match="history"):
        SelectiveKLState().load_state_dict({"fraction": 0.1})
