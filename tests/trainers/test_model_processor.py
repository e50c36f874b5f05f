"""``model.processor``: keyword arguments of a language model's processor, e.g. a Qwen-VL's
``max_pixels``. The cap reaches the processor (a large image is resized to fit, with fewer image
tokens), is saved with the trained model, and reaches the policy a recipe builds; a wrong value
or family is a one-line recipe error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genalign.config import ConfigError
from genalign.policies import load_policy
from genalign.policies.token_trajectory import TokenSettings
from genalign.trainers import build_trainer, load_recipe

ROOT = Path(__file__).resolve().parents[2]
KONIQ = ROOT / "configs" / "qwen25vl" / "q_hawkeye_koniq.yaml"
DEMO = ROOT / "configs" / "toy" / "demo.yaml"
CAP = 16 * 16  # pixels: a 64 x 64 image becomes a 16 x 16 one (a 4 x 4 grid of the tiny 4-px patches)


@pytest.fixture(autouse=True)
def _tiny_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GENALIGN_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))


def image_grid(policy) -> list[int]:
    """The ``image_grid_thw`` the policy's processor gives one 64 x 64 image."""
    image = torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0))
    settings = TokenSettings(max_new_tokens=4, temperature=1.0, chat_template=True)
    encoded = policy.encode_prompts(["a red circle"], settings, images=[image])
    return encoded["image_grid_thw"].reshape(-1).tolist()


def test_max_pixels_reaches_the_processor_and_is_saved(tmp_path):
    default = load_policy("language", "tiny:qwen25_vl", lora=None, train=False)
    capped = load_policy(
        "language", "tiny:qwen25_vl", lora=None, train=False, processor_kwargs={"max_pixels": CAP}
    )
    t, h, w = image_grid(capped)
    assert image_grid(default) == [1, 16, 16]  # the checkpoint's own limits keep 64 x 64
    assert t == 1 and h * w * 4 * 4 <= CAP and h * w < 16 * 16  # resized to fit the cap
    capped.save_pretrained(tmp_path / "final")
    reloaded = load_policy("language", tmp_path / "final", lora=None, train=False)
    assert image_grid(reloaded) == [t, h, w]  # the trained model's folder keeps the cap


def test_a_recipe_passes_model_processor_to_the_policy(tmp_path):
    config = load_recipe(
        KONIQ,
        [
            f"logging.run_dir={tmp_path}/run",
            "model.path=tiny:qwen25_vl",
            "model.dtype=float32",
            "train.mixed_precision=no",
            f"model.processor={{max_pixels: {CAP}}}",
            "prompts.source=genalign.toy.quality:toy_quality_pool",
            "prompts.source_kwargs={split: train, scenes: 1, seed: 0}",
        ],
    )
    assert config.model.policy_options()["processor_kwargs"] == {"max_pixels": CAP}
    trainer = build_trainer(config, base_dir=KONIQ.parent)
    t, h, w = image_grid(trainer.policy)
    assert h * w * 4 * 4 <= CAP


def test_the_koniq_recipe_caps_the_image_area():
    assert load_recipe(KONIQ).model.processor == {"max_pixels": 786432}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.processor=[max_pixels]", "model.processor: expected a mapping"),
        ("model.processor={max_pixels: 4096}", "model.processor is for the 'language' family"),
    ],
)
def test_wrong_processor_settings_are_recipe_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(DEMO, [override])


def test_the_cap_is_part_of_the_fingerprint_and_an_unset_one_is_not():
    capped = load_recipe(KONIQ)
    uncapped = load_recipe(KONIQ, ["model.processor={}"])
    assert capped.fingerprint() != uncapped.fingerprint()  # a resume with another cap is not the run
    assert "processor" not in uncapped.fingerprint_data()["model"]  # older runs' fingerprints hold
    assert "processor" not in load_recipe(DEMO).fingerprint_data()["model"]
