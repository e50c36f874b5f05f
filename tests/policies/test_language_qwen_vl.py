"""The language family on the tiny Qwen2.5-VL (and Qwen2-VL): 3-D rotary positions computed by the model in the
re-scoring forward, packed ``pixel_values`` kept per sample so ``select`` slices them, images of
different sizes in one left-padded batch, LoRA's reference, and loading from a folder."""

from __future__ import annotations

import pytest
import torch

import genalign.policies.language_sampling as language_sampling
from genalign.policies import LanguagePolicy, LoRASpec, load_policy
from genalign.policies.language_vision import (
    forward_position_inputs,
    has_multimodal_positions,
    pack_model_inputs,
    repeat_images,
    split_packed_inputs,
)
from genalign.tiny.language import llava_vlm, qwen2_lm, qwen2_vl, qwen25_vl

PROMPTS = ["a red circle", "two big blue squares to the left of a green triangle"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def images() -> list[torch.Tensor]:
    """Two images of different sizes: grids (1, 8, 8) and (1, 6, 10), 16 and 15 image tokens."""
    generator = torch.Generator().manual_seed(0)
    return [torch.rand(3, 32, 32, generator=generator), torch.rand(3, 24, 40, generator=generator)]


@pytest.fixture(params=[qwen25_vl, qwen2_vl], ids=["qwen2.5-vl", "qwen2-vl"])
def build(request):
    """The tiny Qwen2.5-VL or Qwen2-VL builder (same positions and packing, other vision towers)."""
    return request.param


def vl_policy(lora: bool = True, train: bool = True, build=qwen25_vl) -> LanguagePolicy:
    model, processor = build(seed=0)
    spec = LoRASpec(rank=4, target_modules=TARGETS) if lora else None
    policy = LanguagePolicy(model, processor, lora=spec, train=train)
    if lora:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():  # LoRA's B starts at zero: give the adapters an effect
            for name, parameter in policy.model.named_parameters():
                if "lora_B" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return policy


def rollout(policy: LanguagePolicy, **kwargs):
    options = {"group_size": 2, "generator": 0, "max_new_tokens": 10, "temperature": 0.9}
    return policy.rollout(PROMPTS, images=images(), **(options | kwargs))


def test_the_tiny_model_has_multimodal_positions_and_packed_images():
    policy = vl_policy(lora=False, train=False)
    assert policy.multimodal_positions and policy.is_vlm
    assert not has_multimodal_positions(qwen2_lm()[0]) and not has_multimodal_positions(llava_vlm()[0])
    trajectory = rollout(policy)
    grid = trajectory.model_inputs["image_grid_thw"]
    assert grid.tolist() == [[1, 8, 8], [1, 8, 8], [1, 6, 10], [1, 6, 10]]
    patches = trajectory.model_inputs["pixel_values"]
    assert isinstance(patches, list) and [p.shape[0] for p in patches] == [64, 64, 60, 60]
    assert trajectory.attention_mask[:2, 0].tolist() == [0, 0]  # the short prompt is left-padded
    image_id = policy.model.config.image_token_id
    assert not (trajectory.completion_ids == image_id).any()  # placeholders are never sampled


def test_recomputed_log_probs_equal_a_fresh_forward_exactly(build):
    policy = vl_policy(build=build)
    trajectory = rollout(policy)
    log_probs = policy.log_prob(trajectory)
    assert log_probs.requires_grad
    assert (torch.exp(log_probs.detach() - trajectory.log_probs) - 1).abs().max().item() == 0.0
    assert (trajectory.completion_mask.sum(dim=1) > 1).all()


def test_recomputed_log_probs_are_what_generate_sampled_from(monkeypatch, build):
    """The full-sequence forward's log-probs equal those of the logits ``generate`` drew each token
    from (prefill with 3-D positions and left padding, then the KV cache with rope deltas)."""
    policy = vl_policy(build=build)
    seen = []
    draw = language_sampling.gumbel_max_tokens

    def recording(logits, temperature, generators):
        tokens = draw(logits, temperature, generators)
        taken = torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, tokens[:, None])
        seen.append(taken[:, 0])
        return tokens

    monkeypatch.setattr(language_sampling, "gumbel_max_tokens", recording)
    trajectory = rollout(policy, temperature=1.2)
    sampled = torch.stack(seen, dim=1) * trajectory.completion_mask
    torch.testing.assert_close(trajectory.log_probs, sampled, atol=2e-5, rtol=0)


