"""Top-k / top-p truncation against hand-computed sets and an independent numpy reading."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genalign.algorithms import truncate_logits, truncation_mask, validate_truncation


def numpy_keep(logits: np.ndarray, top_k: int | None, top_p: float | None) -> np.ndarray:
    """The kept set of one row, written from the definitions: the k largest (ties kept), then the
    most probable tokens of the renormalised top-k softmax until their mass reaches p."""
    keep = np.isfinite(logits)
    if top_k is not None and top_k < len(logits):
        kth = np.sort(logits)[::-1][top_k - 1]
        keep &= logits >= kth
    if top_p is not None and top_p < 1:
        probs = np.where(keep, np.exp(logits - logits[keep].max()), 0.0)
        probs /= probs.sum()
        mass, kept = 0.0, np.zeros_like(keep)
        for i in sorted(range(len(logits)), key=lambda j: (-probs[j], j)):
            if mass >= top_p:
                break
            kept[i] = True
            mass += probs[i]
        keep &= kept
    return keep


def test_hand_computed_sets():
    # probabilities 0.5, 0.25, 0.125, 0.125
    logits = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125]))
    assert truncation_mask(logits, top_p=0.5).tolist() == [True, False, False, False]
    assert truncation_mask(logits, top_p=0.6).tolist() == [True, True, False, False]
    assert truncation_mask(logits, top_p=0.75).tolist() == [True, True, False, False]
    assert truncation_mask(logits, top_p=0.76).tolist() == [
        True,
        True,
        True,
        False,
    ]  # stable order at the tie
    assert truncation_mask(logits, top_k=1).tolist() == [True, False, False, False]
    assert truncation_mask(logits, top_k=3).tolist() == [True, True, True, True]  # the tie at rank 3 kept
    # top-p on the top-k distribution renormalised: 0.5 / 0.75 = 2/3 of the mass
    assert truncation_mask(logits, top_k=2, top_p=0.6).tolist() == [True, False, False, False]
    assert truncation_mask(logits, top_k=2, top_p=0.7).tolist() == [True, True, False, False]
    assert truncation_mask(logits, top_p=1.0).all()


def test_against_numpy_on_random_rows():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=generator) * 2
    for top_k, top_p in [(None, 0.9), (5, None), (10, 0.7), (50, 0.3), (None, 0.05), (1, 0.99)]:
        mask = truncation_mask(logits, top_k, top_p)
        expected = np.stack([numpy_keep(row.double().numpy(), top_k, top_p) for row in logits])
        np.testing.assert_array_equal(mask.numpy(), expected, err_msg=f"top_k={top_k} top_p={top_p}")


def test_shapes_chunks_and_suppressed_tokens(monkeypatch):
    import genalign.algorithms.token_truncation as module

    logits = torch.randn(3, 7, 11, generator=torch.Generator().manual_seed(1))
    logits[..., 4] = float("-inf")  # a suppressed token is never kept
    whole = truncation_mask(logits, top_k=6, top_p=0.8)
    monkeypatch.setattr(module, "_CHUNK_ELEMENTS", 25)  # two rows per sort
    assert torch.equal(truncation_mask(logits, top_k=6, top_p=0.8), whole)
    assert whole.shape == logits.shape and not whole[..., 4].any()
    assert (whole.sum(-1) >= 1).all()


def test_truncate_logits_keeps_the_given_token_and_its_gradient():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]])).requires_grad_(True)
    out = truncate_logits(logits, top_p=0.5, keep=torch.tensor([2]))
    assert torch.isfinite(out).tolist() == [[True, False, True, False]]
    log_probs = torch.log_softmax(out, dim=-1)
    # the kept token renormalised over {0, 2}: 0.15 / 0.65
    assert log_probs[0, 2].item() == pytest.approx(np.log(0.15 / 0.65), abs=1e-6)
    log_probs[0, 2].backward()
    assert logits.grad[0, 1] == 0 and logits.grad[0, 3] == 0 and logits.grad[0, 0] != 0
    untouched = torch.randn(2, 5)
    assert truncate_logits(untouched) is untouched
    assert truncate_logits(untouched, top_p=1.0) is untouched


def test_bad_settings_are_refused():
    for top_k, top_p in [(0, None), (2.5, None), (True, None), (None, 0.0), (None, 1.5), (None, "0.9")]:
        with pytest.raises(ValueError, match="top_k|top_p"):
            validate_truncation(top_k, top_p)
