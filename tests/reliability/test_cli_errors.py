"""User errors become one line, ``genalign: error: ...``, naming the file, key or line; names are
checked before any model loads; ``--debug`` shows the traceback (issue 23.6)."""

from __future__ import annotations

import errno

import pytest

import genalign.policies
from genalign.cli import describe_error, main
from genalign.config import ConfigError
from genalign.trainers import load_recipe

from .conftest import SMALL, TINY_SD


def _train(tmp_path, *overrides: str) -> list[str]:
    return ["train", str(TINY_SD), *SMALL, f"logging.run_dir={tmp_path}/run", *overrides]


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the recipe's names were checked")

    monkeypatch.setattr(genalign.policies, "load_policy", refuse)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("genalign: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_yaml_syntax_error_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {family: sd\ntrain:\n  num_steps: 2\n")
    assert main(["train", str(bad)]) == 2
    err = _one_line_error(capsys)
    assert "bad.yaml: invalid YAML at line" in err


@pytest.mark.parametrize(
    "override,message",
    [
        ("train.loss=losss", "train.loss: unknown loss 'losss'"),
        (
            "train.strategy=strategys",
            "train.strategy: unknown rollout strategy 'strategys'; registered",
        ),
        (
            "reward.name=jpeg_compresibility",
            "reward.name: unknown reward 'jpeg_compresibility' (did you mean",
        ),
        ("reward.name=no_such_module:Reward", "reward.name: cannot import module 'no_such_module'"),
        (
            "reward.kwargs.qualty=90",
            "reward.kwargs: reward 'jpeg_compressibility' takes no option 'qualty'",
        ),
        ("model.family=gan train.method=grpo", "model.family: unknown policy family 'gan'"),
        (
            "reward.name=collections:OrderedDict",
            "reward.name: <class 'collections.OrderedDict'> is not a genalign",
        ),
        ("logging.run_dir=runs/{0}", "logging.run_dir 'runs/{0}': the only placeholder allowed is {name}"),
        ("logging.run_dir=", "logging.run_dir is empty: a run needs its own folder"),  # not the cwd
        ("train.num_steps=[1", "override 'train.num_steps=[1': the value is not valid YAML"),
    ],
)
def test_bad_names_fail_before_any_model_loads(tmp_path, capsys, no_model_loads, override, message):
    argv = _train(tmp_path, *override.split())
    if override.startswith("logging.run_dir"):
        argv = ["train", str(TINY_SD), override]
    assert main(argv) == 2
    assert message in _one_line_error(capsys)


def test_yes_no_on_off_reach_string_options_as_strings():
    config = load_recipe(
        TINY_SD, ["train.mixed_precision=no", "logging.progress=off", "logging.overwrite=yes"]
    )
    assert config.train.mixed_precision == "no"
    assert config.logging.progress is False and config.logging.overwrite is True


def test_sample_with_an_unknown_dtype_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sample", "tiny:sd", "--dtype", "float17", "--prompt", "x"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'float17'" in capsys.readouterr().err


def test_debug_shows_the_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        main(["--debug", "train", str(bad)])


def test_disk_full_and_unexpected_errors_read_as_one_line():
    full = OSError(errno.ENOSPC, "No space left on device", "/runs/x/checkpoints/tmp/optimizer.json")
    assert (
        describe_error(full) == "[Errno 28] No space left on device: '/runs/x/checkpoints/tmp/optimizer.json'"
    )
    unexpected = describe_error(RuntimeError("reward returned scores of shape (3,)\nmore"))
    assert (
        unexpected.startswith("RuntimeError: reward returned scores of shape (3,)")
        and "--debug" in unexpected
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (["reno", "./no/such/model", "--prompt", "x"], "model folder ./no/such/model does not exist"),
        (["sample", "./no/such/model", "--prompt", "x"], "model folder ./no/such/model does not exist"),
        (
            ["rlg", "./no/such/model", "--rl-lora", "x", "--prompt", "x"],
            "model folder ./no/such/model does not exist",
        ),
    ],
)
def test_a_missing_local_model_is_named_not_blamed_on_the_hub(argv, message, tmp_path, capsys):
    # found by a new user: these had reported a failed connection to huggingface.co
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert message in _one_line_error(capsys)


def test_rlg_names_a_missing_lora(tmp_path, capsys):
    argv = [
        "rlg",
        "tiny:sd",
        "--rl-lora",
        "./runs/nosuch/final",
        "--prompt",
        "x",
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after tiny:sd's first build, if any
    assert last == "genalign: error: --rl-lora ./runs/nosuch/final does not exist"


@pytest.mark.parametrize(
    "argv",
    [
        ["reno", "tiny:lcm", "--prompt", "x", "--steps", "0"],
        ["rlg", "tiny:sd", "--rl-lora", "x", "--prompt", "x", "--num-images", "0"],
        ["rlg", "tiny:sd", "--rl-lora", "x", "--prompt", "x", "--steps", "0"],
    ],
)
def test_counts_below_one_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert "must be >= 1, got 0" in capsys.readouterr().err


def test_debug_after_the_subcommand_shows_the_traceback(tmp_path):
    with pytest.raises(ConfigError, match="train.num_steps"):
        main(_train(tmp_path, "train.num_steps=x", "--debug"))
