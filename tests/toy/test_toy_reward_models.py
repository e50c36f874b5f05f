"""The toy-world reward models (issue #6): data, losses, training, and the shipped toy-clip / toy-vlm."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from genalign.rewards import load_reward
from genalign.toy import all_prompts, evaluate, scene_for_spec, train_prompts
from genalign.toy.reward_models import (
    CLIPRecipe,
    VLMRecipe,
    VLMTasks,
    build_bank,
    build_clip,
    build_vlm,
    caption_loss,
    clip_batch_loss,
    clip_loss,
    continued_record,
    degrade,
    false_variants,
    heldout_eval_set,
    load_toy_reward,
    multi_positive_info_nce,
    one_attribute_variants,
    open_clip_vision_to_transformers,
    question_loss,
    save_clip,
    save_vlm,
    subset_indices,
    train_clip,
    train_vlm,
)
from genalign.toy.scenes import render_scenes

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "assets" / "models"
SUBSET_TOLERANCE = 2e-3  # card.json's subset_tolerance: float32 CPU kernels and renderer versions


def _clauses(spec):
    return [(c["class"], c.get("color"), c["count"], tuple(c.get("position", ()))) for c in spec["include"]]


# -- data ------------------------------------------------------------------------------------------------------


def test_one_attribute_variants_change_exactly_one_attribute():
    grammar = {p.caption for p in all_prompts()}
    for prompt in all_prompts()[::7]:
        variants = one_attribute_variants(prompt.spec)
        assert variants, prompt.caption
        for variant, attribute in variants:
            assert variant["prompt"] in grammar and variant["prompt"] != prompt.caption
            assert variant["tag"] == prompt.spec["tag"]
            before, after = _clauses(prompt.spec), _clauses(variant)
            shapes = sorted(c[0] for c in before), sorted(c[0] for c in after)
            colours = sorted(str(c[1]) for c in before), sorted(str(c[1]) for c in after)
            if attribute == "shape":
                assert shapes[0] != shapes[1] and sum(a != b for a, b in zip(*shapes)) >= 1
                assert [c[2] for c in before] == [c[2] for c in after] and colours[0] == colours[1]
            elif attribute == "count":
                assert shapes[0] == shapes[1] and before[0][2] != after[0][2]
            elif attribute == "colour":
                assert [c[0] for c in before] == [c[0] for c in after]
                assert [c[1] for c in before] != [c[1] for c in after]
            else:
                assert attribute == "relation" and shapes[0] == shapes[1]


def test_false_variants_fail_the_pixel_verifier():
    """Negatives are checked on the scene's objects; ShapesEval on the rendered pixels agrees."""
    rng = np.random.default_rng(0)
    prompts = train_prompts()
    images, specs, expected = [], [], []
    for prompt in prompts[::25]:
        scene = scene_for_spec(prompt.spec, rng)
        negatives = false_variants(scene, prompt.spec)
        assert negatives, prompt.caption
        image = render_scenes([scene], 64)[0]
        by_caption = {v["prompt"]: v for v, _ in one_attribute_variants(prompt.spec)}
        for caption, _ in negatives[:3]:
            images.append(image)
            specs.append(by_caption[caption])
            expected.append(False)
        images.append(image)
        specs.append(prompt.spec)
        expected.append(True)
    verdicts = [sample["correct"] for sample in evaluate(torch.stack(images), specs)["per_sample"]]
    assert verdicts == expected


def test_degradations_get_worse_with_severity():
    image = render_scenes([scene_for_spec(train_prompts()[100].spec, 1)], 64)[0]
    for kind in ("blur", "noise", "jpeg", "downsample"):
        errors = [
            float((degrade(image, kind, s, torch.Generator().manual_seed(0)) - image).abs().mean())
            for s in range(5)
        ]
        assert errors[0] == 0.0
        assert all(a < b for a, b in zip(errors, errors[1:])), (kind, errors)
    with pytest.raises(ValueError, match="severity"):
        degrade(image, "blur", 5)
    with pytest.raises(ValueError, match="degradation"):
        degrade(image, "sepia", 1)


