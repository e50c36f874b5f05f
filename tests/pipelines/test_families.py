"""The one table of model families, the dispatchers that read it, and the shared guidance formula."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from genalign.pipelines import ReNOPipeline, RLGPipeline, apply_guidance, rlg_combine
from genalign.pipelines.families import (
    MODEL_FAMILIES,
    pipeline_class_for,
    pipeline_classes,
    policy_families,
)
from genalign.pipelines.guidance import guided_prediction
from genalign.policies import list_policies
from genalign.tiny.diffusion import lcm_pipeline


@pytest.mark.parametrize("method", ["rlg", "reno"])
def test_every_entry_imports_and_accepts_its_own_name(method):
    for name, path in pipeline_classes(method).items():
        pipeline_class = pipeline_class_for(method, name)
        assert f"{pipeline_class.__module__}:{pipeline_class.__name__}" == path, name
        assert pipeline_class_for(method, pipeline_class.__name__) is pipeline_class


def test_policy_families_are_registered_policies():
    families = policy_families()
    assert families == {
        "StableDiffusionPipeline": "sd",
        "StableDiffusionXLPipeline": "sd",
        "StableDiffusion3Pipeline": "flow",
        "FluxPipeline": "flow",
        "SanaPipeline": "flow",
        "LatentConsistencyModelPipeline": "consistency",
    }
    assert set(families.values()) <= set(list_policies())
    assert set(families) <= set(MODEL_FAMILIES)


def test_dispatchers_pick_from_the_table_and_name_what_they_support():
    assert RLGPipeline.pipeline_class_for("SanaPipeline").__name__ == "RLGSanaPipeline"
    assert ReNOPipeline.pipeline_class_for("ReNOPipeline").__name__ == "ReNOStableDiffusionPipeline"
    # a class hierarchy: the first known name wins
    assert ReNOPipeline.pipeline_class_for(["MyPipeline", "PixArtAlphaPipeline"]).__name__ == (
        "ReNOPixArtAlphaPipeline"
    )
    with pytest.raises(ValueError, match="RLG supports .*got PixArtAlphaPipeline"):
        RLGPipeline.pipeline_class_for("PixArtAlphaPipeline")
    with pytest.raises(TypeError, match="from_pretrained"):
        RLGPipeline()
    with pytest.deprecated_call():
        assert ReNOPipeline.family("FluxPipeline") is ReNOPipeline.pipeline_class_for("FluxPipeline")


def test_reno_pipeline_from_components_is_the_sd_layout_pipeline():
    base = lcm_pipeline(seed=0)
    components = {
        name: getattr(base, name) for name in ("vae", "text_encoder", "tokenizer", "unet", "scheduler")
    }
    pipe = ReNOPipeline(**components)
    assert type(pipe).__name__ == "ReNOStableDiffusionPipeline" and pipe.unet is base.unet


def test_reading_the_table_imports_no_model_library():
    code = (
        "import sys, genalign.pipelines.families as f; f.policy_families(); print('diffusers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_guidance_formulas_by_hand():
    uncond, cond = torch.tensor([[1.0, -2.0]]), torch.tensor([[3.0, 0.5]])
    expected = torch.tensor([[1.0 + 7.5 * 2.0, -2.0 + 7.5 * 2.5]])
    torch.testing.assert_close(guided_prediction(uncond, cond, 7.5), expected)
    torch.testing.assert_close(apply_guidance(torch.cat([uncond, cond]), 7.5), expected)
    batch = torch.cat([uncond, cond])
    assert apply_guidance(batch, 7.5, do_cfg=False) is batch
    # RLG is the same extrapolation between the reference and the RL-tuned prediction
    torch.testing.assert_close(rlg_combine(uncond, cond, 7.5), expected)


def test_flow_entries_match_the_flow_policy_architectures():
    from genalign.policies.flow import FLOW_ARCHITECTURES

    flow = {name for name, family in policy_families().items() if family == "flow"}
    assert flow == set(FLOW_ARCHITECTURES)


def test_every_reno_family_fills_the_mixins_hooks():
    # ReNOMixin's _encode and _predict are per-family hooks that raise when left out: every ReNO
    # class of the table must define _encode, and _predict unless it replaces the whole _denoise
    import importlib

    from genalign.pipelines.families import MODEL_FAMILIES
    from genalign.pipelines.reno.common import ReNOMixin

    checked = set()
    for family in MODEL_FAMILIES.values():
        if family.reno is None or family.reno in checked:
            continue
        checked.add(family.reno)
        module, _, name = family.reno.partition(":")
        cls = getattr(importlib.import_module(module), name)
        assert cls._encode is not ReNOMixin._encode, cls
        assert cls._predict is not ReNOMixin._predict or cls._denoise is not ReNOMixin._denoise, cls
    assert len(checked) >= 4
