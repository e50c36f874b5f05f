"""The ``ar_video`` family: block-causal mask, KV cache equal to the recompute path, per-sample seeds."""

from __future__ import annotations

import os

import pytest
import torch

from genalign.policies import ARVideoPolicy, load_policy, video_kv_cache

PROMPTS = ["a red circle", "two blue squares"]
SIZE = {"height": 32, "width": 32}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    os.environ["GENALIGN_TINY_CACHE"] = str(tmp_path_factory.getbasetemp() / "tiny-cache")
    return with_nonzero_lora(load_policy("ar_video", "tiny:ar_video", lora={"rank": 4}))


def with_nonzero_lora(policy: ARVideoPolicy) -> ARVideoPolicy:
    """Non-zero LoRA B, so the adapters take part in every path the tests run."""
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for name, parameter in policy.denoiser.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    return policy


def test_the_tiny_model_is_block_causal_with_per_frame_timesteps(policy):
    assert isinstance(policy, ARVideoPolicy) and policy.block_size == 2
    generator = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 4, 6, 8, 8, generator=generator)
    conditioning = policy.encode_prompts(PROMPTS[:1], 1.0, "")
    timesteps = torch.tensor([[0.0, 0.0, 500.0, 500.0, 900.0, 900.0]])
    with torch.no_grad():
        out = policy.transformer_output(latents, timesteps, conditioning)
        changed = latents.clone()
        changed[:, :, 4:] = torch.randn(1, 4, 2, 8, 8, generator=generator)  # the last block only
        out_changed = policy.transformer_output(changed, timesteps, conditioning)
        later_t = timesteps.clone()
        later_t[:, 4:] = 100.0
        out_later_t = policy.transformer_output(latents, later_t, conditioning)
    # earlier blocks do not see a later block's latents or timesteps; the later block does
    assert torch.equal(out[:, :, :4], out_changed[:, :, :4])
    assert torch.equal(out[:, :, :4], out_later_t[:, :, :4])
    assert not torch.allclose(out[:, :, 4:], out_changed[:, :, 4:])
    assert not torch.allclose(out[:, :, 4:], out_later_t[:, :, 4:])


def test_kv_cache_rollout_equals_the_prefix_recompute_rollout(policy, monkeypatch):
    calls = []
    attend = video_kv_cache.VideoKVCache.attend
    monkeypatch.setattr(
        video_kv_cache.VideoKVCache, "attend", lambda self, *a: calls.append(1) or attend(self, *a)
    )
    cached = policy.rollout(PROMPTS, group_size=2, generator=0, num_frames=6, kv_cache=True, **SIZE)
    # 2 layers x (3 blocks x 4 steps + 3 context writes) go through the cache
    assert len(calls) == 2 * (3 * 4 + 3)
    recomputed = policy.rollout(PROMPTS, group_size=2, generator=0, num_frames=6, kv_cache=False, **SIZE)
    assert len(calls) == 30  # the recompute path never touches the cache
    torch.testing.assert_close(cached.latents, recomputed.latents, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cached.log_probs, recomputed.log_probs, atol=1e-2, rtol=1e-5)
    torch.testing.assert_close(cached.images, recomputed.images, atol=1e-5, rtol=1e-5)
    # the processors are restored after the rollout
    assert not any(
        isinstance(b.attn1.processor, video_kv_cache.CachedSelfAttention) for b in policy.denoiser.blocks
    )


def test_cached_block_output_equals_recompute_at_every_context_length(policy):
    conditioning = policy.encode_prompts(PROMPTS[:1], 1.0, "")
    generator = torch.Generator().manual_seed(3)
    clean = torch.randn(1, 4, 6, 8, 8, generator=generator)
    block = torch.randn(1, 4, 2, 8, 8, generator=generator)
    t = torch.tensor([833.0])
    with torch.no_grad(), video_kv_cache.block_kv_cache(policy.denoiser) as cache:
        for start in range(0, 6, 2):
            cached = policy.block_output(block, t, None, conditioning, cache)
            recomputed = policy.block_output(block, t, clean[:, :, :start], conditioning)
            torch.testing.assert_close(cached, recomputed, atol=1e-5, rtol=1e-5)
            embeds = conditioning["prompt_embeds"]
            cache.run(clean[:, :, start : start + 2], torch.zeros(1, 2), embeds, write=True)
        assert cache.frames == 6


