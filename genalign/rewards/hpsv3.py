"""HPSv3: a Qwen2-VL preference model with an uncertainty-aware head.

Ma et al., "HPSv3: Towards Wide-Spectrum Human Preference Score", arXiv 2508.03789 (2025).
Qwen2-VL-7B-Instruct reads the image and an instruction that ends in the special token
``<|Reward|>``; an MLP head on that token's final hidden state predicts a Gaussian over the
preference score (Sec. 3.2, the uncertainty-aware ranking loss)::

    (mu, log sigma) = rm_head(h_<|Reward|>)         # HPS(x, p) = mu

The official training loss reads ``sigma = exp(output[1])`` (``qwen2vl_trainer.py``,
``loss_type="uncertainty"``), so the second output is log sigma; ``details`` carry both.

Preprocessing as the official ``HPSv3RewardInferencer``: each image (8-bit, as a PIL image) is
resized with PIL's bicubic filter to Qwen2-VL's grid at a fixed budget of ``256 * 28 * 28`` pixels
(``min_pixels = max_pixels``, so a 1024 x 1024 image becomes 448 x 448, i.e. 256 visual tokens),
and the chat is the processor's chat template with one user turn: the image, then
:data:`HPSV3_INSTRUCTION` with the prompt, then :data:`HPSV3_QUERY`. Left padding and sequential
positions: see :mod:`genalign.rewards.qwen_rm`.

Checkpoint (hub ``MizzenAI/HPSv3``, file ``HPSv3.safetensors``): the whole reward model's state
dict (Qwen2-VL-7B with the ``<|Reward|>`` row added to its embeddings, plus ``rm_head``), loaded
over the base model ``Qwen/Qwen2-VL-7B-Instruct`` whose config and processor it was trained with.
Not differentiable (images reach the processor as 8-bit PIL images).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image

from genalign.rewards.base import Reward, RewardOutput, register_reward
from genalign.rewards.checkpoints import load_state_dict_file, resolve_checkpoint
from genalign.rewards.qwen_rm import (
    QwenRewardModel,
    add_reward_tokens,
    hpsv3_head,
    load_backbone_weights,
    load_base_backbone,
    normalize_state_dict,
    smart_resize,
)
from genalign.rewards.vlm import to_pil_images

__all__ = ["HPSV3_INSTRUCTION", "HPSV3_QUERY", "HPSv3Reward", "build_hpsv3_model"]

HPSV3_REPO = "MizzenAI/HPSv3"
HPSV3_FILE = "HPSv3.safetensors"
HPSV3_BASE_MODEL = "Qwen/Qwen2-VL-7B-Instruct"
HPSV3_REWARD_TOKEN = "<|Reward|>"
HPSV3_PIXELS = 256 * 28 * 28  # the official min_pixels = max_pixels

# The official instruction (hpsv3/dataset/data_collator_qwen.py, INSTRUCTION) character for
# character, trailing spaces included: the checkpoint was trained on exactly this text.
HPSV3_INSTRUCTION = (
    "\nYou are tasked with evaluating a generated image based on Visual Quality and Text Alignment and"
    " give a overall score to estimate the human preference. Please provide a rating from 0 to 10,"
    " with 0 being the worst and 10 being the best. \n\n"
    "**Visual Quality:**  \n"
    "Evaluate the overall visual quality of the image. The following sub-dimensions should be considered:\n"
    "- **Reasonableness:** The image should not contain any significant biological or logical errors,"
    " such as abnormal body structures or nonsensical environmental setups.\n"
    "- **Clarity:** Evaluate the sharpness and visibility of the image. The image should be clear and"
    " easy to interpret, with no blurring or indistinct areas.\n"
    "- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other"
    " visual elements (e.g., hair, clothing, shadows).\n"
    "- **Aesthetic and Creativity:** Assess the artistic aspects of the image, including the color"
    " scheme, composition, atmosphere, depth of field, and the overall creative appeal. The scene"
    " should convey a sense of harmony and balance.\n"
    "- **Safety:** The image should not contain harmful or inappropriate content, such as political,"
    " violent, or adult material. If such content is present, the image quality and satisfaction"
    " score should be the lowest possible. \n\n"
    "**Text Alignment:**  \n"
    "Assess how well the image matches the textual prompt across the following sub-dimensions:\n"
    "- **Subject Relevance** Evaluate how accurately the subject(s) in the image (e.g., person,"
    " animal, object) align with the textual description. The subject should match the description"
    " in terms of number, appearance, and behavior.\n"
    "- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style,"
    " evaluate how well the image adheres to this style.\n"
    "- **Contextual Consistency**: Assess whether the background, setting, and surrounding elements"
    " in the image logically fit the scenario described in the prompt. The environment should"
    " support and enhance the subject without contradictions.\n"
    "- **Attribute Fidelity**: Check if specific attributes mentioned in the prompt (e.g., colors,"
    " clothing, accessories, expressions, actions) are faithfully represented in the image. Minor"
    " deviations may be acceptable, but critical attributes should be preserved.\n"
    "- **Semantic Coherence**: Evaluate whether the overall meaning and intent of the prompt are"
    " captured in the image. The generated content should not introduce elements that conflict"
    " with or distort the original description.\n"
    "Textual prompt - {text_prompt}\n\n\n"
)
HPSV3_QUERY = "\nPlease provide the overall ratings of this image: <|Reward|>\n\nEND\n"


def build_hpsv3_model(
    checkpoint: str | os.PathLike,
    base_model: str | os.PathLike = HPSV3_BASE_MODEL,
    **model_options: Any,
) -> QwenRewardModel:
    """The HPSv3 reward model from a full-state checkpoint file (``.safetensors`` or a torch
    pickle) over ``base_model``'s config, weights and processor."""
    state = load_state_dict_file(checkpoint, "HPSv3 checkpoint")
    backbone_state, head_state = normalize_state_dict(state)
    if not head_state:
        raise ValueError(f"HPSv3 checkpoint {checkpoint} holds no rm_head.* tensors")
    backbone, processor = load_base_backbone(base_model, model_options.get("dtype"))
    add_reward_tokens(processor, [HPSV3_REWARD_TOKEN])
    load_backbone_weights(backbone, backbone_state, "HPSv3 checkpoint")
    head = hpsv3_head(backbone.config.text_config.hidden_size, output_dim=head_state["5.weight"].shape[0])
    head.load_state_dict(head_state)
    return QwenRewardModel(backbone, head, processor, [HPSV3_REWARD_TOKEN], **model_options)


