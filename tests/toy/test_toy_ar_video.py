"""toy-ar-video: its parts, its recipe's loss and data path, and the shipped model (issue #26)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from genalign.toy.generators.video import (
    decode_for_training,
    encode_frames,
    small_video_pipeline,
    video_tokenizer,
    video_words,
)
from genalign.toy.generators.video_eval import VIDEO_SAMPLING, accuracy_interval, video_eval_items
from genalign.toy.generators.video_train import (
    diffusion_forcing_loss,
    diffusion_forcing_timesteps,
    prompt_embeddings,
)

ROOT = Path(__file__).resolve().parents[2]
TOY_CLIP = ROOT / "assets" / "models" / "toy-clip"


@pytest.fixture(scope="module")
def small_pipeline():
    """toy-ar-video's layout at a fraction of its size (random VAE and transformer)."""
    return small_video_pipeline(TOY_CLIP)


def test_every_video_word_is_one_token():
    tokenizer = video_tokenizer()
    for word in video_words():
        assert len(tokenizer(word, add_special_tokens=False).input_ids) == 1, word
    ids = tokenizer("a red circle right of a blue triangle, falling").input_ids
    assert len(ids) == 12  # BOS, 10 words, the comma, EOS


def test_the_training_decode_equals_the_pipelines_decode(small_pipeline):
    vae = small_pipeline.vae
    videos = torch.rand(2, 3, 8, 48, 48) * 2 - 1
    with torch.no_grad():
        mean, std = encode_frames(vae, videos)
        assert mean.shape == (2, 4, 8, 12, 12) and (std > 0).all()
        # frame t's latent depends on frame t only
        changed = videos.clone()
        changed[:, :, 5] = 0
        torch.testing.assert_close(encode_frames(vae, changed)[0][:, :, :5], mean[:, :, :5])
        torch.testing.assert_close(
            decode_for_training(vae, mean).clamp(-1, 1), vae.decode(mean).sample, atol=1e-4, rtol=1e-3
        )


def test_diffusion_forcing_keeps_a_clean_prefix_and_one_level_per_block():
    generator = torch.Generator().manual_seed(0)
    timesteps, noisy = diffusion_forcing_timesteps(512, 8, 2, generator)
    assert timesteps.shape == noisy.shape == (512, 8)
    assert torch.equal(timesteps[:, 0::2], timesteps[:, 1::2])  # a block shares its level
    assert ((timesteps == 0) == ~noisy).all()
    assert (noisy[:, 1:].int() >= noisy[:, :-1].int()).all()  # clean frames only before noisy ones
    assert noisy[:, -1].all()  # the last block always trains
    assert set(noisy.sum(1).tolist()) == {2, 4, 6, 8}  # every frontier drawn
    sigma = timesteps[noisy] / 1000  # shift 5: P(sigma < 0.5) = P(u < 1/6)
    assert (sigma <= 1).all() and (sigma < 0.5).float().mean() == pytest.approx(1 / 6, abs=0.03)
    with pytest.raises(ValueError, match="multiple of the block size"):
        diffusion_forcing_timesteps(2, 7, 2)


def test_a_training_step_lowers_the_loss_on_a_fixed_batch(small_pipeline):
    transformer = small_pipeline.transformer
    state = {k: v.clone() for k, v in transformer.state_dict().items()}
    latents = torch.randn(4, 4, 8, 12, 12)
    embeds = prompt_embeddings(small_pipeline, ["a red circle falling", "a blue square rising"] * 2)
    assert embeds.shape == (4, 16, 64)

    def loss() -> torch.Tensor:
        return diffusion_forcing_loss(transformer, latents, embeds, torch.Generator().manual_seed(3))

    optimizer = torch.optim.Adam(transformer.parameters(), lr=1e-3)
    try:
        before = loss()
        before.backward()
        optimizer.step()
        with torch.no_grad():
            assert loss().item() < before.item()
    finally:
        transformer.load_state_dict(state)


def test_the_built_folder_loads_as_an_ar_video_policy_and_rolls_out(small_pipeline, tmp_path):
    from diffusers import SkyReelsV2DiffusionForcingPipeline

    from genalign.policies import load_policy

    small_pipeline.save_pretrained(str(tmp_path))
    assert isinstance(
        SkyReelsV2DiffusionForcingPipeline.from_pretrained(str(tmp_path)), SkyReelsV2DiffusionForcingPipeline
    )
    policy = load_policy("ar_video", str(tmp_path), train=False)
    trajectory = policy.rollout(["a red circle falling"], seeds=torch.tensor([0]), **VIDEO_SAMPLING)
    assert trajectory.images.shape == (1, 8, 3, 48, 48)


