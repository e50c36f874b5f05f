"""A hub id that cannot be loaded (not cached, hub unreachable) fails at once with one line naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from genalign.utils import hub
from genalign.utils.hub import require_hub_access

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    """An empty hub cache and a hub that does not resolve."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hub, "hub_unreachable", lambda: "huggingface.co does not resolve: test")
    return tmp_path / "cache"


def test_an_uncached_hub_id_without_a_hub_fails_naming_it(no_hub):
    with pytest.raises(ConnectionError, match=r"org/model is not a local folder.*does not resolve: test"):
        require_hub_access("org/model")


def test_cached_ids_local_paths_and_prefixed_names_pass(no_hub, tmp_path, monkeypatch):
    (no_hub / "models--org--model").mkdir(parents=True)
    require_hub_access("org/model")  # in the cache: the loaders read it offline
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine" / "model").mkdir(parents=True)
    for value in ("mine/model", "/abs/a", "./a/b", "tiny:sd", "ViT-B-32", "a/b/c", "local-dir:x/y"):
        require_hub_access(value)


def test_a_reachable_hub_lets_the_loader_download(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hub, "hub_unreachable", lambda: None)
    require_hub_access("org/model")


def test_hub_unreachable_reads_offline_mode_and_proxies(monkeypatch):
    from huggingface_hub import constants

    hub.hub_unreachable.cache_clear()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert hub.hub_unreachable() == "HF_HUB_OFFLINE is set"
    hub.hub_unreachable.cache_clear()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")  # a proxy resolves for us: cannot tell
    assert hub.hub_unreachable() is None
    hub.hub_unreachable.cache_clear()


def test_the_cli_prints_one_line_for_an_uncached_model_offline(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "genalign.cli",
            "sample",
            "org/model",
            "--prompt",
            "a",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert errors == [
        f"genalign: error: org/model is not a local folder and not in the hub cache ({tmp_path / 'cache'}), "
        "and the Hugging Face hub cannot be reached (HF_HUB_OFFLINE is set): download it where there is a "
        "network, or give a local folder"
    ], result.stderr[-2000:]