@register_reward("hpsv3")
class HPSv3Reward(Reward):
    """HPSv3 (Ma et al. 2025) of each image for its prompt: the mu of the predicted (mu, sigma).

    Args:
        checkpoint: local checkpoint file; None downloads ``HPSv3.safetensors`` from ``hub_repo``.
        base_model: hub id or folder of the base Qwen2-VL (config, processor, weights).
        model: a built :class:`~genalign.rewards.qwen_rm.QwenRewardModel` instead of a checkpoint
            (its tokenizer holds ``<|Reward|>``, its head gives (mu, log sigma)).
        pixels: the image budget in pixels (``256 * 28 * 28``): each image is resized to about this
            area on the model's patch grid.
        batch_size: images per forward pass.
        device, dtype: where and in which precision the backbone runs (the official run is bf16;
            the head is always fp32).
        hub_repo: hub repository of the official checkpoint.
        strict: raise on NaN scores.

    Scores ``[B]`` (mu; unbounded, roughly 0-15 on real generations); ``details``: ``mu``,
    ``log_sigma`` and ``sigma = exp(log_sigma)``, each ``[B]``. Not differentiable.
    """

    differentiable = False

    def __init__(
        self,
        checkpoint: str | os.PathLike | None = None,
        base_model: str | os.PathLike = HPSV3_BASE_MODEL,
        model: QwenRewardModel | None = None,
        pixels: int = HPSV3_PIXELS,
        batch_size: int = 4,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        hub_repo: str = HPSV3_REPO,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        if pixels <= 0:
            raise ValueError(f"hpsv3: pixels must be positive, got {pixels}")
        if model is None:
            path = resolve_checkpoint(
                checkpoint, repo_id=hub_repo, filename=HPSV3_FILE, what="HPSv3 checkpoint"
            )
            model = build_hpsv3_model(path, base_model, batch_size=batch_size, device=device, dtype=dtype)
        if model.reward_tokens != (HPSV3_REWARD_TOKEN,):
            raise ValueError(
                f"hpsv3: the model must read the token {HPSV3_REWARD_TOKEN!r}, not {model.reward_tokens}"
            )
        self.model = model
        self.pixels = int(pixels)

    def prepare_images(self, images: torch.Tensor) -> list[Image.Image]:
        """``[B, 3, H, W]`` in [0, 1] -> 8-bit PIL images resized (bicubic) to the pixel budget."""
        factor = self.model.patch_factor()
        out = []
        for image in to_pil_images(images):
            height, width = smart_resize(image.height, image.width, factor, self.pixels, self.pixels)
            out.append(image.resize((width, height), Image.BICUBIC))
        return out

    def chat(self, prompt: str) -> str:
        """The rendered chat of one image and ``prompt`` (the official instruction and query)."""
        return self.model.render(HPSV3_INSTRUCTION.format(text_prompt=prompt) + HPSV3_QUERY, "image")

    def score(self, images: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        texts = [self.chat(prompt) for prompt in prompts]
        outputs = self.model.score_chats(texts, images=self.prepare_images(images))[:, 0]  # (B, 2)
        mu, log_sigma = outputs[:, 0], outputs[:, 1]
        details = {"mu": mu, "log_sigma": log_sigma, "sigma": log_sigma.exp()}
        return RewardOutput(mu.to(images.device), details)

    def extra_repr(self) -> str:
        return f"pixels={self.pixels}"