def test_eval_items_and_the_accuracy_interval():
    items = video_eval_items("rl_heldout", per_category=2, num_per_prompt=3, seed=10)
    assert len(items) == 24 and [s for _, s in items[:4]] == [10, 11, 12, 13]
    assert len({p.category for p, _ in items}) == 4
    accuracy, low, high = accuracy_interval([1.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"])
    assert accuracy == pytest.approx(0.75)  # mean of categories: (0.5 + 1) / 2
    # Agresti-Coull's variance per category, by hand: p~ = (x + z^2/2) / (n + z^2), v = p~ (1 - p~) / (n + z^2)
    z2 = 1.959964**2
    pa, pb = (1 + z2 / 2) / (2 + z2), (2 + z2 / 2) / (2 + z2)
    se = ((pa * (1 - pa) + pb * (1 - pb)) / (2 + z2)) ** 0.5 / 2
    assert (low, high) == pytest.approx((0.75 - 1.959964 * se, min(1.0, 0.75 + 1.959964 * se)), rel=1e-5)
    # nothing right in 160 videos: still an upper end above 0 (p (1 - p) / n reads [0, 0]); one
    # wrong video in each of four categories: the interval holds the estimate 0
    assert accuracy_interval([0.0] * 160, ["a"] * 160) == pytest.approx((0.0, 0.0, 0.0165), abs=5e-4)
    accuracy, low, high = accuracy_interval([0.0] * 4, ["a", "b", "c", "d"])
    assert accuracy == 0.0 == low < high


@pytest.mark.slow
def test_the_toy_astrolabe_recipe_runs_a_step_with_the_verifier_as_monitor(small_pipeline, tmp_path):
    """On a random model of the shipped toy generator's layout (a fraction of its size, for speed)."""
    from genalign.cli import main

    model = tmp_path / "model"
    small_pipeline.save_pretrained(str(model))
    recipe = ROOT / "configs" / "toy" / "astrolabe_video.yaml"
    overrides = [
        f"model.path={model}",
        "train.num_steps=1",
        "train.prompts_per_step=1",
        "train.group_size=4",
        "train.minibatch_size=4",
    ]
    assert main(["train", str(recipe), f"logging.run_dir={tmp_path}/run", *overrides]) == 0
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["samples"] == 4 and row["param_change"] > 0
    assert 0.0 <= row["monitor_toy_video_eval"] <= 1.0


def test_the_reflow_ode_runs_block_by_block_causally(small_pipeline):
    from genalign.policies.ar_video import ARVideoPolicy
    from genalign.toy.generators.video_reflow import ode_video_samples, train_captions

    captions = train_captions(2, seed=1)
    assert len(captions) == 2 and all(isinstance(c, str) and c for c in captions)
    policy = ARVideoPolicy(small_pipeline)
    embeds = prompt_embeddings(small_pipeline, captions)
    noise = torch.randn(2, 4, 8, 12, 12, generator=torch.Generator().manual_seed(0))
    clean = ode_video_samples(policy, noise, embeds, num_steps=2)
    changed = noise.clone()
    changed[:, :, 4:] = 0  # the last two blocks' noise
    again = ode_video_samples(policy, changed, embeds, num_steps=2)
    torch.testing.assert_close(again[:, :, :4], clean[:, :, :4])  # earlier blocks never see later ones
    assert not torch.allclose(again[:, :, 4:], clean[:, :, 4:])


def test_the_ode_continues_a_given_prefix(small_pipeline):
    from genalign.policies.ar_video import ARVideoPolicy
    from genalign.toy.generators.video_reflow import ode_video_samples

    policy = ARVideoPolicy(small_pipeline)
    embeds = prompt_embeddings(small_pipeline, ["a red circle falling", "a blue square rising"])
    noise = torch.randn(2, 4, 8, 12, 12, generator=torch.Generator().manual_seed(0))
    block = policy.block_size
    whole = ode_video_samples(policy, noise, embeds, num_steps=2)
    # its own first block as the prefix: the same video, the prefix kept to the bit
    again = ode_video_samples(policy, noise, embeds, num_steps=2, prefix=whole[:, :, :block])
    torch.testing.assert_close(again, whole)
    # another start: kept as given, and the continuation follows it
    start = torch.randn(2, 4, block, 12, 12, generator=torch.Generator().manual_seed(1))
    other = ode_video_samples(policy, noise, embeds, num_steps=2, prefix=start)
    assert torch.equal(other[:, :, :block], start)
    assert not torch.allclose(other[:, :, block:], whole[:, :, block:])
    with pytest.raises(ValueError, match="multiple of the block size"):
        ode_video_samples(policy, noise, embeds, num_steps=2, prefix=start[:, :, :1])


def test_caption_dropout_swaps_in_the_empty_caption_and_is_off_by_default(small_pipeline, monkeypatch):
    from genalign.toy.generators import video_train

    seen = []
    monkeypatch.setattr(
        video_train,
        "diffusion_forcing_loss",
        lambda tr, lat, emb, gen, noise=None, noise_generator=None: seen.append(emb) or 0,
    )
    embeds = prompt_embeddings(small_pipeline, ["a red circle falling", "a blue square rising"])
    empty = prompt_embeddings(small_pipeline, [""])
    assert not torch.allclose(empty[0], embeds[0])
    latents = torch.zeros(2, 4, 8, 12, 12)
    plain = video_train.minibatch_forcing_loss(None, latents, embeds, 64, seed=0)
    plain(0)
    assert all(any(torch.equal(row, e) for e in embeds) for row in seen.pop())
    dropped = video_train.minibatch_forcing_loss(None, latents, embeds, 64, 0, None, 0.25, empty)
    for step in range(8):
        dropped(step)
    rows = torch.cat(seen)
    is_empty = torch.tensor([torch.equal(row, empty[0]) for row in rows])
    assert all(torch.equal(row, embeds[0]) or torch.equal(row, embeds[1]) for row in rows[~is_empty])
    assert is_empty.float().mean().item() == pytest.approx(0.25, abs=0.06)  # 512 draws
    with pytest.raises(ValueError, match="empty_embeds"):
        video_train.minibatch_forcing_loss(None, latents, embeds, 4, 0, None, 0.1)
    with pytest.raises(ValueError, match="caption_dropout"):
        video_train.minibatch_forcing_loss(None, latents, embeds, 4, 0, None, 1.0, empty)


def test_the_guided_ode_extrapolates_from_the_unconditional_branch(small_pipeline):
    from genalign.policies.ar_video import ARVideoPolicy
    from genalign.toy.generators.video_reflow import ode_video_samples

    policy = ARVideoPolicy(small_pipeline)
    embeds = prompt_embeddings(small_pipeline, ["a red circle falling", "a blue square rising"])
    empty = prompt_embeddings(small_pipeline, [""])
    noise = torch.randn(2, 4, 8, 12, 12, generator=torch.Generator().manual_seed(0))
    conditional = ode_video_samples(policy, noise, embeds, num_steps=2)
    unconditional = ode_video_samples(policy, noise, empty.expand_as(embeds), num_steps=2)
    # w = 1 is the conditional model, w = 0 the unconditional one, whatever the blocks and steps
    torch.testing.assert_close(ode_video_samples(policy, noise, embeds, 2, 1.0, empty), conditional)
    torch.testing.assert_close(ode_video_samples(policy, noise, embeds, 2, 0.0, empty), unconditional)
    # one block and one Euler step from sigma 1: x0 = noise - v, so x0 is linear in the guidance
    one = noise[:, :, : policy.block_size]
    c, u = (ode_video_samples(policy, one, e, num_steps=1) for e in (embeds, empty.expand_as(embeds)))
    torch.testing.assert_close(ode_video_samples(policy, one, embeds, 1, 3.0, empty), u + 3.0 * (c - u))
    with pytest.raises(ValueError, match="negative_embeds"):
        ode_video_samples(policy, noise, embeds, 2, 2.0)


def test_the_ode_evaluation_samples_decodes_and_scores(small_pipeline):
    from genalign.policies.ar_video import ARVideoPolicy
    from genalign.toy.generators.video_eval import evaluate_video_generator

    policy = ARVideoPolicy(small_pipeline)
    result = evaluate_video_generator(policy, per_category=2, steps=2, sampler="ode", guidance_scale=2.0)
    assert sum(result["counts"].values()) == 8 and 0.0 <= result["overall"] <= 1.0
    assert result["settings"]["guidance_scale"] == 2.0 and result["settings"]["num_inference_steps"] == 2
    low, high = result["interval"]
    assert low <= result["overall"] <= high
    with pytest.raises(ValueError, match="sampler"):
        evaluate_video_generator(policy, per_category=2, sampler="ddim")
    with pytest.raises(ValueError, match="without guidance"):
        evaluate_video_generator(policy, per_category=2, guidance_scale=2.0)


def test_reflow_pairs_follow_the_guided_teacher(small_pipeline):
    from genalign.policies.ar_video import ARVideoPolicy
    from genalign.toy.generators.video_reflow import ode_video_samples, reflow_pairs

    policy = ARVideoPolicy(small_pipeline)
    captions = ["a red circle falling", "a blue square rising"]
    noise, x0, embeds = reflow_pairs(policy, captions, seed=3, num_steps=2, guidance_scale=4.0)
    empty = prompt_embeddings(small_pipeline, [""])
    torch.testing.assert_close(x0, ode_video_samples(policy, noise, embeds, 2, 4.0, empty))
    _, unguided, _ = reflow_pairs(policy, captions, seed=3, num_steps=2)
    assert not torch.allclose(x0, unguided)


def test_first_block_steps_train_block_zero_alone_and_are_off_by_default(small_pipeline, monkeypatch):
    from genalign.toy.generators import video_train

    transformer = small_pipeline.transformer
    block = int(transformer.config.num_frame_per_block)
    embeds = prompt_embeddings(small_pipeline, ["a red circle falling", "a blue square rising"])
    latents = torch.randn(2, 4, 8, 12, 12, generator=torch.Generator().manual_seed(1))
    # off: the same draws and losses as a loss built without the option
    default = video_train.minibatch_forcing_loss(transformer, latents, embeds, 3, seed=5)
    off = video_train.minibatch_forcing_loss(transformer, latents, embeds, 3, 5, first_block_prob=0.0)
    with torch.no_grad():
        assert all(torch.equal(default(s), off(s)) for s in range(3))
    # always: every step is the diffusion-forcing loss of the videos cut to their first block
    always = video_train.minibatch_forcing_loss(transformer, latents, embeds, 3, 5, first_block_prob=1.0)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for step in range(3):
            index = torch.randint(2, (3,), generator=generator)
            torch.rand((), generator=generator)  # the step's coin
            expected = video_train.diffusion_forcing_loss(
                transformer, latents[index][:, :, :block], embeds[index], generator
            )
            assert torch.equal(always(step), expected)
    # half: about half of the steps see a one-block video
    frames = []
    monkeypatch.setattr(
        video_train,
        "diffusion_forcing_loss",
        lambda tr, lat, emb, gen, noise=None, noise_generator=None: frames.append(lat.shape[2]) or 0,
    )
    half = video_train.minibatch_forcing_loss(transformer, latents, embeds, 3, 0, first_block_prob=0.5)
    for step in range(400):
        half(step)
    assert set(frames) == {block, 8} and frames.count(block) / 400 == pytest.approx(0.5, abs=0.08)
    with pytest.raises(ValueError, match="first_block_prob"):
        video_train.minibatch_forcing_loss(transformer, latents, embeds, 3, 0, first_block_prob=1.5)


SHIPPED = ROOT / "assets" / "models" / "toy-ar-video"


def test_the_shipped_toy_ar_video_loads_and_reproduces_its_card():
    """assets/models/toy-ar-video: a plain diffusers pipeline with the recipe's layout, whose card's
    fixed subset re-scores to the card's accuracy and fraction of checks met; the toy Astrolabe
    recipe starts from it."""
    from diffusers import SkyReelsV2DiffusionForcingPipeline

    from genalign.policies import load_policy
    from genalign.toy.generators.video_eval import evaluate_video_generator
    from genalign.trainers.config import load_recipe

    pipe = SkyReelsV2DiffusionForcingPipeline.from_pretrained(str(SHIPPED))
    assert pipe.transformer.config.patch_size == [1, 2, 2]  # 36 tokens a latent frame
    card = json.loads((SHIPPED / "card.json").read_text())
    assert card["size_mb"] < 6.0 and card["parameters"]["transformer"] == sum(
        p.numel() for p in pipe.transformer.parameters()
    )
    policy = load_policy("ar_video", str(SHIPPED), train=False)
    subset = card["evals"]["subset"]
    settings = subset["settings"]
    keys = ("split", "per_category", "num_per_prompt", "seed")
    result = evaluate_video_generator(
        policy, steps=settings["num_inference_steps"], **{k: settings[k] for k in keys}
    )
    assert result["settings"] == settings
    assert abs(result["overall"] - subset["overall"]) <= 1e-6
    assert abs(result["mean_fraction"] - subset["mean_fraction"]) <= 1e-6
    assert 0.0 < subset["mean_fraction"] < 1.0  # a value the check can miss, not a floor or a ceiling
    recipe = load_recipe(ROOT / "configs" / "toy" / "astrolabe_video.yaml")
    assert (ROOT / recipe.model.path).resolve() == SHIPPED.resolve()
