"""``train`` settings a run cannot use, or that the selected loss or strategy would silently ignore,
are refused before any model loads with a one-line error naming the key
(:func:`genalign.trainers.preflight.check_train_settings`); every shipped recipe still passes."""

from __future__ import annotations

from pathlib import Path

import pytest

import genalign.policies
from genalign.cli import main
from genalign.config import ConfigError
from genalign.trainers import load_recipe
from genalign.trainers.preflight import check_recipe_names

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ASTROLABE = CONFIGS / "tiny" / "astrolabe_jpeg.yaml"
SFT = CONFIGS / "toy" / "rlrf_sft.yaml"
B2 = CONFIGS / "tiny" / "b2diffurl_jpeg.yaml"
SVG = CONFIGS / "toy" / "rlrf_im2svg.yaml"
Q_HAWKEYE = CONFIGS / "toy" / "q_hawkeye.yaml"
NFT = CONFIGS / "tiny" / "nft_jpeg.yaml"
DDPO = CONFIGS / "tiny" / "ddpo_jpeg.yaml"
RECIPES = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name != "accelerate")


def preflight(recipe: Path, overrides: list[str]) -> None:
    """Load ``recipe`` with ``overrides`` and run the checks the trainer runs before loading a model."""
    check_recipe_names(load_recipe(recipe, overrides))


@pytest.mark.parametrize(
    "recipe,overrides,key,instead",
    [
        # keys the selected loss ignores
        (ASTROLABE, ["train.kl_coef=0.1"], "train.kl_coef", "train.astrolabe.kl_weight"),
        (SFT, ["train.kl_coef=0.05"], "train.kl_coef", "no KL term"),
        # keys the selected strategy ignores
        (Q_HAWKEYE, ["train.advantage=tracker"], "train.advantage", "uncertainty-aware"),
        (Q_HAWKEYE, ["train.advantage_std=none"], "train.advantage_std", "uncertainty-aware"),
        (Q_HAWKEYE, ["train.tracker_buffer_size=8"], "train.tracker_buffer_size", "uncertainty-aware"),
        (Q_HAWKEYE, ["train.tracker_min_count=2"], "train.tracker_min_count", "uncertainty-aware"),
        (ASTROLABE, ["train.advantage=batch"], "train.advantage", "train.astrolabe.advantage_clip"),
        (ASTROLABE, ["train.advantage_std=global"], "train.advantage_std", "train.astrolabe.advantage_clip"),
        (ASTROLABE, ["train.advantage_clip=2.0"], "train.advantage_clip", "train.astrolabe.advantage_clip"),
        (ASTROLABE, ["train.tracker_min_count=4"], "train.tracker_min_count", "train.astrolabe"),
        (B2, ["train.advantage=batch"], "train.advantage", "train.b2diffurl.pos_weight"),
        (B2, ["train.advantage_std=none"], "train.advantage_std", "branch scores"),
        (SFT, ["train.advantage=batch"], "train.advantage", "no advantages"),
        # keys read only under another train.advantage mode
        (DDPO, ["train.advantage_std=none"], "train.advantage_std", "train.advantage: group"),
        (NFT, ["train.advantage=batch", "train.advantage_std=global"], "train.advantage_std", "group"),
        (SVG, ["train.svg.baseline=greedy", "train.advantage=tracker"], "train.advantage", "greedy baseline"),
        # a combination that breaks group_noise's whole-group minibatches
        (
            NFT,
            ["train.group_noise=true", "train.drop_zero_advantage=true"],
            "train.group_noise",
            "train.drop_zero_advantage",
        ),
        # values no run can use
        (DDPO, ["train.advantage_clip=0"], "train.advantage_clip", "positive"),
        (DDPO, ["train.advantage_clip=-1"], "train.advantage_clip", "positive"),
        (Q_HAWKEYE, ["train.advantage_clip=0"], "train.advantage_clip", "positive"),
        (DDPO, ["train.max_grad_norm=-1"], "train.max_grad_norm", "0: no gradient clipping"),
        (DDPO, ["train.learning_rate=-1e-4"], "train.learning_rate", ">= 0"),
        (DDPO, ["train.learning_rate=.inf"], "train.learning_rate", "finite"),
        (DDPO, ["train.learning_rate=.nan"], "train.learning_rate", "finite"),
        (DDPO, ["train.clip_range=-0.1"], "train.clip_range", "[0, 1]"),
        (DDPO, ["train.clip_range=1.5"], "train.clip_range", "[0, 1]"),
    ],
    ids=lambda value: value.name if isinstance(value, Path) else None,
)
def test_refused_with_a_one_line_error_naming_the_key(recipe, overrides, key, instead):
    preflight(recipe, [])  # the recipe itself passes: the override is what is refused
    with pytest.raises(ConfigError) as error:
        preflight(recipe, overrides)
    message = str(error.value)
    assert message.startswith(f"{key}") and "\n" not in message, message
    assert instead in message, message


