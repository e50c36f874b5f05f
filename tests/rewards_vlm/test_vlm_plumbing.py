"""VLM plumbing: loading, images -> PIL, answer-word token ids, batched next-token logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genalign.rewards.vlm import (
    RATING_TEMPLATES,
    YES_NO_TEMPLATES,
    VLMJudge,
    aggregate_word_logits,
    load_vlm,
    pad_to_square,
    resolve_word_ids,
    surface_forms,
    to_pil_images,
    word_token_ids,
)
from genalign.tiny.language import llava_vlm

from . import chat_text, last_logits, token_ids, uint8_images


@pytest.fixture(scope="module")
def tiny_llava():
    return llava_vlm(seed=0)


def test_to_pil_images_round_trip_and_square_padding():
    images = uint8_images(2, 6, 10, seed=1)
    pil = to_pil_images(images)
    assert [image.size for image in pil] == [(10, 6), (10, 6)]
    back = torch.stack([torch.from_numpy(np.array(image)).permute(2, 0, 1) for image in pil])
    torch.testing.assert_close(back.float() / 255, images)

    square = pad_to_square(images[0], (0.0, 1.0, 0.5))  # (3, 10, 10), image in rows 2..7
    assert square.shape == (3, 10, 10)
    torch.testing.assert_close(square[:, 2:8], images[0])
    torch.testing.assert_close(square[:, 0, 0], torch.tensor([0.0, 1.0, 0.5]))
    assert to_pil_images(images, square_fill=(0.5, 0.5, 0.5))[0].size == (10, 10)


def test_surface_forms():
    assert surface_forms("yes", YES_NO_TEMPLATES) == ["yes", " yes", "Yes", " Yes", "YES", " YES"]
    assert surface_forms("good", RATING_TEMPLATES) == ["good", " good"]


def test_word_ids_single_tokens_and_multi_token_policies(tiny_llava):
    tokenizer = tiny_llava[1].tokenizer
    # the tiny BPE has "yes" and " yes" as single tokens; "Yes" is Y+es, " Yes" is Ġ+Y+es
    assert word_token_ids(tokenizer, "yes", YES_NO_TEMPLATES) == token_ids(tokenizer, ["yes", "Ġyes"])
    first = word_token_ids(tokenizer, "yes", YES_NO_TEMPLATES, multi_token="first")
    assert set(first) == set(token_ids(tokenizer, ["yes", "Ġyes", "Y", "Ġ"]))
    # "excellent" is never one token: the fallback takes the first piece of each form
    assert set(word_token_ids(tokenizer, "excellent", RATING_TEMPLATES)) == set(
        token_ids(tokenizer, ["ex", "Ġex"])
    )
    assert word_token_ids(tokenizer, "excellent", RATING_TEMPLATES, multi_token="skip") == []


def test_shared_first_tokens_are_dropped_from_both_words(tiny_llava, caplog):
    tokenizer = tiny_llava[1].tokenizer
    yes, no = resolve_word_ids(tokenizer, ["yes", "no"], YES_NO_TEMPLATES, multi_token="first")
    # " Yes" and " No" both begin with the bare-space piece "Ġ": it can vote for neither
    assert set(yes) == set(token_ids(tokenizer, ["yes", "Ġyes", "Y"]))
    assert set(no) == set(token_ids(tokenizer, ["no", "Ġno", "N"]))
    assert "shared" in caplog.text


def test_word_without_usable_token_is_an_error(tiny_llava):
    with pytest.raises(ValueError, match="excellent"):
        resolve_word_ids(tiny_llava[1].tokenizer, ["excellent", "bad"], RATING_TEMPLATES, multi_token="skip")
    with pytest.raises(ValueError, match="multi_token"):
        word_token_ids(tiny_llava[1].tokenizer, "yes", multi_token="all")


def test_aggregate_word_logits_is_logsumexp():
    logits = torch.randn(3, 10)
    out = aggregate_word_logits(logits, [[1, 4], [7]])
    torch.testing.assert_close(out[:, 0], torch.log(logits[:, 1].exp() + logits[:, 4].exp()))
    torch.testing.assert_close(out[:, 1], logits[:, 7])


def test_render_and_batched_logits_equal_single_chats(tiny_llava):
    model, processor = tiny_llava
    judge = VLMJudge(model, processor, batch_size=2)
    assert judge.tokenizer.padding_side == "left"
    chats = [
        [judge.message("user", "Is it red?", images=1)],
        [
            judge.message("system", "Be strict."),
            judge.message("user", parts=["A:", None, "B:", None, "Same?"]),
        ],
        [judge.message("user", "Rate it.", images=1)],
    ]
    texts = [judge.render(chats[0]), judge.render(chats[1]), judge.render(chats[2], "It is")]
    assert texts[0] == chat_text(("user", "<image>Is it red?"))
    assert texts[1] == chat_text(("system", "Be strict."), ("user", "A:<image>B:<image>Same?"))
    assert texts[2] == chat_text(("user", "<image>Rate it."), generation_prompt="It is")
    images = uint8_images(4, 32, 40, seed=2)
    image_lists = [[images[0]], [images[1], images[2]], [images[3]]]
    batched = judge.next_token_logits(texts, image_lists)  # chats of different lengths: padded
    assert batched.shape == (3, len(judge.tokenizer)) and batched.dtype == torch.float32
    for row, (text, sample_images) in enumerate(zip(texts, image_lists)):
        torch.testing.assert_close(
            batched[row], last_logits(model, processor, text, sample_images), atol=1e-5, rtol=0
        )


LLAVA_15_GENERATION_END = "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"


def test_an_answer_prefix_after_a_template_ending_on_a_word_is_spaced(tiny_llava):
    """LLaVA-1.5's template ends the generation prompt with "ASSISTANT:" and no space; Q-Align's
    prompt reads "ASSISTANT: The quality of the image is", so the prefix must not be glued on."""
    _, processor = tiny_llava
    judge = VLMJudge(tiny_llava[0], processor)
    chat = [judge.message("user", "How would you rate the quality of this image?", images=1)]
    chatml = judge.render(chat, "The quality of the image is")
    assert chatml.endswith("assistant\nThe quality of the image is")  # ends on whitespace: unchanged
    original = processor.chat_template
    processor.chat_template = (
        "{% for message in messages %}{{ message['role'].upper() + ': ' }}"
        "{% for c in message['content'] %}{% if c['type'] == 'image' %}{{ '<image>\n' }}"
        "{% else %}{{ c['text'] + ' ' }}{% endif %}{% endfor %}{% endfor %}" + LLAVA_15_GENERATION_END
    )
    try:
        assert judge.render(chat, "The quality of the image is").endswith(
            "ASSISTANT: The quality of the image is"
        )
        assert judge.render(chat, " It is").endswith("ASSISTANT: It is")  # a prefix's own space is kept
        assert judge.render(chat).endswith("ASSISTANT:")  # no prefix, nothing added
    finally:
        processor.chat_template = original


def test_load_from_saved_folder_gives_same_logits(tmp_path):
    model, processor = llava_vlm(seed=3, save_to=tmp_path)
    built = VLMJudge(model, processor)
    loaded = VLMJudge(str(tmp_path))
    text = built.render([built.message("user", "Is it red?", images=1)])
    assert loaded.render([loaded.message("user", "Is it red?", images=1)]) == text
    images = [[image] for image in uint8_images(2, 32, 32, seed=4)]
    torch.testing.assert_close(
        loaded.next_token_logits([text] * 2, images), built.next_token_logits([text] * 2, images)
    )


def test_load_errors(tiny_llava, tmp_path):
    with pytest.raises(ValueError, match="processor"):
        load_vlm(tiny_llava[0])
    with pytest.raises(FileNotFoundError, match="not found"):
        load_vlm(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="batch_size"):
        VLMJudge(*tiny_llava, batch_size=0)


def test_synonyms_pool_their_ids(tiny_llava):
    tokenizer = tiny_llava[1].tokenizer
    (good_or_fair, poor) = resolve_word_ids(tokenizer, [("good", "fair"), "poor"], RATING_TEMPLATES)
    assert set(good_or_fair) == set(token_ids(tokenizer, ["Ġgood", "fair", "Ġfair"]))
    assert set(poor) == set(token_ids(tokenizer, ["p", "Ġpoo"]))


def test_pad_to_square_uses_the_processor_mean(tiny_llava):
    model, processor = tiny_llava
    judge = VLMJudge(model, processor, pad_to_square=True)
    image = uint8_images(1, 24, 32, seed=6)[0]
    mean = torch.tensor(processor.image_processor.image_mean)
    padded = mean.view(3, 1, 1).expand(3, 32, 32).clone()
    padded[:, 4:28] = image  # centred vertically; round to uint8 as the PIL conversion does
    padded = (padded * 255).round() / 255
    text = judge.render([judge.message("user", "Is it red?", images=1)])
    torch.testing.assert_close(
        judge.next_token_logits([text], [[image]])[0],
        last_logits(model, processor, text, [padded]),
        atol=1e-5,
        rtol=0,
    )
