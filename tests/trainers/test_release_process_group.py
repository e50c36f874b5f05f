"""release_process_group: a finished multi-process run destroys its process group before exit."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist

from genalign.trainers.distributed import release_process_group


def _fake_accelerator(calls: list[str]):
    state = SimpleNamespace(
        destroy_process_group=lambda: (calls.append("destroy"), dist.destroy_process_group())
    )
    return SimpleNamespace(wait_for_everyone=lambda: calls.append("barrier"), state=state)


def test_a_live_group_is_destroyed_after_a_barrier(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    calls: list[str] = []
    try:
        assert dist.is_initialized()
        release_process_group(_fake_accelerator(calls))
        assert calls == ["barrier", "destroy"] and not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_without_a_group_it_does_nothing():
    calls: list[str] = []
    assert torch.distributed.is_available() and not dist.is_initialized()
    release_process_group(_fake_accelerator(calls))
    assert calls == []