def test_one_dimensional_positions_would_give_other_log_probs(build):
    """Guards the bug: re-scoring with the plain LMs' ``cumsum(mask) - 1`` positions (each image
    token one position) is not what the model sampled from."""
    policy = vl_policy(build=build)
    trajectory = rollout(policy)
    policy.multimodal_positions = False  # as if detected as a plain LM: 1-D positions
    with torch.no_grad():
        wrong = policy.log_prob(trajectory)
    assert (wrong - trajectory.log_probs).abs().max().item() > 1e-3


def test_select_slices_the_packed_images_with_their_rows(build):
    policy = vl_policy(build=build)
    trajectory = rollout(policy)
    rows = [3, 0]
    sub = trajectory.select(rows)
    assert sub.model_inputs["image_grid_thw"].tolist() == [[1, 6, 10], [1, 8, 8]]
    assert [p.shape[0] for p in sub.model_inputs["pixel_values"]] == [60, 64]
    assert torch.equal(sub.model_inputs["pixel_values"][0], trajectory.model_inputs["pixel_values"][3])
    with torch.no_grad():
        log_probs = policy.log_prob(sub)
    torch.testing.assert_close(log_probs, trajectory.log_probs[rows], atol=1e-6, rtol=0)
    one = trajectory.select([2])  # the other image size alone, no left padding needed
    with torch.no_grad():
        torch.testing.assert_close(policy.log_prob(one), trajectory.log_probs[[2]], atol=1e-6, rtol=0)


def test_a_sample_is_the_same_alone_as_in_a_batch_of_two_image_sizes(build):
    policy = vl_policy(lora=False, train=False, build=build)
    seeds = torch.tensor([11, 12])
    both = policy.rollout(PROMPTS, seeds=seeds, images=images(), max_new_tokens=10)
    for b, prompt in enumerate(PROMPTS):
        alone = policy.rollout([prompt], seeds=seeds[b : b + 1], images=[images()[b]], max_new_tokens=10)
        length = alone.completion_length
        assert torch.equal(alone.completion_ids[0], both.completion_ids[b, :length])
        torch.testing.assert_close(alone.log_probs[0], both.log_probs[b, :length], atol=2e-5, rtol=0)


def test_reference_under_lora_is_the_base_model():
    policy = vl_policy()
    trajectory = rollout(policy, generator=1)
    base = LanguagePolicy(*qwen25_vl(seed=0), lora=None, train=False)
    with torch.no_grad():
        expected = base.log_prob(trajectory)
        with policy.reference():
            reference = policy.log_prob(trajectory)
        adapted = policy.log_prob(trajectory)
    assert torch.equal(reference, expected)
    assert not torch.allclose(adapted, expected)
    assert torch.equal(adapted, trajectory.log_probs)


def test_a_gradient_step_reaches_the_vision_tower_under_full_fine_tuning():
    policy = vl_policy(lora=False)
    trajectory = rollout(policy, group_size=1)
    loss = -policy.log_prob(trajectory).sum()
    loss.backward()
    grads = {n: p.grad for n, p in policy.model.named_parameters() if "visual" in n}
    assert grads and any(g is not None and g.abs().sum() > 0 for g in grads.values())
    with policy.reference():
        assert torch.equal(policy.log_prob(trajectory).detach(), trajectory.log_probs)


