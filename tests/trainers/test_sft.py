"""Supervised fine-tuning of language policies (#25 item 2): the loss by hand on a padded batch,
the loss falls on a tiny model, exact resume, and the recipe checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from genalign.algorithms import next_token_loss
from genalign.config import ConfigError
from genalign.policies import LanguagePolicy, TokenSettings, teacher_forced_trajectory
from genalign.tiny.language import llava_vlm, qwen2_lm
from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.prompt_pool import PromptPool, read_prompt_records
from genalign.trainers.strategies.sft import epoch_indices

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "toy" / "rlrf_sft.yaml"
SMALL = ["prompts.source_kwargs.count=12", "train.prompts_per_step=4", "train.minibatch_size=2"]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def make_trainer(tmp_path: Path, *overrides: str):
    config = load_recipe(RECIPE, [f"logging.run_dir={tmp_path}/run", "logging.progress=false", *overrides])
    return build_trainer(config, base_dir=RECIPE.parent)


@pytest.mark.parametrize("vlm", [False, True], ids=["lm", "vlm"])
def test_sft_loss_equals_a_hand_computation_on_a_padded_batch(vlm):
    model, processor = llava_vlm(seed=0) if vlm else qwen2_lm(seed=0)
    policy = LanguagePolicy(model, processor, lora=None, train=True)
    prompts = ["a square", "draw a red circle please"]  # the short prompt is left-padded
    targets = ['<svg><circle r="3"/></svg>', "<svg/>"]  # the short target is right-padded
    images = torch.rand(2, 3, 32, 32) if vlm else None
    settings = TokenSettings(1.0, 1, True, None)
    trajectory = teacher_forced_trajectory(policy, prompts, targets, images, settings)
    assert (trajectory.attention_mask == 0).any(dim=1).all()  # both rows are padded somewhere
    loss, info = next_token_loss(policy.log_prob(trajectory), trajectory.completion_mask)

    # by hand: each pair alone, no padding; -log softmax over the target tokens and the end token
    assert policy.suppressed_token_ids == ([policy.tokenizer.convert_tokens_to_ids("<image>")] if vlm else [])
    total, count = 0.0, 0
    end = policy.eos_token_ids[0]
    for i in range(2):
        encoded = policy.encode_prompts([prompts[i]], settings, images[i : i + 1] if vlm else None)
        prompt_ids = encoded.pop("input_ids")[0]
        encoded.pop("attention_mask")
        target_ids = policy.tokenizer(targets[i], add_special_tokens=False)["input_ids"] + [end]
        ids = torch.cat([prompt_ids, torch.tensor(target_ids)])[None]
        with torch.no_grad():
            logits = policy.model(input_ids=ids, **encoded).logits[0].double()
        logits[:, policy.suppressed_token_ids] = float("-inf")  # a VLM's <image> is never a token
        for k, token in enumerate(target_ids):
            position = len(prompt_ids) + k - 1  # the logits that predict target token k
            total -= torch.log_softmax(logits[position], dim=-1)[token].item()
            count += 1
    assert int(info["target_tokens"]) == count == int(trajectory.completion_mask.sum())
    assert loss.item() == pytest.approx(total / count, abs=1e-5)


def test_sequence_mean_weighs_each_target_once():
    log_probs = torch.tensor([[-1.0, -3.0, 7.0], [-2.0, 9.0, 9.0]])  # 7 and 9: padding, ignored
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    token, _ = next_token_loss(log_probs, mask, "token_mean")
    sequence, _ = next_token_loss(log_probs, mask, "sequence_mean")
    assert token.item() == pytest.approx((1 + 3 + 2) / 3)
    assert sequence.item() == pytest.approx(((1 + 3) / 2 + 2) / 2)


def test_epochs_walk_the_pool_without_replacement():
    first = epoch_indices(10, seed=3, start=0, count=10)
    assert sorted(first.tolist()) == list(range(10))
    across = epoch_indices(10, seed=3, start=6, count=8)  # the end of epoch 0, the start of epoch 1
    assert across[:4].tolist() == first[6:].tolist()
    assert across.tolist() == epoch_indices(10, seed=3, start=6, count=8).tolist()


def test_sft_lowers_the_loss_of_a_tiny_model(tmp_path):
    trainer = make_trainer(
        tmp_path, *SMALL, "train.num_steps=12", "logging.checkpoint_every=0", "train.learning_rate=1e-2"
    )
    history = trainer.train()
    losses = [row["sft_loss"] for row in history]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses
    assert all(row["reward_mean"] == 0.0 for row in history)  # supervised: no rewards
    assert (trainer.run_dir / "final" / "config.json").is_file()


def test_sft_resume_reproduces_an_uninterrupted_run(tmp_path):
    # 4 samples a step over a pool of 12: the resumed half crosses into the second epoch
    straight = make_trainer(tmp_path / "a", *SMALL, "train.num_steps=4")
    straight.train()
    first = make_trainer(tmp_path / "b", *SMALL, "train.num_steps=2")
    first.train()
    resumed = make_trainer(tmp_path / "b", *SMALL, "train.num_steps=4", "logging.resume=latest")
    resumed.train()
    a = dict(straight.policy.named_trainable_parameters())
    b = dict(resumed.policy.named_trainable_parameters())
    assert a.keys() == b.keys() and len(a) > 10
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)

    def rows(path):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in lines]

    assert rows(straight.metrics_path) == rows(resumed.metrics_path)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["train.loss=token_ppo"], "trains with train.loss 'sft'"),
        (["train.strategy=groups", "train.method=grpo", "train.group_size=2"], "train.loss 'sft' and"),
        (["model.family=sd", "model.lora=null"], "'language' family"),
    ],
)
def test_recipe_refuses_half_an_sft(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_recipe(RECIPE, overrides)


def test_records_file_round_trip(tmp_path):
    from genalign.toy.svg_tasks import toy_svg_pool, write_records

    pool = toy_svg_pool("image_to_svg", count=3, seed=5)
    path = write_records(pool, tmp_path / "data")
    loaded = read_prompt_records(path)
    assert isinstance(loaded, PromptPool) and list(loaded) == list(pool)
    assert loaded.metadata["reference_svgs"] == pool.metadata["reference_svgs"]
    torch.testing.assert_close(loaded.metadata["images"], pool.metadata["images"], atol=1 / 255, rtol=0)
    config = load_recipe(RECIPE, [f"prompts.records={path}", "prompts.source=null"])
    assert config.prompts.load() == list(pool)
