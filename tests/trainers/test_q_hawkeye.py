"""Q-Hawkeye on the language family (#27): the strategy rolls out G judgements per image on the tiny
LLaVA, the reward gets each sample's MOS, the advantages are uncertainty-aware, the degraded copy
reaches the loss, gamma anneals, bad recipes fail naming the key, a resumed run equals an
uninterrupted one, and the run's final/ folder is an ``iqa`` reward asking the trained question."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from genalign.algorithms import parse_answer_score, thurstone_fidelity_rewards, uncertainty_aware_advantages
from genalign.config import ConfigError
from genalign.policies import TokenSettings
from genalign.rewards import load_reward
from genalign.toy.quality import TOY_QUESTION
from genalign.trainers import build_trainer, load_recipe
from genalign.trainers.losses.q_hawkeye import COPY_ROWS_KEY, ROW_SCALE_KEY, QHawkeyeLoss, degraded_trajectory
from genalign.trainers.strategies import step_generator
from genalign.trainers.strategies.svg import draw_indexed_groups

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "configs" / "toy" / "q_hawkeye.yaml"
KONIQ = ROOT / "configs" / "qwen25vl" / "q_hawkeye_koniq.yaml"
# the recipe's shape on the tiny LLaVA (the recipe warm-starts from a run folder) and one scene
SMALL = [
    "model.path=tiny:llava",
    "prompts.source_kwargs.scenes=1",
    "sampling.language.max_new_tokens=16",
    "train.prompts_per_step=2",
    "train.group_size=4",
    "train.minibatch_size=4",
    "train.gradient_accumulation_steps=2",
]


SFT_SMALL = [
    "model.path=tiny:llava",
    "prompts.source_kwargs.scenes=1",
    "train.num_steps=1",
    "train.prompts_per_step=4",
    "train.minibatch_size=4",
    "logging.progress=false",
]


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def make_trainer(tmp_path: Path, *overrides: str):
    config = load_recipe(
        TOY, [f"logging.run_dir={tmp_path}/run", "logging.progress=false", *SMALL, *overrides]
    )
    return build_trainer(config, base_dir=TOY.parent)


def test_two_steps_with_the_degraded_copy_reaching_the_loss(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, "train.num_steps=2")
    policy, pool = trainer.policy, trainer.prompts
    shown, batches = [], []
    log_prob, collect = policy.log_prob, trainer.strategy.collect

    def spy_log_prob(trajectory, step_indices=None):
        shown.append(trajectory.model_inputs["pixel_values"].detach().clone())
        return log_prob(trajectory, step_indices)

    def spy_collect(context, step):
        batches.append(collect(context, step))
        return batches[-1]

    monkeypatch.setattr(policy, "log_prob", spy_log_prob)
    monkeypatch.setattr(trainer.strategy, "collect", spy_collect)
    trainer.train()

    assert len(batches) == 2
    degraded_rows, original_rows = [], []
    for step, batch in enumerate(batches):
        trajectory = batch.trajectory
        rows, _, _ = draw_indexed_groups(len(pool), 2, 4, step_generator(trainer.config.train.seed, step))
        # the strategy kept the processor's inputs of the rows' degraded images
        expected = policy.encode_prompts(
            trajectory.prompts, trajectory.settings, pool.metadata["degraded_images"][rows]
        )
        kept = trajectory.extras["degraded:pixel_values"]
        torch.testing.assert_close(kept.cpu(), expected["pixel_values"].cpu(), atol=0, rtol=0)
        assert not torch.equal(kept, trajectory.model_inputs["pixel_values"])
        degraded_rows += list(kept.cpu())
        original_rows += list(trajectory.model_inputs["pixel_values"].cpu())
        # each row carries G / (its image's completion tokens), so a mixed minibatch averages per image
        tokens = trajectory.completion_mask.sum(dim=1).float().cpu()
        groups = trajectory.group_ids.cpu()
        expected_scale = [4 / float(tokens[groups == g].sum()) for g in groups.tolist()]
        assert trajectory.extras[ROW_SCALE_KEY].cpu().tolist() == pytest.approx(expected_scale)

    def is_in(rows: torch.Tensor, bank: list[torch.Tensor]) -> bool:
        return all(any(torch.equal(row, other) for other in bank) for row in rows.cpu())

    # each minibatch (2 steps x 2) was re-scored once with the degraded copies, and twice with the
    # originals (the current weights and the k3 KL's reference)
    assert sum(is_in(call, degraded_rows) for call in shown) == 4
    assert sum(is_in(call, original_rows) for call in shown) == 8

    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    assert [m["perception_gamma"] for m in metrics] == pytest.approx(
        [1e-4, 1e-4 * (1 + math.cos(math.pi / 2)) / 2]
    )
    assert all(math.isfinite(m["perception_k3"]) and m["perception_k3"] >= 0 for m in metrics)
    assert metrics[0]["ratio"] == pytest.approx(1.0, abs=1e-6)  # on-policy first inner step
    for key in ("reward_accuracy_mean", "reward_format_mean", "reward_repetition_mean", "ua_weight_mean"):
        assert key in metrics[0]


class Spy(torch.nn.Module):
    def __init__(self, reward):
        super().__init__()
        self.reward, self.calls = reward, []

    def forward(self, outputs, prompts, **metadata):
        self.calls.append({"outputs": list(outputs), **metadata})
        return self.reward(outputs, prompts, **metadata)


def test_the_reward_gets_each_samples_mos_and_advantages_are_uncertainty_aware(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, "train.num_steps=1")
    spy = trainer.reward = Spy(trainer.reward)
    answers = [
        "<think>sharp</think><answer>4.00</answer>",
        "<think>sharp</think><answer>2.00</answer>",
        "<answer>5</answer>",
        "no answer",
    ] * 2
    original = trainer.policy.rollout

    def scripted(*args, **kwargs):
        trajectory = original(*args, **kwargs)
        trajectory.completions = list(answers)
        return trajectory

    monkeypatch.setattr(trainer.policy, "rollout", scripted)
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    rows, groups, _ = draw_indexed_groups(
        len(trainer.prompts), 2, 4, step_generator(trainer.config.train.seed, 0)
    )
    mos = trainer.prompts.metadata["mos"][rows]
    torch.testing.assert_close(spy.calls[-1]["mos"].cpu(), mos)
    # reward by hand: accuracy + format + repetition
    expected = torch.tensor(
        [
            math.exp(-abs(4.0 - m) / 0.3) + 0.8
            if i % 4 == 0
            else math.exp(-abs(2.0 - m) / 0.3) + 0.8
            if i % 4 == 1
            else math.exp(-abs(5.0 - m) / 0.3)
            if i % 4 == 2
            else 0.0
            for i, m in enumerate(mos.tolist())
        ]
    )
    torch.testing.assert_close(batch.rewards.cpu(), expected)
    scores = torch.tensor([4.0, 2.0, 5.0, float("nan")] * 2)
    torch.testing.assert_close(batch.global_scores, scores, equal_nan=True)
    want = uncertainty_aware_advantages(batch.global_rewards, groups, scores)
    torch.testing.assert_close(batch.advantages.cpu(), want)
    # parsed scores 4, 2, 5: population variance 14/9 -> weight exp(-0.2 * 14/36)
    assert batch.metrics["ua_weight_mean"] == pytest.approx(math.exp(-0.2 * 14 / 36), rel=1e-6)
    assert batch.details["answer_unparsed"] == 2.0
    # the accuracy term alone, by group: its population std, and no group without variance
    accuracy = torch.tensor(
        [math.exp(-abs(a - m) / 0.3) if a else 0.0 for a, m in zip([4.0, 2.0, 5.0, None] * 2, mos.tolist())]
    )
    stds = [float(accuracy[g * 4 : g * 4 + 4].std(unbiased=False)) for g in range(2)]
    assert batch.metrics["accuracy_group_std"] == pytest.approx(sum(stds) / 2, rel=1e-5)
    assert batch.metrics["accuracy_zero_variance_groups"] == 0.0
    parsed_stds = [float(accuracy[g * 4 : g * 4 + 3].std(unbiased=False)) for g in range(2)]
    assert batch.metrics["accuracy_parsed_group_std"] == pytest.approx(sum(parsed_stds) / 2, rel=1e-5)
    assert batch.metrics["answer_identical_groups"] == 0.0  # 4, 2, 5 in each group

    trainer.strategy.config.q_hawkeye.uncertainty = False  # the ablation: plain GRPO advantages
    trainer.strategy.assign_advantages(batch, trainer.rollout_context())
    torch.testing.assert_close(
        batch.advantages.cpu(), uncertainty_aware_advantages(batch.global_rewards, groups)
    )


def test_the_ranking_term_adds_the_thurstone_fidelity_against_the_other_images(tmp_path, monkeypatch):
    plain = make_trainer(tmp_path / "plain", "train.num_steps=1")
    ranked = make_trainer(tmp_path / "ranked", "train.num_steps=1", "train.q_hawkeye.rank_weight=0.5")
    answers = [
        "<think>a</think><answer>4.00</answer>",
        "<think>a</think><answer>2.50</answer>",
        "<think>a</think><answer>3.00</answer>",
        "no answer",
    ] * 2
    for trainer in (plain, ranked):
        original = trainer.policy.rollout

        def scripted(*args, _original=original, **kwargs):
            trajectory = _original(*args, **kwargs)
            trajectory.completions = list(answers)
            return trajectory

        monkeypatch.setattr(trainer.policy, "rollout", scripted)
    base = plain.strategy.collect(plain.rollout_context(), 0)
    batch = ranked.strategy.collect(ranked.rollout_context(), 0)
    rows, groups, _ = draw_indexed_groups(
        len(ranked.prompts), 2, 4, step_generator(ranked.config.train.seed, 0)
    )
    mos = ranked.prompts.metadata["mos"][rows]
    ranking = thurstone_fidelity_rewards(batch.global_scores, groups, mos)
    assert ranking[:3].gt(0).all() and ranking[3] == 0  # the unparsed answer gets no ranking reward
    torch.testing.assert_close(batch.rewards.cpu(), base.rewards.cpu() + 0.5 * ranking)
    torch.testing.assert_close(batch.global_rewards, base.global_rewards + 0.5 * ranking)
    assert batch.details["rank_fidelity_mean"] == pytest.approx(float(ranking.mean()))
    assert "rank_fidelity_mean" not in base.details
    want = uncertainty_aware_advantages(batch.global_rewards, groups, batch.global_scores)
    torch.testing.assert_close(batch.advantages.cpu(), want)


def test_copies_are_rolled_out_as_their_own_groups_and_earn_the_pair_order_term(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, "train.num_steps=1", "train.q_hawkeye.copy_weight=0.5")
    pool = trainer.prompts
    shown = []
    answers = [  # originals' groups (4 each), then their copies' groups
        *["<think>a</think><answer>4.00</answer>", "<think>a</think><answer>3.00</answer>"] * 2,
        *["<think>a</think><answer>2.00</answer>"] * 4,
        "<think>a</think><answer>3.00</answer>",  # copy of group 0 (mean 3.5): below
        "<think>a</think><answer>4.00</answer>",  # not below
        "no answer",  # unparsed: nothing
        "<think>a</think><answer>1.00</answer>",  # below
        *["<think>a</think><answer>2.00</answer>"] * 4,  # copy of group 1 (mean 2): ties earn nothing
    ]
    original = trainer.policy.rollout

    def scripted(*args, **kwargs):
        shown.append(kwargs["images"].clone())
        trajectory = original(*args, **kwargs)
        trajectory.completions = list(answers)
        return trajectory

    monkeypatch.setattr(trainer.policy, "rollout", scripted)
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    rows, _, seeds = draw_indexed_groups(len(pool), 2, 4, step_generator(trainer.config.train.seed, 0))
    assert batch.global_batch_size == 16
    torch.testing.assert_close(batch.global_group_ids, torch.tensor([0, 1, 2, 3]).repeat_interleave(4))
    # the copies' groups are shown the degraded images, which are also their "degraded" input
    torch.testing.assert_close(shown[0][:8], pool.metadata["images"][rows])
    torch.testing.assert_close(shown[0][8:], pool.metadata["degraded_images"][rows])
    assert torch.equal(batch.trajectory.input_ids[:8], batch.trajectory.input_ids[8:])
    # rewards: the originals' are Q-Hawkeye's; the copies' have no accuracy term, plus 0.5 x below
    mos = pool.metadata["mos"][rows]
    accuracy = torch.tensor(
        [math.exp(-abs(a - float(m)) / 0.3) for a, m in zip([4.0, 3.0] * 2 + [2.0] * 4, mos)]
    )
    format_ = torch.tensor([0.8] * 10 + [0.0] + [0.8] * 5)
    below = torch.tensor([0.0] * 8 + [1, 0, 0, 1] + [0] * 4)
    want = format_ + torch.cat([accuracy, torch.zeros(8)]) + 0.5 * below
    torch.testing.assert_close(batch.global_rewards, want)
    assert batch.details["copy_below_original"] == pytest.approx(2 / 8)
    assert "accuracy_group_std" in batch.metrics  # the MOS signal, over the originals only
    want_adv = uncertainty_aware_advantages(batch.global_rewards, batch.global_group_ids, batch.global_scores)
    torch.testing.assert_close(batch.advantages.cpu(), want_adv)
    # a full step trains on both (the copies' perception term is 0: image and degraded input agree)
    plain = batch.trajectory.select(slice(8, 16))
    assert torch.equal(plain.model_inputs["pixel_values"], plain.extras["degraded:pixel_values"])
    assert len(seeds) == 8
    # so the loss re-scores only the originals, and the copies' k3 is the 0 a re-scoring gives
    trajectory = batch.trajectory.select([9, 2, 12, 5])  # copies, originals, mixed order
    assert trajectory.extras[COPY_ROWS_KEY].tolist() == [True, False, True, False]
    seen = []
    log_prob = trainer.policy.log_prob
    monkeypatch.setattr(trainer.policy, "log_prob", lambda t: seen.append(t.batch_size) or log_prob(t))
    with torch.no_grad():
        current = log_prob(trajectory)
        skipped = trainer.loss.degraded_log_probs(trainer.policy, trajectory, current)
        everything = log_prob(degraded_trajectory(trajectory))
    assert seen == [2]  # one forward, of the two originals
    torch.testing.assert_close(skipped, everything, atol=1e-5, rtol=0)
    assert torch.equal(skipped[[0, 2]], current[[0, 2]])


def test_the_perception_term_needs_the_degraded_copy(tmp_path):
    trainer = make_trainer(tmp_path, "train.num_steps=1")
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    plain = batch.trajectory.select(slice(0, 4))
    swapped = degraded_trajectory(plain)
    assert torch.equal(swapped.model_inputs["pixel_values"], plain.extras["degraded:pixel_values"])
    assert torch.equal(swapped.input_ids, plain.input_ids)
    plain.extras.clear()
    loss = QHawkeyeLoss(trainer.config.train)
    with pytest.raises(ValueError, match="degraded image"):
        loss(trainer.policy, plain, 0, torch.zeros(4))


def test_gamma_anneals_over_the_configured_steps(tmp_path):
    config = load_recipe(TOY, ["train.num_steps=20", "train.q_hawkeye.perception_anneal_steps=10"]).train
    loss = QHawkeyeLoss(config)
    assert [loss.gamma(s) for s in (0, 5, 10, 15)] == pytest.approx([1e-4, 5e-5, 0.0, 0.0], abs=1e-12)
    config = load_recipe(TOY, ["train.num_steps=20"]).train  # None: over the run
    assert QHawkeyeLoss(config).gamma(10) == pytest.approx(5e-5)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.q_hawkeye.gama=1", "unknown config key 'gama' in train.q_hawkeye"),
        ("train.q_hawkeye.perception_gamma=-1", "train.q_hawkeye.perception_gamma must be >= 0"),
        ("train.q_hawkeye.score_max=0.5", "train.q_hawkeye.score_max 0.5 must exceed"),
        ("train.q_hawkeye.perception_anneal_steps=-2", "train.q_hawkeye.perception_anneal_steps"),
        ("train.q_hawkeye.rank_weight=-1", "train.q_hawkeye.rank_weight must be >= 0"),
        ("train.strategy=groups", "train.method 'q_hawkeye' rolls out with train.strategy 'q_hawkeye'"),
        ("model.family=sd", "train.method 'q_hawkeye' is for the 'language' family"),
    ],
)
def test_bad_config_keys_give_a_one_line_error_naming_the_key(override, message):
    with pytest.raises(ConfigError) as error:
        load_recipe(TOY, [override])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_perception_term_off_a_q_hawkeye_strategy_is_refused():
    overrides = ["train.method=grpo", "train.strategy=groups"]
    with pytest.raises(ConfigError, match="perception_gamma > 0 needs the degraded image"):
        load_recipe(TOY, overrides)
    assert load_recipe(TOY, [*overrides, "train.q_hawkeye.perception_gamma=0"]).train.loss == "q_hawkeye"


def test_the_koniq_recipe_loads_with_the_official_settings():
    config = load_recipe(KONIQ)
    train, language = config.train, config.sampling.language
    assert (train.group_size, train.learning_rate, train.lr_schedule, train.lr_warmup_steps) == (
        4,
        5e-6,
        "cosine",
        50,
    )
    assert (train.max_grad_norm, train.kl_coef, language.max_new_tokens, language.temperature) == (
        0.1,
        0.04,
        2048,
        1.0,
    )
    assert (train.q_hawkeye.perception_gamma, train.q_hawkeye.alpha, train.q_hawkeye.ratio_clip) == (
        1e-4,
        0.2,
        False,
    )
    assert "tiny:qwen25_vl" in KONIQ.read_text().split("name:")[0]  # the header says how it runs tiny


def test_resume_reproduces_an_uninterrupted_run(tmp_path):
    # the run stops after 2 of 4 steps; gamma's and the learning rate's horizons are pinned to 4
    # (by default both follow train.num_steps, which the shortened first run changes)
    horizons = [
        "train.q_hawkeye.perception_anneal_steps=4",
        "train.lr_warmup_steps=1",
        "train.lr_decay_steps=4",
    ]
    straight = make_trainer(tmp_path / "a", "train.num_steps=4", *horizons)
    straight.train()
    first = make_trainer(tmp_path / "b", "train.num_steps=2", *horizons)
    first.train()
    resumed = make_trainer(tmp_path / "b", "train.num_steps=4", "logging.resume=latest", *horizons)
    resumed.train()
    a = dict(straight.policy.named_trainable_parameters())
    b = dict(resumed.policy.named_trainable_parameters())
    assert a.keys() == b.keys() and len(a) > 10
    moved = [name for name in a if not torch.equal(a[name], first.policy.named_trainable_parameters()[name])]
    assert moved  # steps 2-3 changed the weights, so equality below is not trivial
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)

    def rows(path):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in lines]

    assert rows(straight.metrics_path) == rows(resumed.metrics_path)
    assert len({row["perception_gamma"] for row in rows(resumed.metrics_path)}) == 4  # annealing
    assert len({row["lr"] for row in rows(resumed.metrics_path)}) >= 3  # warm-up, then cosine
    assert [row["step"] for row in rows(resumed.metrics_path)] == [0, 1, 2, 3]


def test_the_final_folder_is_an_iqa_reward_asking_the_trained_question(tmp_path):
    trainer = make_trainer(tmp_path, "train.num_steps=1")
    trainer.train()
    final = trainer.run_dir / "final"
    settings = json.loads((final / "iqa_judge.json").read_text())
    assert settings == {
        "preset": "answer",
        "max_new_tokens": 16,
        "answer_range": [1.0, 5.0],
        "question": TOY_QUESTION,
    }
    reward = load_reward("iqa", model=str(final))
    assert (reward.answer["question"], reward.answer["max_new_tokens"]) == (TOY_QUESTION, 16)
    images = trainer.prompts.metadata["images"][:3]
    judge = reward.judge
    text = judge.render([judge.message("user", TOY_QUESTION, images=1)])
    # the rendered question is the one the policy trained on (its prompt tokens, image included)
    encoded = trainer.policy.encode_prompts([TOY_QUESTION], TokenSettings(1.0, 16, True, None), images[:1])
    torch.testing.assert_close(judge.encode([text], [[images[0]]])["input_ids"], encoded["input_ids"])
    completions = judge.generate([text] * 3, [[image] for image in images], 16)
    expected = [parse_answer_score(c) for c in completions]
    expected = [1.0 if v is None else min(max(v, 1.0), 5.0) for v in expected]
    torch.testing.assert_close(reward(images, None).scores, torch.tensor(expected))
    # other methods write no iqa_judge.json: their final/ folders stay Q-Align judges
    sft = load_recipe(TOY.parent / "q_hawkeye_sft.yaml", [f"logging.run_dir={tmp_path}/sft", *SFT_SMALL])
    sft_trainer = build_trainer(sft, base_dir=TOY.parent)
    sft_trainer.train()
    assert not (sft_trainer.run_dir / "final" / "iqa_judge.json").exists()
    assert load_reward("iqa", model=str(sft_trainer.run_dir / "final")).answer is None


def test_the_trained_judge_drives_a_generator_run(tmp_path):
    judge_run = make_trainer(tmp_path / "judge", "train.num_steps=1")
    judge_run.train()
    final = judge_run.run_dir / "final"
    recipe = TOY.parent / "nft_iqa_judge.yaml"
    config = load_recipe(
        recipe,
        [
            f"logging.run_dir={tmp_path}/generator",
            "logging.progress=false",
            "logging.sample_every=0",
            "model.path=tiny:sd",
            f"reward.kwargs.model={final}",
            "reward.kwargs.max_new_tokens=8",
            "reward.monitors={}",
            "prompts.file=null",
            "prompts.prompts=[a red circle, a blue square]",
            "sampling.num_inference_steps=4",
            "train.num_steps=1",
            "train.prompts_per_step=2",
            "train.group_size=2",
            "train.minibatch_size=4",
        ],
    )
    assert config.reward.kwargs["model"] == str(final)
    trainer = build_trainer(config, base_dir=recipe.parent)
    assert trainer.reward.answer is not None  # the judge's iqa_judge.json made it an answer judge
    assert config.reward.kwargs["readout"] == "expected"  # each digit by its expectation
    batch = trainer.strategy.collect(trainer.rollout_context(), 0)
    judge = load_reward("iqa", model=str(final), max_new_tokens=8, readout="expected")
    torch.testing.assert_close(batch.rewards.cpu(), judge(batch.trajectory.outputs, None).scores.cpu())
    trainer.train()
    (row,) = [json.loads(line) for line in trainer.metrics_path.read_text().splitlines()]
    assert 1.0 <= row["reward_mean"] <= 5.0  # the judge's clamped answers
    assert (trainer.run_dir / "final").is_dir()


def test_frozen_prefixes_get_no_update_and_a_typo_is_named(tmp_path):
    trainer = make_trainer(tmp_path, "train.num_steps=1", "model.frozen=[model.vision_tower]")
    before = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}
    trainer.train()
    after = dict(trainer.policy.model.named_parameters())
    vision = [n for n in before if n.startswith("model.vision_tower.")]
    others = [n for n in before if n not in vision]
    assert vision and all(torch.equal(before[n], after[n]) for n in vision)
    assert any(not torch.equal(before[n], after[n]) for n in others)
    with pytest.raises(ValueError, match="model.frozen entry 'model.vison_tower' names no parameter"):
        make_trainer(tmp_path / "typo", "model.frozen=[model.vison_tower]")
    with pytest.raises(ConfigError, match="model.frozen applies to full fine-tuning"):
        load_recipe(
            TOY, ["model.frozen=[model.vision_tower]", "model.lora={rank: 2, target_modules: [q_proj]}"]
        )


def test_accuracy_signal_separates_the_mos_signal_from_parse_failures():
    from genalign.trainers.strategies.q_hawkeye import accuracy_signal

    nan = float("nan")
    # group 0: three identical answers and a parse failure; group 1: answers 3, 2, 2 and a failure
    scores = torch.tensor([4.0, 4.0, nan, 4.0, 3.0, 2.0, 2.0, nan])
    accuracy = torch.tensor([0.5, 0.5, 0.0, 0.5, 0.9, 0.3, 0.3, 0.0])
    out = accuracy_signal(accuracy, scores, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))
    assert out["accuracy_zero_variance_groups"] == 0.0  # the failures' 0 give every group variance
    every = (
        torch.tensor([0.5, 0.5, 0.0, 0.5]).std(unbiased=False)
        + torch.tensor([0.9, 0.3, 0.3, 0.0]).std(unbiased=False)
    ) / 2
    assert out["accuracy_group_std"] == pytest.approx(float(every), rel=1e-6)
    assert out["accuracy_parsed_group_std"] == pytest.approx(
        float(torch.tensor([0.9, 0.3, 0.3]).std(unbiased=False)) / 2, rel=1e-6
    )
    assert out["answer_identical_groups"] == 0.5
    none = accuracy_signal(torch.zeros(2), torch.tensor([nan, nan]), torch.tensor([0, 0]))
    assert math.isnan(none["answer_identical_groups"]) and none["accuracy_zero_variance_groups"] == 1.0


class _FixedPolicy:
    """``log_prob`` returns fixed current log-probs with gradients; the reference is the old policy."""

    def __init__(self, log_probs: torch.Tensor, reference: torch.Tensor) -> None:
        self.current, self.ref, self.in_reference = log_probs, reference, False

    def log_prob(self, trajectory):
        return self.ref if self.in_reference else self.current

    def reference(self):
        import contextlib

        @contextlib.contextmanager
        def scope():
            self.in_reference = True
            try:
                yield
            finally:
                self.in_reference = False

        return scope()


@pytest.mark.parametrize("ratio_clip", [False, True])
def test_ratio_clip_switches_between_the_official_unclipped_loss_and_token_ppos_range(ratio_clip):
    from types import SimpleNamespace

    config = load_recipe(
        TOY, ["train.q_hawkeye.perception_gamma=0", f"train.q_hawkeye.ratio_clip={str(ratio_clip).lower()}"]
    ).train
    old = torch.tensor([[-1.0, -1.0, -2.0], [-0.5, -1.5, -1.0]])
    # rho = exp(0.5) = 1.65 on the first row (outside 1 +- 0.2), exp(-0.05) = 0.95 on the second
    current = (old + torch.tensor([[0.5, 0.5, 0.0], [-0.05, -0.05, 0.0]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    trajectory = SimpleNamespace(
        log_probs=old, completion_mask=mask, settings=SimpleNamespace(max_new_tokens=3), extras={}
    )
    advantages = torch.tensor([1.0, -1.0])
    loss, _ = QHawkeyeLoss(config)(_FixedPolicy(current, old), trajectory, 0, advantages)
    loss.backward()
    # by hand, per token: -A * rho (unclipped), or -min(A rho, A clip(rho, 0.8, 1.2)) (clipped); the
    # k3 KL (beta 0.04) to the reference = old: exp(r) - r - 1 with r = old - current
    rho = torch.exp(current.detach() - old)
    surrogate = -advantages[:, None] * rho
    if ratio_clip:
        clipped = -advantages[:, None] * rho.clamp(
            1 - config.token_ppo.eps_low, 1 + config.token_ppo.eps_high
        )
        surrogate = torch.maximum(surrogate, clipped)
    r = old - current.detach()
    per_token = surrogate + config.kl_coef * (torch.exp(r) - r - 1)
    assert config.token_ppo.aggregation == "sequence_mean"
    expected = ((per_token * mask).sum(1) / mask.sum(1)).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    # the clipped row (A > 0, rho > 1.2) gets only the KL's gradient when clipping is on
    kl_only = config.kl_coef * (1 - torch.exp(r[0, :2])) / 2 / 2
    if ratio_clip:
        assert current.grad[0, :2] == pytest.approx(kl_only.tolist(), rel=1e-5)
    else:
        assert (current.grad[0, :2] - kl_only).abs().min() > 0.1
