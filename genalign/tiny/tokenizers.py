"""Offline tokenizers for tiny models: nothing is downloaded.

* :func:`byte_level_clip_tokenizer` — a real ``CLIPTokenizer`` whose vocabulary is the 256
  byte symbols, each also in its end-of-word form, plus CLIP's two special tokens (514 ids).
  It needs no files and no training: every string tokenizes, one symbol per byte.
* :func:`train_bpe_tokenizer` — a byte-level BPE trained in milliseconds with ``tokenizers`` on a
  small corpus, wrapped as a ``PreTrainedTokenizerFast`` with the special tokens a causal LM
  or VLM needs (and optionally a chat template).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

from transformers import CLIPTokenizer, PreTrainedTokenizerFast

CLIP_BOS = "<|startoftext|>"
CLIP_EOS = "<|endoftext|>"


@lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible map from bytes to printable unicode symbols."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, codes)))


def byte_level_clip_tokenizer(model_max_length: int = 77) -> CLIPTokenizer:
    """A ``CLIPTokenizer`` over bytes (vocab size 514) built entirely in memory.

    Ids: 0..255 byte symbols, 256..511 the same with CLIP's ``</w>`` end-of-word suffix,
    512 ``<|startoftext|>``, 513 ``<|endoftext|>`` (also padding, as in CLIP).
    """
    symbols = [_bytes_to_unicode()[b] for b in range(256)]
    vocab = {s: i for i, s in enumerate(symbols)}
    vocab.update({s + "</w>": 256 + i for i, s in enumerate(symbols)})
    vocab[CLIP_BOS] = 512
    vocab[CLIP_EOS] = 513
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=model_max_length)


DEFAULT_CORPUS = (
    "a photo of a red circle",
    "two blue squares and a green triangle",
    "a yellow star to the left of a purple square",
    "does this image show the prompt? answer yes or no.",
    "yes",
    "no",
    "the quality of the image is excellent good fair poor bad",
    "<svg xmlns='http://www.w3.org/2000/svg' width='64' height='64'><rect x='1' y='2'/></svg>",
)

QWEN_STYLE_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_bpe_tokenizer(
    corpus: Iterable[str] = DEFAULT_CORPUS,
    vocab_size: int = 400,
    special_tokens: Sequence[str] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<pad>"),
    eos_token: str = "<|endoftext|>",
    pad_token: str = "<pad>",
    chat_template: str | None = QWEN_STYLE_CHAT_TEMPLATE,
    model_max_length: int = 2048,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``corpus`` (milliseconds) and wrap it for transformers.

    The 256 byte symbols are always in the vocabulary, so any text tokenizes. Special tokens get
    the first ids in the order given.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(corpus), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=eos_token,
        pad_token=pad_token,
        unk_token=None,
        model_max_length=model_max_length,
        additional_special_tokens=[t for t in special_tokens if t not in (eos_token, pad_token)],
    )
    if chat_template is not None:
        wrapped.chat_template = chat_template
    return wrapped
