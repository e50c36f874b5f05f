"""The language family on the tiny Qwen2 LM and LLaVA VLM: exact recomputed log-probs, left
padding, EOS masks, per-sample seeds, the reference model, LoRA and full fine-tuning."""

from __future__ import annotations

import pytest
import torch

from genalign.policies import LanguagePolicy, LoRASpec, TokenTrajectory, load_policy
from genalign.policies.language import completion_mask_after_eos
from genalign.tiny.language import llava_vlm, qwen2_lm

PROMPTS = ["a red circle", "two big blue squares to the left of a green triangle"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def lm_policy(lora: bool = True, train: bool = True) -> LanguagePolicy:
    model, tokenizer = qwen2_lm(seed=0)
    spec = LoRASpec(rank=4, target_modules=TARGETS) if lora else None
    return LanguagePolicy(model, tokenizer, lora=spec, train=train)


def perturb_lora(policy: LanguagePolicy, seed: int = 1) -> None:
    """Give the LoRA B factors (zero at initialisation) random values, so adapters matter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)


def bare_logits(model, trajectory: TokenTrajectory) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sample, without padding or masks: strip the left padding, run the model on the bare
    sequence and return the logits that predict each completion token up to its EOS
    (``[count, V]``) with those tokens (``[count]``)."""
    out = []
    with torch.no_grad():
        for b in range(trajectory.batch_size):
            prompt = trajectory.input_ids[b, : trajectory.prompt_length]
            prompt = prompt[trajectory.attention_mask[b, : trajectory.prompt_length].bool()]
            count = int(trajectory.completion_mask[b].sum())
            completion = trajectory.completion_ids[b, :count]
            logits = model(input_ids=torch.cat([prompt, completion])[None]).logits[0]
            out.append((logits[len(prompt) - 1 : len(prompt) - 1 + count], completion))
    return out


def independent_log_probs(model, trajectory: TokenTrajectory) -> list[torch.Tensor]:
    """Per sample, on the bare sequence: log softmax(logits / T) of each completion token."""
    temperature = trajectory.settings.temperature
    return [
        torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, tokens[:, None])[:, 0]
        for logits, tokens in bare_logits(model, trajectory)
    ]


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_on_policy_ratio_is_exactly_one(lora):
    policy = lm_policy(lora=lora)
    if lora:
        perturb_lora(policy)
    trajectory = policy.rollout(PROMPTS, group_size=2, generator=0, max_new_tokens=12, temperature=0.7)
    log_probs = policy.log_prob(trajectory)
    assert log_probs.requires_grad
    ratio = torch.exp(log_probs.detach() - trajectory.log_probs)
    assert (ratio - 1).abs().max().item() == 0.0


def test_log_probs_equal_an_independent_per_token_computation():
    policy = lm_policy()
    perturb_lora(policy)
    trajectory = policy.rollout(PROMPTS, group_size=2, generator=3, max_new_tokens=10, temperature=1.3)
    assert trajectory.attention_mask[0, 0] == 0  # the short prompt is left-padded
    expected = independent_log_probs(policy.model, trajectory)
    for b, values in enumerate(expected):
        count = values.shape[0]
        torch.testing.assert_close(trajectory.log_probs[b, :count], values, atol=2e-5, rtol=0)
        assert torch.all(trajectory.log_probs[b, count:] == 0)


@pytest.mark.parametrize("lora", [True, False])
def test_a_checkpoints_generation_settings_do_not_reshape_the_sampled_distribution(monkeypatch, lora):
    """Qwen2.5 Instruct checkpoints ship ``repetition_penalty`` 1.05 in their generation config, and
    ``generate`` fills every unset field from it: tokens were drawn from penalised logits while the
    trajectory recorded ``log_softmax(logits / T)`` (the old code: |difference| up to 0.6 nats)."""
    from genalign.policies import language_sampling

    policy = lm_policy(lora=lora)
    base = policy.model.get_base_model() if hasattr(policy.model, "get_base_model") else policy.model
    with torch.no_grad():  # spread the tiny model's logits as a real LM's, so a penalty bites
        base.model.norm.weight.mul_(10.0)
    checkpoint_config = base.generation_config
    checkpoint_config.repetition_penalty = 3.0
    checkpoint_config.no_repeat_ngram_size = 1
    checkpoint_config.min_new_tokens = 6
    seen = []
    draw = language_sampling.gumbel_max_tokens

    def recording(logits, temperature, generators):
        tokens = draw(logits, temperature, generators)
        seen.append(torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, tokens[:, None])[:, 0])
        return tokens

    monkeypatch.setattr(language_sampling, "gumbel_max_tokens", recording)
    trajectory = policy.rollout(PROMPTS, group_size=4, generator=0, max_new_tokens=16, temperature=1.0)
    sampled = torch.stack(seen, dim=1)[:, : trajectory.completion_length] * trajectory.completion_mask
    torch.testing.assert_close(trajectory.log_probs, sampled, atol=2e-5, rtol=0)
    assert base.generation_config is checkpoint_config  # restored after the rollout
    assert checkpoint_config.repetition_penalty == 3.0


