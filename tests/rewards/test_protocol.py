"""The Reward contract, checked on every registered reward built from its tiny model."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from genalign.rewards import AestheticMLP, Reward, RewardOutput, list_rewards, load_reward

from .helpers import PROMPTS, uint8_images

ALL_REWARDS = [
    "aesthetic",
    "clip",
    "ensemble",
    "hpsv2",
    "jpeg_compressibility",
    "jpeg_incompressibility",
    "pickscore",
]


@pytest.fixture
def build(tiny_hf_clip, tiny_open_clip, hps_checkpoints, aesthetic_checkpoint) -> Callable[..., Reward]:
    hf = str(tiny_hf_clip.folder)
    kwargs = {
        "clip": {"model": tiny_open_clip.name, "pretrained": str(tiny_open_clip.weights)},
        "pickscore": {"model": hf, "processor": hf},
        "hpsv2": {"checkpoint": str(hps_checkpoints["official"]), "model": tiny_open_clip.name},
        "aesthetic": {"checkpoint": str(aesthetic_checkpoint), "model": hf},
        "jpeg_compressibility": {},
        "jpeg_incompressibility": {},
        "ensemble": {
            "members": [
                {"name": "clip", "kwargs": {"backend": "transformers", "model": hf}},
                {
                    "name": "aesthetic",
                    "weight": 0.5,
                    "kwargs": {"checkpoint": str(aesthetic_checkpoint), "model": hf},
                },
            ]
        },
    }

    def build(name: str, **extra) -> Reward:
        return load_reward(name, **{**kwargs[name], **extra})

    return build


def test_registry_lists_every_reward():
    assert set(ALL_REWARDS) <= set(list_rewards())


def test_unknown_name_lists_registered_rewards():
    with pytest.raises(KeyError, match="registered rewards: aesthetic, clip"):
        load_reward("imagereward9000")


def test_module_path_loads_without_registration():
    reward = load_reward("genalign.rewards.jpeg:JPEGCompressibilityReward", quality=90)
    assert reward.quality == 90


@pytest.mark.parametrize("name", ALL_REWARDS)
def test_batch_equals_one_at_a_time(build, name):
    reward = build(name)
    images = uint8_images(4, 40, 48, seed=13)
    batched = reward(images, PROMPTS).scores
    single = torch.cat([reward(images[i : i + 1], PROMPTS[i : i + 1]).scores for i in range(len(PROMPTS))])
    assert batched.shape == (4,) and batched.dtype == torch.float32
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", [n for n in ALL_REWARDS if not n.startswith("jpeg")])
def test_gradients_reach_the_images(build, name):
    reward = build(name)
    assert reward.differentiable
    images = uint8_images(2, 40, 48, seed=14).requires_grad_(True)
    scores = reward(images, PROMPTS[:2]).scores
    assert scores.requires_grad
    (grad,) = torch.autograd.grad(scores.sum(), images)
    assert torch.isfinite(grad).all() and (grad.flatten(1).abs().sum(1) > 0).all()


@pytest.mark.parametrize("name", ["clip", "pickscore", "hpsv2", "aesthetic"])
def test_no_graph_without_gradients_and_dtype_follows_the_model(build, name):
    reward = build(name)
    images = uint8_images(2, 32, 32, seed=15)
    scores = reward(images, PROMPTS[:2]).scores
    assert not scores.requires_grad  # scored under no_grad when images need no gradient
    reward.to(torch.float64)
    scores64 = reward(images, PROMPTS[:2]).scores
    assert scores64.dtype == torch.float32
    torch.testing.assert_close(scores64, scores, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "images, prompts, message",
    [
        (uint8_images(2, 16, 16) * 2, PROMPTS[:2], r"\[0, 1\].*\(2, 3, 16, 16\)"),
        (uint8_images(1, 16, 16)[0], PROMPTS[:1], r"\[B, 3, H, W\].*\(3, 16, 16\)"),
        (torch.rand(2, 4, 16, 16), PROMPTS[:2], r"3 channels.*\(2, 4, 16, 16\)"),
        (uint8_images(3, 16, 16), PROMPTS[:2], r"3 images \(shape \(3, 3, 16, 16\)\) but 2 prompts"),
        (uint8_images(1, 16, 16), "a red circle", "single string"),
    ],
)
def test_bad_inputs_raise_value_errors_naming_the_shape(build, images, prompts, message):
    reward = build("clip")
    with pytest.raises(ValueError, match=message):
        reward(images, prompts)


@pytest.fixture
def nan_head(tmp_path, tiny_hf_clip):
    head = AestheticMLP(tiny_hf_clip.model.config.projection_dim)
    state = head.state_dict()
    state["layers.7.bias"] = torch.tensor([float("nan")])
    path = tmp_path / "nan_head.pth"
    torch.save(state, path)
    return path


def test_nan_scores_are_reported_and_raise_in_strict_mode(build, nan_head):
    images = uint8_images(3, 32, 32)
    out = build("aesthetic", checkpoint=str(nan_head))(images, PROMPTS[:3])
    assert out.details["nan_count"] == 3
    with pytest.raises(FloatingPointError, match="3 of 3 scores are not finite"):
        build("aesthetic", checkpoint=str(nan_head), strict=True)(images, PROMPTS[:3])


class FixedScores(Reward):
    """Returns the scores it was built with (a reward whose head overflowed, say)."""

    name = "fixed_scores_test"

    def __init__(self, scores: list[float], strict: bool = False) -> None:
        super().__init__(strict=strict)
        self.values = torch.tensor(scores)

    def score(self, images, prompts, **metadata):
        return RewardOutput(self.values.clone(), {})


def test_infinite_scores_count_as_non_finite_and_raise_in_strict_mode():
    images = uint8_images(3, 8, 8)
    out = FixedScores([1.0, float("inf"), float("-inf")])(images, PROMPTS[:3])
    assert out.details["nan_count"] == 2
    with pytest.raises(FloatingPointError, match=r"2 of 3 scores are not finite \(indices \[1, 2\]\)"):
        FixedScores([1.0, float("inf"), float("-inf")], strict=True)(images, PROMPTS[:3])


def test_missing_model_folder_and_open_clip_checkpoint_name_the_path(tmp_path, tiny_open_clip):
    with pytest.raises(FileNotFoundError, match="no_such_folder"):
        load_reward("clip", backend="transformers", model=str(tmp_path / "no_such_folder"))
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        load_reward("clip", model=tiny_open_clip.name, pretrained=str(tmp_path / "missing.safetensors"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "name", ["clip", "pickscore", "hpsv2", "aesthetic", "ensemble", "jpeg_incompressibility"]
)
def test_cuda_matches_cpu_and_runs_in_bfloat16(build, name):
    images = uint8_images(4, 40, 48, seed=16)
    cpu = build(name)(images, PROMPTS).scores
    reward = (
        build(name, device="cuda")
        if name not in ("ensemble", "jpeg_incompressibility")
        else build(name).to("cuda")
    )
    cuda_images = images.cuda().requires_grad_(reward.differentiable)
    out = reward(cuda_images, PROMPTS)
    assert out.scores.device.type == "cuda"
    torch.testing.assert_close(out.scores.detach().cpu(), cpu, atol=1e-3, rtol=1e-3)
    if reward.differentiable:
        (grad,) = torch.autograd.grad(out.scores.sum(), cuda_images)
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0
        reward.to(torch.bfloat16)
        low = reward(images.cuda(), PROMPTS).scores.cpu()
        assert torch.isfinite(low).all()
        torch.testing.assert_close(low, cpu, atol=0.1 * cpu.abs().max().item() + 0.05, rtol=0.1)