def test_text_only_prompts_use_real_token_positions():
    """Without images the model would count positions over padding; the policy passes the real-
    token positions, as ``generate`` uses (with 1-D rotary positions a per-row shift changes
    nothing but rounding, so the helper's choice is checked directly), the ratio is 1 and padding
    changes nothing."""
    policy = vl_policy(lora=False, train=False)
    seeds = torch.tensor([5, 6])
    both = policy.rollout(PROMPTS, seeds=seeds, max_new_tokens=8)
    assert "position_ids" in forward_position_inputs(True, both.input_ids, both.attention_mask, {})
    assert torch.equal(policy.log_prob(both), both.log_probs)
    alone = policy.rollout(PROMPTS[:1], seeds=seeds[:1], max_new_tokens=8)
    length = alone.completion_length
    assert torch.equal(alone.completion_ids[0], both.completion_ids[0, :length])
    torch.testing.assert_close(alone.log_probs[0], both.log_probs[0, :length], atol=2e-5, rtol=0)


def test_packing_helpers_round_trip_and_name_bad_input():
    grid = torch.tensor([[1, 2, 2], [1, 2, 4]])
    packed = torch.arange(12.0)[:, None]
    split = split_packed_inputs({"pixel_values": packed, "image_grid_thw": grid}, 2)
    assert [p.shape[0] for p in split["pixel_values"]] == [4, 8]
    assert torch.equal(pack_model_inputs(split, "cpu")["pixel_values"], packed)
    with pytest.raises(ValueError, match="image_grid_thw holds 2 images for 3 samples"):
        split_packed_inputs({"pixel_values": packed, "image_grid_thw": grid}, 3)
    with pytest.raises(ValueError, match="pixel_values has 11 rows"):
        split_packed_inputs({"pixel_values": packed[:11], "image_grid_thw": grid}, 2)
    with pytest.raises(ValueError, match="images holds 1 images for 2 prompts"):
        repeat_images([torch.zeros(3, 8, 8)], 2, 1)
    with pytest.raises(ValueError, match=r"\[3, H, W\] tensor, got \(8, 8\)"):
        repeat_images([torch.zeros(8, 8)], 1, 1)


def test_loads_from_a_tiny_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path))
    policy = load_policy("language", "tiny:qwen25_vl", lora=None, train=False)
    assert policy.multimodal_positions and type(policy.model).__name__.startswith("Qwen2_5_VL")
    assert load_policy("language", "tiny:qwen2_vl", lora=None, train=False).multimodal_positions
    built = LanguagePolicy(*qwen25_vl(seed=0), lora=None, train=False)
    trajectory = rollout(policy)
    with torch.no_grad():
        assert torch.equal(built.log_prob(trajectory), trajectory.log_probs)


def test_the_builders_are_seeded_round_trip_and_name_a_bad_version(build, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    rng_before = torch.get_rng_state()
    (first, processor), (again, _), (other, _) = build(seed=0, save_to=tmp_path), build(seed=0), build(seed=1)
    assert torch.equal(torch.get_rng_state(), rng_before)
    state, state_again, state_other = first.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(state[k], state_again[k]) for k in state)
    assert any(not torch.equal(state[k], state_other[k]) for k in state)
    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path)
    assert type(loaded) is type(first) and all(
        torch.equal(v, state[k]) for k, v in loaded.state_dict().items()
    )
    reloaded = AutoProcessor.from_pretrained(tmp_path)
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a red circle"}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    kwargs = {"text": [text], "images": [images()[1]], "return_tensors": "pt", "do_rescale": False}
    built, back = processor(**kwargs), reloaded(**kwargs)
    assert built["image_grid_thw"].tolist() == [[1, 6, 10]]
    assert all(torch.equal(built[k], back[k]) for k in built)
    with pytest.raises(ValueError, match="version must be '2' or '2.5', got '3'"):
        qwen25_vl(version="3")
