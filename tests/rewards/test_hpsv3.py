"""HPSv3 on a tiny Qwen2-VL: the score against a hand computation, padding, the reward token, the
official checkpoint layout and bad input."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from genalign.rewards import list_rewards, load_reward
from genalign.rewards.hpsv3 import HPSV3_INSTRUCTION, HPSV3_QUERY, HPSv3Reward
from genalign.tiny.qwen_rm import hpsv3_checkpoint, qwen2_vl_base

from .helpers import qwen_hidden_by_hand, uint8_images

PIXELS = 1024  # 16 visual tokens of 8 x 8 px on the tiny model (the real budget is 256 * 28 * 28)
PROMPTS = ["a red circle", "two blue squares on a long wooden table", "a star"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny base folder, an HPSv3 checkpoint file over it, and the reward model it stands for."""
    folder = tmp_path_factory.mktemp("hpsv3")
    base, processor = qwen2_vl_base(save_to=folder / "base")
    reference = hpsv3_checkpoint(base, processor, folder / "HPSv3.safetensors")
    return folder, reference


@pytest.fixture(scope="module")
def reward(tiny):
    return HPSv3Reward(model=tiny[1], pixels=PIXELS, batch_size=3)


def _by_hand(reference, image: torch.Tensor, prompt: str, at: str = "reward") -> torch.Tensor:
    """(mu, log sigma) computed without the reward's code: PIL resize to the size worked out by
    hand, the chat template, the backbone with positions 0..L-1, the MLP written out."""
    pil = Image.fromarray((image * 255).round().byte().permute(1, 2, 0).numpy())
    pil = pil.resize((32, 24), Image.BICUBIC)  # 40 x 48 at 1024 px on an 8-px grid -> 24 x 32
    message = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": ""}]}
    message["content"][1]["text"] = HPSV3_INSTRUCTION.format(text_prompt=prompt) + HPSV3_QUERY
    input_ids, hidden = qwen_hidden_by_hand(reference, message, images=[pil])
    token = reference.processor.tokenizer.convert_tokens_to_ids("<|Reward|>")
    index = (input_ids == token).nonzero().item() if at == "reward" else len(input_ids) - 1
    layers = reference.head
    h = torch.relu(hidden[index] @ layers[0].weight.T + layers[0].bias)
    h = torch.relu(h @ layers[3].weight.T + layers[3].bias)
    return h @ layers[5].weight.T + layers[5].bias


def test_score_is_mu_of_the_head_at_the_reward_token(reward, tiny):
    images = uint8_images(2, 40, 48, seed=3)
    assert [im.size for im in reward.prepare_images(images)] == [(32, 24), (32, 24)]
    out = reward(images, PROMPTS[:2])
    for i in range(2):
        expected = _by_hand(tiny[1], images[i], PROMPTS[i])
        torch.testing.assert_close(out.scores[i], expected[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.details["log_sigma"][i], expected[1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.details["sigma"][i], expected[1].exp(), atol=1e-5, rtol=1e-5)
        # reading the head at the last token instead would give another number
        assert not torch.allclose(_by_hand(tiny[1], images[i], PROMPTS[i], at="last"), expected, atol=1e-4)


def test_batch_equals_rows_one_at_a_time(reward):
    # prompts of different lengths give chats of different lengths, so rows are left padded
    images = uint8_images(3, 40, 48, seed=5)
    texts = [reward.chat(p) for p in PROMPTS]
    lengths = {len(reward.model.processor.tokenizer(t)["input_ids"]) for t in texts}
    assert len(lengths) == 3
    rows = torch.cat([reward(images[i : i + 1], [PROMPTS[i]]).scores for i in range(3)])
    out = reward(images, PROMPTS)
    torch.testing.assert_close(out.scores, rows, atol=1e-5, rtol=1e-5)
    assert out.scores.unique().numel() == 3


def test_chat_without_the_reward_token_is_an_error(reward):
    model = reward.model
    text = model.render("no reward token here", "image")
    with pytest.raises(ValueError, match=r"reward token\(s\) \('<\|Reward\|>',\) once; found \[0\]"):
        model.score_chats([text], images=reward.prepare_images(uint8_images(1, 32, 32)))


def test_loads_the_official_checkpoint_layout(tiny, reward, tmp_path):
    folder, _ = tiny
    images, prompts = uint8_images(2, 40, 48, seed=7), PROMPTS[:2]
    expected = reward(images, prompts).scores
    loaded = HPSv3Reward(checkpoint=folder / "HPSv3.safetensors", base_model=folder / "base", pixels=PIXELS)
    torch.testing.assert_close(loaded(images, prompts).scores, expected, atol=1e-5, rtol=1e-5)
    # the same weights under transformers < 4.52 names (model.layers..., visual...) load too
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "HPSv3.safetensors"))
    old = {}
    for key, value in state.items():
        key = key.replace("model.language_model.", "model.", 1).replace("model.visual.", "visual.", 1)
        old[key] = value
    save_file(old, str(tmp_path / "old.safetensors"))
    legacy = load_reward(
        "hpsv3", checkpoint=tmp_path / "old.safetensors", base_model=folder / "base", pixels=PIXELS
    )
    torch.testing.assert_close(legacy(images, prompts).scores, expected, atol=1e-5, rtol=1e-5)
    assert "hpsv3" in list_rewards()


def test_bad_input_raises_one_line_errors(reward, tmp_path):
    with pytest.raises(ValueError, match=r"3 channels.*\(2, 4, 32, 32\)") as error:
        reward(torch.rand(2, 4, 32, 32), PROMPTS[:2])
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="pixels must be positive, got 0"):
        HPSv3Reward(model=reward.model, pixels=0)
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        HPSv3Reward(checkpoint=tmp_path / "missing.safetensors")