@pytest.mark.parametrize(
    "recipe,overrides",
    [
        # an ignored key left at (or set to) its default keeps loading
        (ASTROLABE, ["train.kl_coef=0", "train.advantage=group", "train.advantage_std=group"]),
        (
            ASTROLABE,
            ["train.advantage_clip=5", "train.tracker_buffer_size=32", "train.astrolabe.kl_weight=0.001"],
        ),
        (SFT, ["train.kl_coef=0.0"]),
        (Q_HAWKEYE, ["train.advantage=group", "train.advantage_std=group", "train.tracker_min_count=16"]),
        # keys the method does read
        (DDPO, ["train.tracker_buffer_size=8", "train.tracker_min_count=2"]),
        (DDPO, ["train.advantage=group"]),  # a recipe's tracker_* stay when the mode is switched
        (NFT, ["train.advantage_std=none"]),
        (SVG, ["train.svg.baseline=greedy", "train.advantage_std=none"]),
        (Q_HAWKEYE, ["train.advantage_clip=2.0", "train.kl_coef=0.1"]),
        (NFT, ["train.group_noise=true"]),
        (NFT, ["train.drop_zero_advantage=true"]),
        # documented edge values: 0 is no gradient clipping, an lr-0 control run, an exact-ratio clip
        (DDPO, ["train.max_grad_norm=0", "train.learning_rate=0", "train.clip_range=0"]),
        (DDPO, ["train.clip_range=1", "train.advantage_clip=.inf"]),
    ],
    ids=lambda value: value.name if isinstance(value, Path) else None,
)
def test_defaults_and_used_keys_still_load(recipe, overrides):
    preflight(recipe, overrides)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_recipe_passes_the_checks(recipe):
    preflight(recipe, [])


def test_the_cli_reports_it_in_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the recipe's train settings were checked")

    monkeypatch.setattr(genalign.policies, "load_policy", refuse)
    argv = ["train", str(ASTROLABE), f"logging.run_dir={tmp_path}/run", "train.kl_coef=0.1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("genalign: error: train.kl_coef: the 'astrolabe' loss ignores it"), err
    assert "\n" not in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["sampling.eta=-1"], "sampling.eta must be >= 0, got -1"),
        (["sampling.training={eta: -0.5}"], "sampling.training.eta must be >= 0"),
        (["sampling.noise_level=-0.1"], "sampling.noise_level must be >= 0"),
        (["sampling.height=33"], "sampling.height must be a positive multiple of 8, got 33"),
        (["sampling.width=0"], "sampling.width must be a positive multiple of 8"),
        (["model.dtype=float17"], "model.dtype must be one of float32, float16, bfloat16"),
        (["model.lora.rank=0"], "model.lora.rank must be positive, got 0"),
    ],
)
def test_bad_model_and_sampling_values_are_refused_at_load_naming_the_key(overrides, message):
    # found by a new user: each failed only at step 0 (after a checkpoint was written) or inside torch
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_recipe(DDPO, overrides)


def test_a_recipe_without_a_model_section_says_so(tmp_path):
    recipe = tmp_path / "empty.yaml"
    recipe.write_text("# nothing yet\nname: x\n")
    with pytest.raises(ConfigError, match="model.path is required: the recipe has no model section"):
        load_recipe(recipe)
    recipe.write_text("name: x\nmodel: {family: sd, path: tiny:sd}\n")  # it had trained on "a photo"
    with pytest.raises(ConfigError, match="prompts is required: the recipe has no prompts section"):
        load_recipe(recipe)


def test_prompt_files_name_themselves_and_the_line(tmp_path):
    from genalign.trainers.prompt_pool import read_prompt_records

    binary = tmp_path / "prompts.txt"
    binary.write_bytes(b"a red circle\n\xff\xfe\n")
    config = load_recipe(DDPO, [f"prompts.file={binary}", "prompts.prompts=[]"])
    with pytest.raises(ConfigError, match=r"prompts\.file .*prompts\.txt is not UTF-8 text"):
        config.prompts.load()
    records = tmp_path / "records.jsonl"
    records.write_text('{"prompt": "a"}\n\n{"caption": "b"}\n')
    with pytest.raises(ValueError, match=r"records\.jsonl:3: a prompt record needs a 'prompt' key"):
        read_prompt_records(records)
