"""RLG (Jin et al. 2025): w = 0 is the base model, w = 1 the RL-tuned one, on tiny SD, SDXL, SD3,
FLUX and SANA."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from diffusers import (
    FluxPipeline,
    SanaPipeline,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
)
from peft import LoraConfig, inject_adapter_in_model
from peft.utils import get_peft_model_state_dict

from genalign.pipelines import (
    RLGFluxPipeline,
    RLGPipeline,
    RLGSanaPipeline,
    RLGStableDiffusion3Pipeline,
    RLGStableDiffusionPipeline,
    RLGStableDiffusionXLPipeline,
    rlg_combine,
)
from genalign.tiny.diffusion import (
    flux_pipeline,
    lcm_pipeline,
    sana_pipeline,
    sd3_pipeline,
    sd_pipeline,
    sdxl_pipeline,
)

PROMPT = "a red circle"
TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def _add_lora(denoiser: torch.nn.Module, zero: bool = False, seed: int = 3) -> None:
    """A LoRA adapter standing in for RL fine-tuning: random A and B (B = 0 when ``zero``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        denoiser.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=TARGETS, init_lora_weights=zero))
        if not zero:
            for name, param in denoiser.named_parameters():
                if "lora_B" in name:
                    param.data.normal_(0.0, 0.3)


def _run(pipe, **kwargs) -> torch.Tensor:
    return pipe(
        PROMPT, num_inference_steps=3, generator=torch.Generator().manual_seed(0), output_type="pt", **kwargs
    ).images


FAMILIES = {
    "sd-ddim": (lambda: sd_pipeline(seed=0, scheduler="ddim"), "unet", {"guidance_scale": 3.0}),
    "sd-euler": (lambda: sd_pipeline(seed=0, scheduler="euler"), "unet", {"guidance_scale": 3.0}),
    # an LCM-distilled UNet (an RLCM run's, say) in the SD pipeline: guidance is an embedding, not CFG
    "sd-lcm": (
        lambda: StableDiffusionPipeline(**lcm_pipeline(seed=0).components, requires_safety_checker=False),
        "unet",
        {"guidance_scale": 4.0},
    ),
    "sd3": (lambda: sd3_pipeline(seed=0), "transformer", {"guidance_scale": 3.0}),
    "sdxl": (lambda: sdxl_pipeline(seed=0), "unet", {"guidance_scale": 3.0}),
    # FLUX.1-dev: the embedded guidance makes each branch's single pass already guided
    "flux": (
        lambda: flux_pipeline(seed=0),
        "transformer",
        {"guidance_scale": 3.5, "height": 32, "width": 32},
    ),
    # true CFG (negative prompt) on top, per branch, before the RLG mix
    "flux-true-cfg": (
        lambda: flux_pipeline(seed=0),
        "transformer",
        {
            "guidance_scale": 3.5,
            "true_cfg_scale": 2.0,
            "negative_prompt": "blurry",
            "height": 32,
            "width": 32,
        },
    ),
    "flux-schnell": (
        lambda: flux_pipeline(seed=0, schnell=True),
        "transformer",
        {"guidance_scale": 0.0, "height": 32, "width": 32, "max_sequence_length": 256},
    ),
    "sana": (
        lambda: sana_pipeline(seed=0),
        "transformer",
        {
            "guidance_scale": 3.0,
            "height": 32,
            "width": 32,
            "use_resolution_binning": False,
            "complex_human_instruction": None,
        },
    ),
}
RLG_CLASSES = (
    RLGStableDiffusionPipeline,
    RLGStableDiffusionXLPipeline,
    RLGStableDiffusion3Pipeline,
    RLGFluxPipeline,
    RLGSanaPipeline,
)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_scale_zero_is_base_and_one_is_rl(family):
    build, denoiser_name, kwargs = FAMILIES[family]
    base = build()
    expected_base = _run(base, **kwargs)
    _add_lora(getattr(base, denoiser_name))
    expected_rl = _run(base, **kwargs)  # the base pipeline with the LoRA active
    assert not torch.equal(expected_base, expected_rl)
    pipe = RLGPipeline.from_pipe(base)
    torch.testing.assert_close(_run(pipe, rlg_scale=0.0, **kwargs), expected_base, atol=0, rtol=0)
    torch.testing.assert_close(_run(pipe, rlg_scale=1.0, **kwargs), expected_rl, atol=0, rtol=0)
    between = _run(pipe, rlg_scale=0.5, **kwargs)
    assert not torch.equal(between, expected_base) and not torch.equal(between, expected_rl)


@pytest.mark.parametrize("family", ["sd-ddim", "sd3", "sdxl", "flux", "sana"])
def test_zero_lora_changes_nothing(family):
    build, denoiser_name, kwargs = FAMILIES[family]
    base = build()
    expected = _run(base, **kwargs)
    _add_lora(getattr(base, denoiser_name), zero=True)
    pipe = RLGPipeline.from_pipe(base)
    torch.testing.assert_close(_run(pipe, rlg_scale=2.5, **kwargs), expected, atol=0, rtol=0)


@pytest.mark.parametrize("family", ["sd-ddim", "sd3", "sdxl", "flux", "sana"])
def test_two_models_equal_lora_form(family):
    build, denoiser_name, kwargs = FAMILIES[family]
    base = build()
    _add_lora(getattr(base, denoiser_name))
    lora_form = _run(RLGPipeline.from_pipe(base), rlg_scale=1.7, **kwargs)
    merged = copy.deepcopy(getattr(base, denoiser_name))
    merged.fuse_lora()  # W + B A folded into the weights
    merged.unload_lora()  # a plain model again: no adapter layers left
    plain = build()  # the same seed: the same base weights, no adapter
    two_models = RLGPipeline.from_pipe(plain, **{f"rl_{denoiser_name}": merged})
    assert type(two_models) in RLG_CLASSES
    torch.testing.assert_close(_run(two_models, rlg_scale=1.7, **kwargs), lora_form, atol=1e-5, rtol=0)