def test_a_sample_is_the_same_in_any_batch():
    """Left padding changes nothing: each prompt alone gives the tokens and log-probs it gets in a
    batch with a longer prompt, from the same seed."""
    policy = lm_policy(lora=False, train=False)
    seeds = torch.tensor([11, 12])
    both = policy.rollout(PROMPTS, seeds=seeds, max_new_tokens=12)
    for b, prompt in enumerate(PROMPTS):
        alone = policy.rollout([prompt], seeds=seeds[b : b + 1], max_new_tokens=12)
        length = alone.completion_length
        assert torch.equal(alone.completion_ids[0], both.completion_ids[b, :length])
        torch.testing.assert_close(alone.log_probs[0], both.log_probs[b, :length], atol=1e-5, rtol=0)
        assert alone.completions[0] == both.completions[b]


def test_rollouts_are_determined_by_their_seeds():
    policy = lm_policy(lora=False, train=False)
    first = policy.rollout(PROMPTS, group_size=3, generator=7, max_new_tokens=8)
    again = policy.rollout(PROMPTS, group_size=3, generator=7, max_new_tokens=8)
    assert torch.equal(first.input_ids, again.input_ids) and torch.equal(first.log_probs, again.log_probs)
    assert len(set(first.completions)) > 1  # the samples of a group differ
    other = policy.rollout(PROMPTS, group_size=3, generator=8, max_new_tokens=8)
    assert not torch.equal(first.input_ids, other.input_ids)
    assert first.group_ids.tolist() == [0, 0, 0, 1, 1, 1]


def test_completion_mask_after_eos_by_hand():
    ids = torch.tensor([[5, 0, 7, 0], [5, 6, 7, 8], [2, 9, 9, 9]])
    mask = completion_mask_after_eos(ids, [0, 2])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def test_completions_stop_after_their_first_eos():
    policy = lm_policy(lora=False, train=False)
    eos = policy.eos_token_ids

    def favour_eos(module, inputs, output):  # make EOS likely, in sampling and in recomputation
        output = output.clone()
        output[..., eos] += 4.0
        return output

    policy.model.lm_head.register_forward_hook(favour_eos)
    trajectory = policy.rollout(PROMPTS, group_size=4, generator=0, max_new_tokens=24)
    completion = trajectory.completion_ids
    stopped = 0
    for b in range(trajectory.batch_size):
        is_eos = torch.isin(completion[b], torch.tensor(eos))
        if not is_eos.any():
            assert trajectory.completion_mask[b].all()
            continue
        stopped += 1
        first = int(is_eos.nonzero()[0])
        assert trajectory.completion_mask[b].tolist() == [1] * (first + 1) + [0] * (
            len(completion[b]) - first - 1
        )
        assert torch.all(completion[b, first + 1 :] == policy.pad_token_id)
        assert torch.all(trajectory.attention_mask[b, trajectory.prompt_length + first + 1 :] == 0)
        assert torch.all(trajectory.log_probs[b, first + 1 :] == 0) and trajectory.log_probs[b, first] < 0
    assert stopped >= trajectory.batch_size // 2
    ratio = torch.exp(policy.log_prob(trajectory) - trajectory.log_probs)
    assert (ratio - 1).abs().max().item() == 0.0


def test_reference_under_lora_is_the_base_model():
    policy = lm_policy()
    perturb_lora(policy)
    trajectory = policy.rollout(PROMPTS, group_size=2, generator=1, max_new_tokens=8)
    base = LanguagePolicy(*qwen2_lm(seed=0), lora=None, train=False)
    with torch.no_grad():
        expected = base.log_prob(trajectory)
        with policy.reference():
            reference = policy.log_prob(trajectory)
        adapted = policy.log_prob(trajectory)
    assert torch.equal(reference, expected)
    assert not torch.allclose(adapted, expected)  # the adapters are back on after the context
    assert torch.equal(adapted, trajectory.log_probs)