def test_bank_truth_matrix_matches_scene_checks():
    prompts = train_prompts()[::40]
    bank = build_bank(prompts, 2, 32, seed=3)
    assert bank.images.shape == (2 * len(prompts), 3, 32, 32) and bank.images.dtype == torch.uint8
    assert bank.satisfies[np.arange(len(bank.scenes)), bank.prompt_index].all()  # own caption is true
    from genalign.toy import check_spec

    for s, scene in enumerate(bank.scenes):
        for p, prompt in enumerate(prompts):
            assert bank.satisfies[s, p] == check_spec(scene.objects, prompt.spec).correct
        for p in bank.negatives[s]:
            assert not bank.satisfies[s, p]


# -- losses -----------------------------------------------------------------------------------------------------


def test_multi_positive_info_nce():
    torch.manual_seed(0)
    logits = torch.randn(5, 7)
    target = torch.tensor([0, 3, 6, 2, 2])
    one_hot = F.one_hot(target, 7).bool()
    assert torch.allclose(
        multi_positive_info_nce(logits, one_hot), F.cross_entropy(logits, target), atol=1e-6
    )
    several = one_hot.clone()
    several[0, 4] = several[2, 1] = True
    several[4] = False  # a row without a positive is left out
    probs = logits.softmax(-1)
    expected = -torch.stack([torch.log(probs[i][several[i]].sum()) for i in range(4)]).mean()
    assert torch.allclose(multi_positive_info_nce(logits, several), expected, atol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        multi_positive_info_nce(logits, one_hot[:3])


def test_clip_loss_is_clip_symmetric_infonce_plus_hard_negatives():
    torch.manual_seed(1)
    images, texts = torch.randn(4, 8), torch.randn(6, 8)  # captions 0-3 own, 4-5 negatives
    scale = torch.tensor(10.0)
    positives = torch.zeros(4, 6, dtype=torch.bool)
    positives[torch.arange(4), torch.arange(4)] = True
    own, negative = torch.arange(4), torch.tensor([4, 5, 4, 5])
    loss, parts = clip_loss(images, texts, scale, positives, own, negative, hard_negative_weight=0.5)
    logits = scale * F.normalize(images, dim=-1) @ F.normalize(texts, dim=-1).T
    clip = (F.cross_entropy(logits, own) + F.cross_entropy(logits[:, :4].T, own)) / 2  # Radford et al. Fig. 3
    hard = F.cross_entropy(
        torch.stack([logits[own, own], logits[own, negative]], -1), torch.zeros(4, dtype=torch.long)
    )
    assert torch.allclose(loss, clip + 0.5 * hard, atol=1e-5)
    assert parts["hard"] == pytest.approx(float(hard), abs=1e-5)


# -- training (tiny configurations) -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bank():
    return build_bank(train_prompts()[::8], 3, 64, seed=0)


@pytest.mark.slow  # about 20 s alone, minutes on a loaded machine
def test_clip_training_decreases_the_loss(tiny_bank):
    recipe = CLIPRecipe(
        image_size=32, vision_width=32, vision_layers=1, vision_head_width=16, text_width=32, text_heads=2,
        text_layers=1, context_length=16, embed_dim=16, steps=8, batch_size=16, extra_captions=8, lr=3e-3,
        warmup=1, log_every=0,
    )  # fmt: skip
    initial, _, _ = build_clip(recipe)  # the same seeded initialisation train_clip starts from
    before = clip_batch_loss(initial.eval(), recipe, tiny_bank, seed=99)
    model, log = train_clip(recipe, tiny_bank)
    after = clip_batch_loss(model, recipe, tiny_bank, seed=99)
    assert len(log["losses"]) == 8 and after < before - 0.05, (before, after)


@pytest.mark.slow
def test_vlm_training_decreases_the_loss(tiny_bank):
    recipe = VLMRecipe(
        image_size=24, patch_size=12, vision_width=32, vision_layers=1, vision_heads=2, hidden_size=32,
        intermediate_size=64, layers=1, heads=2, kv_heads=1, steps=10, batch_size=8, lr=3e-3, warmup=1, log_every=0,
        question_weight=1.0,
    )  # fmt: skip
    _, _, log = train_vlm(recipe, tiny_bank)
    losses, asked = log["losses"], log["question_losses"]
    assert len(losses) == 10 and np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.5, losses
    # logged for the steps whose batch had a true yes/no chat
    assert 5 <= len(asked) <= 10 and np.mean(asked[-3:]) < np.mean(asked[:3]) - 0.1, asked


@pytest.mark.parametrize("mix", [(0.0, 0.0, 0.0), (1.0, -0.5, 0.5), (1.0, 1.0)])
def test_vlm_training_rejects_a_bad_task_mix(tiny_bank, mix):
    with pytest.raises(ValueError, match="task_mix"):
        train_vlm(replace(TINY_VLM, task_mix=mix, steps=1), tiny_bank)


TINY_VLM = VLMRecipe(vision_width=32, vision_layers=1, vision_heads=2, hidden_size=32, intermediate_size=64,
                     layers=1, heads=2, kv_heads=1)  # fmt: skip


def _tiny_vlm_judge():
    """A freshly initialised tiny toy-vlm architecture: (model, processor, judge, tasks)."""
    from genalign.rewards.vlm import VLMJudge

    model, processor = build_vlm(TINY_VLM)
    judge = VLMJudge(model.eval(), processor)
    return model, processor, judge, VLMTasks(judge)


def test_caption_task_scores_exactly_the_caption_tokens(subset):
    """The feature-alignment chat ends with the caption and <|im_end|>; caption_loss is the mean
    next-token cross-entropy over exactly those tokens (checked against a hand-built sum)."""
    model, processor, judge, tasks = _tiny_vlm_judge()
    items = subset[:3]
    chats = [tasks.description(item.caption) for item in items]
    texts, lengths = [c[0] for c in chats], [c[1] for c in chats]
    inputs = judge.encode(texts, [[item.image] for item in items])
    tokenizer = processor.tokenizer
    for row, (item, length) in enumerate(zip(items, lengths)):
        tail = inputs["input_ids"][row, -length:].tolist()
        assert tokenizer.decode(tail) == item.caption + "<|im_end|>"
        assert length == len(item.caption.split()) + 1  # one token per toy word, then <|im_end|>
    with torch.no_grad():
        ours = caption_loss(model, judge, texts, [[item.image] for item in items], lengths)
        logits = model(**inputs, use_cache=False).logits.float().log_softmax(-1)
    ids, width = inputs["input_ids"], inputs["input_ids"].shape[1]
    terms = [
        -logits[row, position - 1, ids[row, position]]
        for row, length in enumerate(lengths)
        for position in range(width - length, width)
    ]
    assert float(ours) == pytest.approx(float(torch.stack(terms).mean()), rel=1e-5)


def test_question_loss_scores_exactly_the_question_of_the_selected_chats(subset):
    """question_loss is the mean next-token cross-entropy over the text after the image of the
    selected (true yes/no) chats only: the quoted question and the assistant header, no padding,
    no image token (checked against a hand-built sum)."""
    model, processor, judge, tasks = _tiny_vlm_judge()
    items = subset[:3]
    captions = [items[0].caption, "a photo of two red circles and a blue square", items[2].caption]
    texts = [tasks.yes_no(caption) for caption in captions]
    inputs = judge.encode(texts, [[item.image] for item in items])
    rows = torch.tensor([True, True, False])
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits
        ours = question_loss(logits, inputs, model.config.image_token_id, rows)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    log_probs = logits.float().log_softmax(-1)
    image_id, terms = model.config.image_token_id, []
    for row in (0, 1):
        last_image = max(i for i in range(ids.shape[1]) if ids[row, i] == image_id)
        span = list(range(last_image + 1, ids.shape[1]))
        assert all(mask[row, i] == 1 for i in span)
        question = processor.tokenizer.decode(ids[row, span])
        assert captions[row] in question and question.endswith("assistant\n"), question
        terms += [-log_probs[row, i - 1, ids[row, i]] for i in span]
    assert float(ours) == pytest.approx(float(torch.stack(terms).mean()), rel=1e-5)
    none = question_loss(logits, inputs, image_id, torch.zeros(3, dtype=torch.bool))
    assert float(none) == 0.0


def test_vlm_training_continues_from_a_saved_toy_vlm(tiny_bank, tmp_path):
    """``init`` starts training from a saved toy-vlm's weights; another architecture is an error."""
    trained, processor, _ = train_vlm(replace(TINY_VLM, steps=2, lr=1e-2), tiny_bank)
    save_vlm(trained, processor, tmp_path / "first")
    # lr 0: the continued run leaves the loaded weights as they are, so the result is the saved model
    continued, _, _ = train_vlm(replace(TINY_VLM, steps=1, lr=0.0, init=str(tmp_path / "first")), tiny_bank)
    fresh, _ = build_vlm(TINY_VLM)
    saved = trained.state_dict()
    assert all(torch.equal(continued.state_dict()[name], saved[name]) for name in saved)
    assert any(not torch.equal(fresh.state_dict()[name], saved[name]) for name in saved)
    with pytest.raises(ValueError, match="another architecture"):
        train_vlm(replace(TINY_VLM, hidden_size=48, steps=1, init=str(tmp_path / "first")), tiny_bank)
    with pytest.raises(FileNotFoundError, match="not a saved toy-vlm folder"):
        train_vlm(replace(TINY_VLM, steps=1, init=str(tmp_path)), tiny_bank)


def test_a_continued_run_records_every_stage():
    first = {
        "command": "toy-vlm --out a --seed 0",
        "training": {"seconds": 60.0, "steps": 100, "first_loss": 4.8},
    }
    second = {"parameters": 10, "seconds": 30.0, "steps": 40, "first_loss": 1.1, "final_loss": 0.5}
    command, training = continued_record(first, "toy-vlm --out b --init a", second)
    assert command.splitlines() == ["toy-vlm --out a --seed 0", "toy-vlm --out b --init a"]
    assert training == {"parameters": 10, "seconds": 90.0, "steps": 140, "first_loss": 4.8, "final_loss": 0.5}
    assert second["steps"] == 40  # the stage's own record is left as it was
    # a third stage lists all three commands in order
    third, _ = continued_record(
        {"command": command, "training": training}, "toy-vlm --out c --init b", second
    )
    assert third.splitlines()[-1] == "toy-vlm --out c --init b" and len(third.splitlines()) == 3


def test_vlm_vision_tower_starts_as_toy_clip_image_encoder(tmp_path):
    """vision_init converts an open_clip image tower into the LLaVA vision tower exactly: the
    converted tower's pooled CLS, through open_clip's projection, is open_clip's image embedding."""
    clip_recipe = CLIPRecipe(
        image_size=24, patch_size=8, vision_width=32, vision_layers=2, vision_head_width=16, text_width=32,
        text_heads=2, text_layers=1, context_length=16, embed_dim=16,
    )  # fmt: skip
    clip, _, _ = build_clip(clip_recipe)
    clip.eval()
    with torch.no_grad():  # save_clip stores float16: compare against the weights as stored
        for param in clip.parameters():
            param.copy_(param.half().float())
    folder = save_clip(clip, clip_recipe, tmp_path / "clip")
    recipe = VLMRecipe(
        hidden_size=32, intermediate_size=64, layers=1, heads=2, kv_heads=1, vision_init=str(folder)
    )
    model, processor = build_vlm(recipe)
    tower = model.model.vision_tower
    tower = getattr(tower, "vision_model", tower)
    assert model.config.vision_config.image_size == 24 and model.config.vision_config.patch_size == 8
    assert model.config.vision_config.num_attention_heads == 2
    assert processor.image_processor.size["shortest_edge"] == 24
    pixels = torch.randn(2, 3, 24, 24)
    with torch.no_grad():
        expected = clip.encode_image(pixels)
        ours = tower(pixel_values=pixels).pooler_output @ clip.visual.proj
    assert torch.allclose(ours, expected, atol=1e-5)
    # the renaming covers every tensor of the tower but the final projection
    converted = open_clip_vision_to_transformers(
        {k[len("visual.") :]: v for k, v in clip.state_dict().items() if k.startswith("visual.")}, layers=2
    )
    assert set(converted) == {k for k in tower.state_dict() if "position_ids" not in k}
    with pytest.raises(FileNotFoundError, match="not a toy-clip folder"):
        build_vlm(VLMRecipe(vision_init=str(tmp_path)))


# -- the shipped models -----------------------------------------------------------------------------------------


def _card(name: str) -> dict:
    return json.loads((MODELS / name / "card.json").read_text(encoding="utf-8"))


def test_shipped_models_fit_the_size_budget():
    total = sum(
        f.stat().st_size
        for name in ("toy-clip", "toy-vlm")
        for f in (MODELS / name).rglob("*")
        if f.is_file()
    )
    assert total <= 20e6, f"toy-clip + toy-vlm take {total / 1e6:.1f} MB > 20 MB"


@pytest.fixture(scope="module")
def subset():
    return heldout_eval_set(indices=subset_indices())


def test_toy_clip_through_the_public_reward_api(subset):
    card = _card("toy-clip")
    assert card["eval"]["subset_indices"] == subset_indices()
    reward = load_reward(
        "clip", model=f"local-dir:{MODELS / 'toy-clip'}", pretrained=None, convention="cosine"
    )
    images = torch.stack([item.noisy for item in subset])
    true = reward(images, [item.caption for item in subset]).scores
    changed = reward(images, [item.negative for item in subset]).scores
    assert float((true > changed).float().mean()) >= 0.7
    expected = card["subset_scores"]
    assert float(true.mean()) == pytest.approx(expected["mean_cosine_true"], abs=SUBSET_TOLERANCE)
    assert float(changed.mean()) == pytest.approx(expected["mean_cosine_changed"], abs=SUBSET_TOLERANCE)


@pytest.mark.parametrize("name", ["toy-vlm", "toy-vlm-iqa"])
def test_toy_vlm_through_the_public_reward_api(subset, name):
    """The shipped toy-vlm (and toy-vlm-iqa, its fourth stage with the vision tower trained, #27)
    loads as VQAScore (``vlm_yes``) and Q-Align (``iqa``) with no toy-specific code, prefers the true
    caption to a one-attribute change, and reproduces its card's subset scores."""
    card = _card(name)
    assert card["eval"]["subset_indices"] == subset_indices()
    path = str(MODELS / name)
    reward = load_reward("vlm_yes", model=path)
    images = torch.stack([item.noisy for item in subset])
    captions = [item.caption for item in subset]
    true = reward(images, captions).scores
    changed = reward(images, [item.negative for item in subset]).scores
    pair = float((true > changed).float().mean())
    assert pair > 0.55  # chance is 0.5
    expected = card["subset_scores"]
    # the card's subset pair accuracy (0.65), within one case of 20 that sits at the tolerance
    assert pair == pytest.approx(expected["pair_accuracy"], abs=1 / len(subset) + 1e-6)
    iqa = load_reward("iqa", model=path, preset="qalign")
    rating = iqa(torch.stack([item.degraded for item in subset]), captions).scores
    assert float(true.mean()) == pytest.approx(expected["mean_p_yes_true"], abs=SUBSET_TOLERANCE)
    assert float(changed.mean()) == pytest.approx(expected["mean_p_yes_changed"], abs=SUBSET_TOLERANCE)
    assert float(rating.mean()) == pytest.approx(expected["mean_qalign_score"], abs=SUBSET_TOLERANCE)


def test_toy_vlm_training_chats_are_the_reward_chats(subset, tmp_path):
    """The training code renders the chats ``vlm_yes`` renders (a toy-vlm architecture, saved and
    loaded through the public reward API): the same P(yes) for pointwise and comparative."""
    model, processor = build_vlm(TINY_VLM)
    path = str(save_vlm(model.eval(), processor, tmp_path / "vlm"))
    reward = load_toy_reward("toy-vlm", path)
    tasks = VLMTasks(reward.judge)
    items = subset[:4]
    texts = [tasks.yes_no(item.caption) for item in items]
    logits = reward.judge.next_token_logits(texts, [[item.image] for item in items])
    assert tasks.yes in reward.yes_ids and tasks.no in reward.no_ids  # trained tokens are read
    probs = logits.softmax(-1)
    ours = probs[:, reward.yes_ids].sum(-1) / (
        probs[:, reward.yes_ids].sum(-1) + probs[:, reward.no_ids].sum(-1)
    )
    theirs = reward(torch.stack([item.image for item in items]), [item.caption for item in items]).scores
    assert torch.allclose(ours, theirs, atol=1e-5)
    comparative = load_toy_reward("toy-vlm", path, kind="comparative")
    texts = [tasks.comparative(item.caption) for item in items]
    logits = comparative.judge.next_token_logits(texts, [[item.image, item.negative_image] for item in items])
    probs = logits.softmax(-1)
    yes, no = probs[:, comparative.yes_ids].sum(-1), probs[:, comparative.no_ids].sum(-1)
    theirs = comparative(
        torch.stack([item.image for item in items]),
        [item.caption for item in items],
        reference_images=torch.stack([item.negative_image for item in items]),
    ).scores
    assert torch.allclose(yes / (yes + no), theirs, atol=1e-5)