def test_combination_formula():
    reference, rl = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    torch.testing.assert_close(rlg_combine(reference, rl, 1.5), reference + 1.5 * (rl - reference))
    assert rlg_combine(reference, rl, 0.0) is reference and rlg_combine(reference, rl, 1.0) is rl


def test_needs_an_rl_model():
    pipe = RLGPipeline.from_pipe(sd_pipeline(seed=0))
    with pytest.raises(ValueError, match="RL-tuned model"):
        _run(pipe, rlg_scale=1.0)


def test_from_pretrained_picks_the_family(tmp_path):
    sd_pipeline(seed=0, save_to=tmp_path / "sd")
    sd3_pipeline(seed=0, save_to=tmp_path / "sd3")
    sdxl_pipeline(seed=0, save_to=tmp_path / "sdxl")
    flux_pipeline(seed=0, save_to=tmp_path / "flux")
    sana_pipeline(seed=0, save_to=tmp_path / "sana")
    expected = {
        "sd": (RLGStableDiffusionPipeline, StableDiffusionPipeline),
        "sd3": (RLGStableDiffusion3Pipeline, StableDiffusion3Pipeline),
        "sdxl": (RLGStableDiffusionXLPipeline, StableDiffusionXLPipeline),
        "flux": (RLGFluxPipeline, FluxPipeline),
        "sana": (RLGSanaPipeline, SanaPipeline),
    }
    for folder, (rlg_class, diffusers_class) in expected.items():
        pipe = RLGPipeline.from_pretrained(str(tmp_path / folder))
        assert type(pipe) is rlg_class and isinstance(pipe, diffusers_class), folder


@pytest.mark.parametrize("family", ["sdxl", "flux"])
def test_lora_file_loaded_with_load_lora_weights(family, tmp_path):
    """The RL-tuned model as a saved diffusers LoRA, loaded the way `genalign rlg` loads it."""
    build, denoiser_name, kwargs = FAMILIES[family]
    base = build()
    expected_base = _run(base, **kwargs)
    _add_lora(getattr(base, denoiser_name))
    expected_rl = _run(base, **kwargs)
    layers = {f"{denoiser_name}_lora_layers": get_peft_model_state_dict(getattr(base, denoiser_name))}
    type(base).save_lora_weights(tmp_path / "lora", **layers)
    build().save_pretrained(tmp_path / "base")
    pipe = RLGPipeline.from_pretrained(str(tmp_path / "base"))
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(str(tmp_path / "lora"), adapter_name="rl")
    torch.testing.assert_close(_run(pipe, rlg_scale=0.0, **kwargs), expected_base, atol=1e-6, rtol=0)
    torch.testing.assert_close(_run(pipe, rlg_scale=1.0, **kwargs), expected_rl, atol=1e-6, rtol=0)


def test_load_rl_lora_is_quiet_for_a_denoiser_lora_and_names_a_wrong_one(tmp_path):
    sd = sd_pipeline(seed=0)
    _add_lora(sd.unet)
    StableDiffusionPipeline.save_lora_weights(
        tmp_path / "sd_lora", unet_lora_layers=get_peft_model_state_dict(sd.unet)
    )
    pipe = RLGPipeline.from_pipe(sd_pipeline(seed=0))
    notices: list[str] = []
    recorder = logging.Handler()
    recorder.emit = lambda record: notices.append(record.getMessage())
    lora_logger = logging.getLogger("diffusers.loaders.lora_base")
    lora_logger.addHandler(recorder)
    try:
        pipe.load_rl_lora(str(tmp_path / "sd_lora"))
        assert not [m for m in notices if "No LoRA keys" in m]  # a denoiser-only LoRA: the notice is moot
        other = RLGPipeline.from_pipe(sd_pipeline(seed=0))
        other.load_lora_weights(str(tmp_path / "sd_lora"), adapter_name="rl")
        assert [m for m in notices if "No LoRA keys" in m]  # what the plain call prints
    finally:
        lora_logger.removeHandler(recorder)
    assert pipe.rl_denoiser is None and pipe.get_active_adapters() == ["rl"]
    # an SD LoRA on an SDXL pipeline: one line naming both, not 28 size mismatches
    sdxl = RLGPipeline.from_pipe(sdxl_pipeline(seed=0))
    with pytest.raises(
        ValueError, match=r"the LoRA .*sd_lora does not fit this RLGStableDiffusionXLPipeline: "
    ) as error:
        sdxl.load_rl_lora(str(tmp_path / "sd_lora"))
    assert "\n" not in str(error.value)
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "meta.json").write_text("{}")
    with pytest.raises(ValueError, match="is a training checkpoint; pass the run's final/ folder"):
        pipe.load_rl_lora(str(tmp_path / "checkpoint"))


def test_text_encoder_lora_is_disabled_in_the_reference_branch():
    base = sd_pipeline(seed=0)
    kwargs = {"guidance_scale": 3.0}
    expected_base = _run(base, **kwargs)
    _add_lora(base.unet)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        # peft directly: transformers' own adapter API needs a newer peft than installed
        inject_adapter_in_model(
            LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False), base.text_encoder
        )
    expected_rl = _run(base, **kwargs)
    pipe = RLGPipeline.from_pipe(base)
    torch.testing.assert_close(_run(pipe, rlg_scale=0.0, **kwargs), expected_base, atol=0, rtol=0)
    torch.testing.assert_close(_run(pipe, rlg_scale=1.0, **kwargs), expected_rl, atol=0, rtol=0)