def test_full_fine_tuning_keeps_a_frozen_reference_copy():
    policy = lm_policy(lora=False)
    trajectory = policy.rollout(PROMPTS, generator=2, max_new_tokens=8)
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.add_(0.05)
        with policy.reference():
            reference = policy.log_prob(trajectory)
        moved = policy.log_prob(trajectory)
    assert torch.equal(reference, trajectory.log_probs)
    assert not torch.allclose(moved, trajectory.log_probs)
    assert not policy.reference_module.training
    assert all(not p.requires_grad for p in policy.reference_module.parameters())


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_a_gradient_step_moves_log_probs_with_the_advantage(lora):
    policy = lm_policy(lora=lora)
    named = policy.named_trainable_parameters()
    assert named and (
        all("lora_" in n for n in named) if lora else len(named) == len(list(policy.model.parameters()))
    )
    trajectory = policy.rollout(PROMPTS[:1], generator=4, max_new_tokens=8)
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.05)
    for _ in range(2):  # LoRA's B starts at zero: A has no gradient until B moves
        optimizer.zero_grad()
        (-policy.log_prob(trajectory).sum()).backward()
        optimizer.step()
    with torch.no_grad():
        assert policy.log_prob(trajectory).sum() > trajectory.log_probs.sum()


def test_chat_template_is_an_option():
    policy = lm_policy(lora=False, train=False)
    chat = policy.rollout(PROMPTS[:1], generator=0, max_new_tokens=4)
    raw = policy.rollout(PROMPTS[:1], generator=0, max_new_tokens=4, chat_template=False)
    text = policy.tokenizer.decode(chat.input_ids[0, : chat.prompt_length])
    assert text.startswith("<|im_start|>user\na red circle") and text.endswith("<|im_start|>assistant\n")
    assert policy.tokenizer.decode(raw.input_ids[0, : raw.prompt_length]) == "a red circle"
    system = policy.rollout(PROMPTS[:1], generator=0, max_new_tokens=4, system_prompt="be brief")
    assert "<|im_start|>system\nbe brief" in policy.tokenizer.decode(system.input_ids[0])


def test_vlm_rollout_with_an_image():
    model, processor = llava_vlm(seed=0)
    policy = LanguagePolicy(model, processor, lora=LoRASpec(rank=4, target_modules=TARGETS))
    perturb_lora(policy)
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    trajectory = policy.rollout(
        ["what is this?", "describe it"], group_size=2, generator=0, max_new_tokens=6, images=images
    )
    assert trajectory.model_inputs["pixel_values"].shape[0] == 4 and trajectory.images.shape == (4, 3, 32, 32)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert int((trajectory.input_ids[0] == image_token).sum()) == 16  # (32 / 8) ** 2 image tokens
    ratio = torch.exp(policy.log_prob(trajectory) - trajectory.log_probs)
    assert (ratio - 1).abs().max().item() == 0.0
    sub = trajectory.select([3, 0])
    assert torch.equal(sub.model_inputs["pixel_values"][0], trajectory.model_inputs["pixel_values"][3])
    torch.testing.assert_close(policy.log_prob(sub).detach(), trajectory.log_probs[[3, 0]], atol=1e-6, rtol=0)
    # the image is seen: another image changes the log-probs of the same tokens
    swapped = trajectory.select([0, 1, 2, 3])
    swapped.model_inputs = {"pixel_values": trajectory.model_inputs["pixel_values"].flip(0)}
    assert not torch.allclose(policy.log_prob(swapped).detach(), trajectory.log_probs)


def test_loads_from_a_folder_like_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path / "cache"))
    policy = load_policy("language", "tiny:qwen2", lora={"rank": 2, "target_modules": ["q_proj", "v_proj"]})
    built = lm_policy(lora=False, train=False)
    trajectory = built.rollout(PROMPTS, generator=5, max_new_tokens=6)
    with torch.no_grad():
        assert torch.equal(policy.log_prob(trajectory), trajectory.log_probs)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_policy("language", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="name no module"):
        LanguagePolicy(*qwen2_lm(), lora=LoRASpec(rank=2))  # diffusers' to_q / to_k ... defaults


def test_saved_lora_adapter_reloads(tmp_path):
    policy = lm_policy()
    perturb_lora(policy)
    trajectory = policy.rollout(PROMPTS, generator=6, max_new_tokens=6)
    folder = policy.save_pretrained(tmp_path / "adapter")
    assert (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
    peft = pytest.importorskip("peft")
    base, _ = qwen2_lm(seed=0)
    reloaded = peft.PeftModel.from_pretrained(base, folder)
    again = LanguagePolicy(reloaded, policy.processor, lora=None, train=False)
    with torch.no_grad():
        torch.testing.assert_close(again.log_prob(trajectory), trajectory.log_probs, atol=1e-6, rtol=0)


def test_bad_rollout_arguments_are_refused():
    policy = lm_policy(lora=False, train=False)
    with pytest.raises(ValueError, match="max_new_tokens"):
        policy.rollout(PROMPTS, max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        policy.rollout(PROMPTS, temperature=0.0)
    with pytest.raises(ValueError, match="single string"):
        policy.rollout("a red circle")
    with pytest.raises(ValueError, match="text-only"):
        policy.rollout(PROMPTS, images=torch.rand(2, 3, 32, 32))