def test_a_sample_is_a_function_of_its_seed_alone(policy):
    both = policy.rollout(PROMPTS, seeds=torch.tensor([11, 22]), num_frames=4, **SIZE)
    alone = policy.rollout(PROMPTS[1:], seeds=torch.tensor([22]), num_frames=4, **SIZE)
    torch.testing.assert_close(both.latents[1:], alone.latents, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(both.images[1:], alone.images, atol=1e-6, rtol=1e-6)
    other = policy.rollout(PROMPTS[1:], seeds=torch.tensor([23]), num_frames=4, **SIZE)
    assert not torch.allclose(other.latents, alone.latents)


def test_rollout_layout_and_recomputed_log_probs(policy):
    trajectory = policy.rollout(PROMPTS[:1], group_size=2, generator=5, num_frames=4, **SIZE)
    assert trajectory.latents.shape == (2, 5, 4, 4, 8, 8)  # T + 1 chain states of every block
    assert trajectory.images.shape == (2, 7, 3, 32, 32)  # 4 latent frames -> 2 * 4 - 1 frames
    assert trajectory.stds[0].tolist() == pytest.approx([0.9375, 2.5 / 3, 0.625, 0.0])
    assert (trajectory.log_probs[:, -1] == 0).all() and (trajectory.log_probs[:, :-1] != 0).all()
    log_probs = policy.log_prob(trajectory)
    torch.testing.assert_close(log_probs, trajectory.log_probs, atol=1e-2, rtol=1e-5)
    log_probs[:, 0].sum().backward()
    grads = [p.grad for p in policy.trainable_parameters()]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    policy.denoiser.zero_grad(set_to_none=True)


def test_bad_arguments_fail_naming_them(policy):
    with pytest.raises(ValueError, match="num_frames 3 must be a positive multiple of the block size 2"):
        policy.rollout(PROMPTS, num_frames=3, **SIZE)
    with pytest.raises(ValueError, match="guidance_scale 4.5"):
        policy.rollout(PROMPTS, num_frames=2, guidance_scale=4.5, **SIZE)
    with pytest.raises(NotImplementedError):
        policy.continue_rollout(None, 0)


def test_a_streaming_window_equals_the_full_forward_and_gradient_reaches_only_window_frames(policy):
    conditioning = policy.encode_prompts(PROMPTS[:1], 1.0, "")
    latents = torch.randn(1, 4, 6, 8, 8, generator=torch.Generator().manual_seed(4)).requires_grad_(True)
    timesteps = torch.full((1, 6), 750.0)
    full = policy.predict_video_x0(latents, timesteps, conditioning)
    for start in (2, 4):  # a history of one block and a window of two, and the other way round
        torch.testing.assert_close(
            policy.predict_window_x0(latents, timesteps, conditioning, start),
            full[:, :, start:],
            atol=1e-5,
            rtol=1e-5,
        )
    window = policy.predict_window_x0(latents, timesteps, conditioning, window_start=2)
    (gradient,) = torch.autograd.grad(window.square().sum(), latents)
    assert gradient[:, :, :2].abs().sum() == 0 and (gradient[:, :, 2:].abs().sum(dim=(0, 1, 3, 4)) > 0).all()
    # the full forward's window loss does reach the history (through attention)
    (full_gradient,) = torch.autograd.grad(full[:, :, 2:].square().sum(), latents)
    assert full_gradient[:, :, :2].abs().sum() > 0
    with pytest.raises(ValueError, match="window_start 3 must be a multiple of the block size 2"):
        policy.predict_window_x0(latents, timesteps, conditioning, window_start=3)


# ---- LongLive's local window with sink frames --------------------------------------------------


@pytest.fixture
def windowed(policy):
    """The policy with LongLive's span at the tiny model's scale: 2 sink frames, 6 frames in all."""
    policy.local_window = video_kv_cache.LocalWindow(local_frames=6, sink_frames=2)
    try:
        yield policy
    finally:
        policy.local_window = None  # full block-causal attention, the default


def test_the_local_window_sees_the_sink_and_the_recent_frames_by_hand():
    window = video_kv_cache.LocalWindow(local_frames=6, sink_frames=2)
    keys = torch.arange(10)
    # queries of the block [6, 8) see the sink {0, 1} and the last 4 frames up to 8: {4, 5, 6, 7}
    assert keys[window.visible(torch.tensor([8, 8]), keys)[0]].tolist() == [0, 1, 4, 5, 6, 7]
    # the block [2, 4) sees everything before its end; nothing later
    assert keys[window.visible(torch.tensor([4]), keys)[0]].tolist() == [0, 1, 2, 3]
    # after writing frames 0..7, the next block (ending at 10) can see {0, 1} and {6, 7}: 2..5 go
    cached = torch.arange(8)
    assert cached[window.kept_after(8, 2, cached)].tolist() == [0, 1, 6, 7]
    with pytest.raises(ValueError, match="local_frames 2 must exceed sink_frames 2"):
        video_kv_cache.LocalWindow(local_frames=2, sink_frames=2)
    with pytest.raises(ValueError, match="local_frames 4 - sink_frames 2 is below the block size 3"):
        video_kv_cache.LocalWindow(local_frames=4, sink_frames=2).check_block(3)


def test_a_windowed_rollout_equals_its_recompute_and_the_cache_stays_bounded(policy, windowed, monkeypatch):
    held = []
    evict = video_kv_cache.VideoKVCache._evict
    monkeypatch.setattr(
        video_kv_cache.VideoKVCache,
        "_evict",
        lambda self, tokens: (
            evict(self, tokens) or held.append((len(self.cached_frames), self.keys[0].shape[1]))
        ),
    )
    cached = windowed.rollout(PROMPTS[:1], group_size=2, generator=7, num_frames=12, kv_cache=True, **SIZE)
    assert max(frames for frames, _ in held) == 4  # sink 2 + the 2 frames before the next block
    tokens_per_frame = held[-1][1] // held[-1][0]
    assert all(tokens == frames * tokens_per_frame for frames, tokens in held)
    recomputed = windowed.rollout(
        PROMPTS[:1], group_size=2, generator=7, num_frames=12, kv_cache=False, **SIZE
    )
    torch.testing.assert_close(cached.latents, recomputed.latents, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cached.log_probs, recomputed.log_probs, atol=1e-2, rtol=1e-5)
    # log-probs recomputed under the current weights use the same window
    torch.testing.assert_close(windowed.log_prob(cached), cached.log_probs, atol=1e-2, rtol=1e-5)
    # twice the length: the cache holds no more
    held.clear()
    windowed.rollout(PROMPTS[:1], generator=7, num_frames=24, kv_cache=True, **SIZE)
    assert max(frames for frames, _ in held) == 4
    # against full attention: the blocks whose span fits the window are the same, later ones not
    windowed.local_window = None
    full = windowed.rollout(PROMPTS[:1], group_size=2, generator=7, num_frames=12, kv_cache=True, **SIZE)
    torch.testing.assert_close(
        full.latents[..., :6, :, :], cached.latents[..., :6, :, :], atol=1e-5, rtol=1e-5
    )
    assert not torch.allclose(full.latents[:, -1, :, 6:], cached.latents[:, -1, :, 6:], atol=1e-3)


def test_a_streaming_window_under_the_local_window_equals_its_full_forward(policy, windowed):
    conditioning = windowed.encode_prompts(PROMPTS[:1], 1.0, "")
    latents = torch.randn(1, 4, 10, 8, 8, generator=torch.Generator().manual_seed(8))
    timesteps = torch.full((1, 10), 625.0)
    with torch.no_grad():
        full = windowed.predict_video_x0(latents, timesteps, conditioning)
        for start in (2, 4, 6, 8):
            torch.testing.assert_close(
                windowed.predict_window_x0(latents, timesteps, conditioning, start),
                full[:, :, start:],
                atol=1e-5,
                rtol=1e-5,
            )
        windowed.local_window = None
        unwindowed = windowed.predict_video_x0(latents, timesteps, conditioning)
    torch.testing.assert_close(unwindowed[:, :, :6], full[:, :, :6], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(unwindowed[:, :, 6:], full[:, :, 6:], atol=1e-3)


def _saved_bytes(policy, forward) -> int:
    """Bytes autograd saves for backward in ``forward()``, each storage once, parameters left out."""
    held = {p.untyped_storage().data_ptr() for p in policy.denoiser.parameters()}
    seen = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in held:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return sum(seen.values())


def test_a_streaming_window_under_the_local_window_saves_nothing_that_grows_with_the_history(
    policy, windowed
):
    # once the history fills the window's span the cache is bounded, so what the window keeps for
    # backward must not depend on the history's length: no view of the whole video's latents or
    # of the whole length's rotary table may reach the saved tensors
    conditioning = windowed.encode_prompts(PROMPTS[:1], 1.0, "")

    def saved(frames: int) -> int:
        latents = torch.randn(1, 4, frames, 8, 8, generator=torch.Generator().manual_seed(9))
        timesteps = torch.full((1, frames), 625.0)
        return _saved_bytes(
            windowed, lambda: windowed.predict_window_x0(latents, timesteps, conditioning, frames - 2)
        )

    short, long = saved(8), saved(24)
    assert short > 0 and short == long


# ---- framewise models (num_frame_per_block = 1, Causal Forcing's framewise variant) -------------


@pytest.fixture(scope="module")
def framewise(tmp_path_factory):
    from genalign.tiny.video import ar_video_pipeline

    pipeline = ar_video_pipeline(seed=0, num_frame_per_block=1)
    return with_nonzero_lora(ARVideoPolicy.from_pipe(pipeline, lora={"rank": 4}))


def test_a_framewise_model_is_frame_causal_where_diffusers_alone_is_not(framewise):
    assert framewise.block_size == 1
    generator = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 4, 4, 8, 8, generator=generator)
    conditioning = framewise.encode_prompts(PROMPTS[:1], 1.0, "")
    timesteps = torch.tensor([[0.0, 250.0, 500.0, 900.0]])
    changed = latents.clone()
    changed[:, :, 3] = torch.randn(1, 4, 8, 8, generator=generator)  # the last frame only
    with torch.no_grad():
        out = framewise.transformer_output(latents, timesteps, conditioning)
        out_changed = framewise.transformer_output(changed, timesteps, conditioning)
        embeds = conditioning["prompt_embeds"]
        plain = video_kv_cache.forcing_forward(framewise.denoiser, latents, timesteps, embeds)
        plain_changed = video_kv_cache.forcing_forward(framewise.denoiser, changed, timesteps, embeds)
        # frame 1 run alone after frames 0 (a causal model's output for it cannot depend on more)
        alone = framewise.transformer_output(latents[:, :, :2], timesteps[:, :2], conditioning)
    assert torch.equal(out[:, :, :3], out_changed[:, :, :3])
    assert not torch.allclose(out[:, :, 3], out_changed[:, :, 3])
    torch.testing.assert_close(out[:, :, :2], alone, atol=1e-5, rtol=1e-5)
    # why genalign masks: diffusers' own forward lets every frame see the last one
    assert not torch.allclose(plain[:, :, :3].float(), plain_changed[:, :, :3].float())


def test_a_framewise_kv_cache_rollout_equals_its_recompute_and_log_probs_match(framewise):
    cached = framewise.rollout(PROMPTS, group_size=2, generator=0, num_frames=3, kv_cache=True, **SIZE)
    recomputed = framewise.rollout(PROMPTS, group_size=2, generator=0, num_frames=3, kv_cache=False, **SIZE)
    torch.testing.assert_close(cached.latents, recomputed.latents, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cached.images, recomputed.images, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        log_probs = framewise.log_prob(cached)
    steps = cached.stochastic_steps()
    torch.testing.assert_close(log_probs[:, steps], cached.log_probs[:, steps], atol=1e-2, rtol=1e-5)


def test_a_framewise_streaming_window_equals_the_full_forward(framewise):
    generator = torch.Generator().manual_seed(4)
    latents = torch.randn(1, 4, 5, 8, 8, generator=generator)
    timesteps = torch.tensor([[0.0, 0.0, 0.0, 400.0, 800.0]])
    conditioning = framewise.encode_prompts(PROMPTS[:1], 1.0, "")
    with torch.no_grad():
        full = framewise.predict_video_x0(latents, timesteps, conditioning)
        window = framewise.predict_window_x0(latents, timesteps, conditioning, window_start=3)
    torch.testing.assert_close(window, full[:, :, 3:], atol=1e-5, rtol=1e-5)


def test_loading_the_toy_generator_prints_no_warning_a_user_cannot_act_on():
    """toy-ar-video conditions on toy-clip's CLIP text tower where the SkyReels pipeline names UMT5;
    diffusers' type warning about it is dropped while loading, and only then."""
    import logging
    from pathlib import Path

    from genalign.utils.quiet import _DropMessages

    folder = Path(__file__).resolve().parents[2] / "assets" / "models" / "toy-ar-video"
    pipeline_logger = logging.getLogger("diffusers.pipelines.pipeline_utils")
    seen: list[str] = []
    recorder = logging.Handler()
    recorder.emit = lambda record: seen.append(record.getMessage())
    pipeline_logger.addHandler(recorder)
    try:
        policy = load_policy("ar_video", folder, train=False)
    finally:
        pipeline_logger.removeHandler(recorder)
    assert policy.block_size == 2
    assert not [m for m in seen if m.startswith("Expected types")]
    assert not [f for f in pipeline_logger.filters if isinstance(f, _DropMessages)]  # only while loading
