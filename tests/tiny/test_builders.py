"""The tiny-model kit: every builder is deterministic, tiny, runs, and round-trips through disk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import DiffusionPipeline
from PIL import Image
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from genalign.tiny import (
    flux_pipeline,
    lcm_pipeline,
    llava_vlm,
    pixart_pipeline,
    qwen2_lm,
    sana_pipeline,
    sd3_pipeline,
    sd_pipeline,
    sdxl_pipeline,
)

MAX_BYTES = 5 * 1024 * 1024
PROMPT = "a red circle left of 2 blue squares"
TRICKY_TEXT = "x=12345, it's <svg width='64'/> é 日本\n\n  end"

# name -> (builder, builder kwargs, call kwargs for a 32 px image, expected pipeline class name)
PIPELINES: dict[str, tuple[Callable[..., DiffusionPipeline], dict, dict, str]] = {
    "sd": (sd_pipeline, {}, {}, "StableDiffusionPipeline"),
    "sd-euler-v": (
        sd_pipeline,
        {"scheduler": "euler", "prediction_type": "v_prediction"},
        {},
        "StableDiffusionPipeline",
    ),
    "sdxl": (sdxl_pipeline, {}, {}, "StableDiffusionXLPipeline"),
    "sd3": (sd3_pipeline, {}, {}, "StableDiffusion3Pipeline"),
    "sd3-t5": (sd3_pipeline, {"with_t5": True}, {}, "StableDiffusion3Pipeline"),
    # FluxPipeline and SanaPipeline pick large default sizes; ask for 32 px explicitly.
    "flux": (flux_pipeline, {}, {"height": 32, "width": 32}, "FluxPipeline"),
    "sana": (
        sana_pipeline,
        {},
        {"height": 32, "width": 32, "use_resolution_binning": False, "complex_human_instruction": None},
        "SanaPipeline",
    ),
    "lcm": (lcm_pipeline, {}, {}, "LatentConsistencyModelPipeline"),
    "flux-schnell": (flux_pipeline, {"schnell": True}, {"height": 32, "width": 32}, "FluxPipeline"),
    "pixart": (
        pixart_pipeline,
        {},
        {"use_resolution_binning": False, "clean_caption": False},
        "PixArtAlphaPipeline",
    ),
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from intra-op threads; on a busy 2-core machine the thread
    handoffs make a batch-2 UNet step ~50x slower, so this module runs single-threaded."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _generate(pipe: DiffusionPipeline, call_kwargs: dict, prompt: str | list[str] = PROMPT) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    out = pipe(prompt, num_inference_steps=2, output_type="pt", generator=generator, **call_kwargs)
    return out.images


def _folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _modules(pipe: DiffusionPipeline) -> dict[str, torch.nn.Module]:
    return {name: c for name, c in pipe.components.items() if isinstance(c, torch.nn.Module)}


# --------------------------------------------------------------------------------------------
# Diffusion pipelines
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PIPELINES))
def test_pipeline_round_trips_through_disk(name: str, tmp_path: Path) -> None:
    builder, build_kwargs, call_kwargs, class_name = PIPELINES[name]
    pipe = builder(seed=0, save_to=tmp_path, **build_kwargs)
    assert type(pipe).__name__ == class_name
    assert _folder_bytes(tmp_path) < MAX_BYTES

    # diffusers needs a T5-less SD3 folder's missing parts named, as for real checkpoints.
    missing = {
        n: None
        for n in ("text_encoder_3", "tokenizer_3")
        if n in pipe.components and pipe.components[n] is None
    }
    loaded = DiffusionPipeline.from_pretrained(tmp_path, **missing)
    assert type(loaded) is type(pipe)
    assert {n: type(c) for n, c in loaded.components.items()} == {
        n: type(c) for n, c in pipe.components.items()
    }
    assert dict(loaded.scheduler.config) | {"_use_default_values": None} == dict(pipe.scheduler.config) | {
        "_use_default_values": None
    }
    # Reloaded tokenizers split text exactly as the built ones (the T5/Gemma ones are made in code).
    for component, tokenizer in pipe.components.items():
        if component.startswith("tokenizer") and tokenizer is not None:
            assert loaded.components[component](TRICKY_TEXT).input_ids == tokenizer(TRICKY_TEXT).input_ids

    images = _generate(pipe, call_kwargs, [PROMPT, "two blue squares"])
    assert images.shape == (2, 3, 32, 32)
    assert torch.isfinite(images).all()
    assert images.min() >= 0.0 and images.max() <= 1.0
    assert images.std() > 0.02  # a picture, not a constant (random weights give smooth noise)

    reloaded_images = _generate(loaded, call_kwargs, [PROMPT, "two blue squares"])
    # Same weights; only float rounding (weights' memory alignment changes BLAS paths) may differ.
    torch.testing.assert_close(reloaded_images, images, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["sd", "sdxl", "sd3", "flux", "sana", "lcm", "pixart"])
def test_builders_are_seeded_and_leave_global_rng_alone(name: str) -> None:
    builder = PIPELINES[name][0]
    rng_before = torch.get_rng_state()
    first, again, other = builder(seed=0), builder(seed=0), builder(seed=1)
    assert torch.equal(torch.get_rng_state(), rng_before)

    for component, module in _modules(first).items():
        state, state_again, state_other = (
            module.state_dict(),
            _modules(again)[component].state_dict(),
            _modules(other)[component].state_dict(),
        )
        assert all(torch.equal(state[k], state_again[k]) for k in state), component
        assert any(not torch.equal(state[k], state_other[k]) for k in state), component


@pytest.mark.parametrize(
    ("name", "expected_side"),
    [("sd", 32), ("sdxl", 32), ("sd3", 32), ("lcm", 32), ("flux", 512), ("sana", 1024)],
)
def test_plain_call_uses_the_pipeline_default_size(name: str, expected_side: int) -> None:
    """``pipe(prompt, num_inference_steps=2, output_type="pt")`` works with no size given."""
    pipe = PIPELINES[name][0]()
    images = _generate(pipe, {})
    assert images.shape == (1, 3, expected_side, expected_side)
    assert images.min() >= 0.0 and images.max() <= 1.0


def test_sd_pipeline_options_reach_the_components() -> None:
    pipe = sd_pipeline(scheduler="dpm", prediction_type="v_prediction", sample_size=4)
    assert type(pipe.scheduler).__name__ == "DPMSolverMultistepScheduler"
    assert pipe.scheduler.config.prediction_type == "v_prediction"
    assert _generate(pipe, {}).shape == (1, 3, 16, 16)
    with pytest.raises(ValueError, match="scheduler"):
        sd_pipeline(scheduler="nope")


def test_prompt_conditions_the_sd_unet() -> None:
    """The text encoder is wired in: different prompts, same noise, different images."""
    pipe = sd_pipeline()
    a, b = _generate(pipe, {}, "a red circle"), _generate(pipe, {}, "zzzz zzzz")
    assert (a - b).abs().max() > 1e-4


# --------------------------------------------------------------------------------------------
# Language models
# --------------------------------------------------------------------------------------------


def test_qwen2_lm_round_trips_and_chats(tmp_path: Path) -> None:
    model, tokenizer = qwen2_lm(seed=0, save_to=tmp_path)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == len(tokenizer) == model.get_input_embeddings().num_embeddings
    assert _folder_bytes(tmp_path) < MAX_BYTES

    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "draw a red circle"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "<|im_start|>user\ndraw a red circle<|im_end|>\n<|im_start|>assistant\n"

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded_tokenizer(TRICKY_TEXT).input_ids == tokenizer(TRICKY_TEXT).input_ids
    assert loaded_tokenizer.padding_side == "left"
    assert (
        loaded_tokenizer.apply_chat_template(
            [{"role": "user", "content": "draw a red circle"}], tokenize=False, add_generation_prompt=True
        )
        == rendered
    )

    batch = tokenizer([rendered, "yes"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
        torch.testing.assert_close(loaded(**batch).logits, logits, rtol=0, atol=1e-6)
        # Left padding is handled: the short row's last logits match running it alone.
        alone = model(**tokenizer(["yes"], return_tensors="pt")).logits
    torch.testing.assert_close(logits[1, -1], alone[0, -1], rtol=1e-4, atol=1e-5)

    out = model.generate(**batch, max_new_tokens=3, do_sample=False)
    assert out.shape[0] == 2 and out.shape[1] <= batch.input_ids.shape[1] + 3
    assert model.generation_config.eos_token_id == [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.eos_token_id,
    ]


def _images(n: int) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)) for _ in range(n)]


@pytest.mark.parametrize("image_size", [32, 64])
def test_llava_vlm_round_trips_expands_images_and_generates(image_size: int, tmp_path: Path) -> None:
    model, processor = llava_vlm(seed=0, save_to=tmp_path, image_size=image_size)
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    assert type(model.model.vision_tower).__name__ == "CLIPVisionModel"
    assert _folder_bytes(tmp_path) < MAX_BYTES
    image_token_id = model.config.image_token_id
    assert processor.image_token_id == image_token_id == processor.tokenizer.convert_tokens_to_ids("<image>")

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a red circle?"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\n<image>a red circle?<|im_end|>\n<|im_start|>assistant\n"

    inputs = processor(text=[prompt, "<image>yes"], images=_images(2), return_tensors="pt", padding=True)
    tokens_per_image = (image_size // 8) ** 2
    assert inputs.pixel_values.shape == (2, 3, image_size, image_size)
    assert (inputs.input_ids == image_token_id).sum(dim=1).tolist() == [tokens_per_image] * 2
    assert inputs.attention_mask[1, 0] == 0 and inputs.attention_mask[:, -1].all()  # left padded

    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path)
    loaded_processor = AutoProcessor.from_pretrained(tmp_path)
    assert type(loaded).__name__ == "LlavaForConditionalGeneration"
    assert loaded_processor.apply_chat_template(messages, add_generation_prompt=True) == prompt
    loaded_inputs = loaded_processor(
        text=[prompt, "<image>yes"], images=_images(2), return_tensors="pt", padding=True
    )
    assert all(torch.equal(loaded_inputs[k], inputs[k]) for k in inputs)

    with torch.no_grad():
        logits = model(**inputs).logits
        torch.testing.assert_close(loaded(**inputs).logits, logits, rtol=0, atol=1e-6)
        # The image is wired in: other pixels, other logits.
        other = model(**(inputs | {"pixel_values": inputs.pixel_values.flip(0)})).logits
    assert (other - logits).abs().max() > 1e-5

    out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert out.shape[0] == 2 and out.shape[1] <= inputs.input_ids.shape[1] + 3


def test_llava_vlm_rejects_sizes_off_the_patch_grid() -> None:
    with pytest.raises(ValueError, match="multiple"):
        llava_vlm(image_size=30)
