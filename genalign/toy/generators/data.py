"""Training data of the toy generators: renders of train prompts with their captions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from genalign.toy.captions import CATEGORIES
from genalign.toy.generators.build import IMAGE_SIZE, tokenize
from genalign.toy.prompts import sample_scene_for_prompt
from genalign.toy.scenes import render_scenes, sample_scene


def toy_dataset(
    num_images: int,
    seed: int = 0,
    size: int = IMAGE_SIZE,
    unconditional_fraction: float = 0.15,
    backend: str = "skia",
    caption_noise: float = 0.0,
) -> tuple[torch.Tensor, list[str]]:
    """Renders and captions for training: ``(uint8 [N, 3, size, size], captions)``.

    Each image is, with probability ``unconditional_fraction``, a random layout of 1-4 random
    objects captioned ``""`` (it teaches the unconditional branch and the VAE more layouts without
    revealing any held-out combination); otherwise a category is drawn uniformly and a **train**
    prompt of it with a scene that satisfies it (:func:`sample_scene_for_prompt`).

    With probability ``caption_noise`` a captioned image shows a scene drawn for *another* train
    prompt of the same category while keeping the first prompt's caption: loose captions, as in
    web alt-text, where a caption describes a scene of the right kind but not this one. A generator
    trained on them draws the caption's scene only part of the time, the failure mode that RL on
    GenEval-style rewards corrects in real text-to-image models.
    """
    for name, value in (("unconditional_fraction", unconditional_fraction), ("caption_noise", caption_noise)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    rng = np.random.default_rng(seed)
    scenes, captions = [], []
    for _ in range(num_images):
        if rng.random() < unconditional_fraction:
            scenes.append(sample_scene(rng))
            captions.append("")
        else:
            category = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
            scene, caption, _ = sample_scene_for_prompt(category, rng, split="train")
            if caption_noise and rng.random() < caption_noise:
                scene = sample_scene_for_prompt(category, rng, split="train")[0]
            scenes.append(scene)
            captions.append(caption)
    chunks = [
        (render_scenes(scenes[i : i + 512], size, backend=backend) * 255).round().to(torch.uint8)
        for i in range(0, len(scenes), 512)
    ]
    return torch.cat(chunks), captions


def to_model_range(images: torch.Tensor) -> torch.Tensor:
    """uint8 images -> floats in [-1, 1], the VAE's input range."""
    return images.float() / 127.5 - 1.0


def random_crop(x: torch.Tensor, crop: int, grid: int, generator: torch.Generator) -> torch.Tensor:
    """A random ``crop`` x ``crop`` window of the last two (square) dimensions of ``x``, at multiples of
    ``grid`` (the autoencoder's spatial compression, so the window sits on the latent grid); the
    whole of ``x`` when ``crop`` is not smaller. The autoencoders train on such windows."""
    if crop >= x.shape[-1]:
        return x
    top, left = (
        grid * torch.randint(0, (x.shape[-1] - crop) // grid + 1, (2,), generator=generator)
    ).tolist()
    return x[..., top : top + crop, left : left + crop]


@torch.no_grad()
def encode_latents(vae, images: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Posterior means of uint8 images (unscaled latents)."""
    return torch.cat(
        [
            vae.encode(to_model_range(images[i : i + batch_size])).latent_dist.mean
            for i in range(0, len(images), batch_size)
        ]
    )


@dataclass
class CaptionedLatents:
    """Scaled latents ``[N, 4, h, w]`` of renders with their caption token ids ``[N, L]``."""

    latents: torch.Tensor
    ids: torch.Tensor
    empty_ids: torch.Tensor  # the empty prompt's ids [L]: the unconditional branch

    def draw(
        self, batch_size: int, caption_dropout: float, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch ``(z_0, token ids)``, each caption replaced by the empty prompt with
        probability ``caption_dropout`` (classifier-free guidance, Ho & Salimans 2022, Algorithm 1)."""
        index = torch.randint(len(self.latents), (batch_size,), generator=generator)
        z0, tokens = self.latents[index], self.ids[index].clone()
        tokens[torch.rand(batch_size, generator=generator) < caption_dropout] = self.empty_ids
        return z0, tokens


def captioned_latents(latents: torch.Tensor, tokenizer, captions) -> CaptionedLatents:
    """:class:`CaptionedLatents` of ``latents`` and their ``captions`` tokenized by ``tokenizer``."""
    return CaptionedLatents(latents, tokenize(tokenizer, captions), tokenize(tokenizer, [""])[0])
