"""How a step draws its prompts: distinct prompts for the groups of group-advantage methods (as
flow_grpo's DistributedKRepeatSampler), with replacement for single samples (DDPO's random.choice)."""

from __future__ import annotations

import torch

from genalign.trainers.strategies.base import draw_indexed_groups, draw_pool_rows, draw_prompt_groups


def test_a_step_draws_distinct_prompts_for_its_groups_as_flow_grpo():
    for seed in range(50):
        rows = draw_pool_rows(5, 5, 4, torch.Generator().manual_seed(seed))
        assert sorted(rows.tolist()) == [0, 1, 2, 3, 4]  # randperm(5)[:5]: every prompt once
        assert len(set(draw_pool_rows(9, 4, 2, torch.Generator().manual_seed(seed)).tolist())) == 4
    # single samples (DDPO's random.choice) and pools smaller than the step: with replacement
    repeats = [
        len(set(draw_pool_rows(5, 5, 1, torch.Generator().manual_seed(s)).tolist())) < 5 for s in range(50)
    ]
    assert any(repeats)
    assert draw_pool_rows(2, 6, 4, torch.Generator().manual_seed(0)).numel() == 6
    # the two draws (prompt strings, pool rows) stay the same random calls
    pool = ["a", "b", "c", "d"]
    prompts, groups, seeds = draw_prompt_groups(pool, 3, 2, torch.Generator().manual_seed(7))
    rows, groups2, seeds2 = draw_indexed_groups(4, 3, 2, torch.Generator().manual_seed(7))
    assert prompts == [pool[i] for i in rows.tolist()] and len(set(prompts)) == 3
    assert torch.equal(groups, groups2) and torch.equal(seeds, seeds2)
