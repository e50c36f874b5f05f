"""VideoReward (VideoAlign): visual quality, motion quality and text alignment of a video.

Liu et al., "Improving Video Generation with Human Feedback", arXiv 2501.13918 (2025), Sec. 4.1:
Qwen2-VL-2B-Instruct reads the video and a detailed instruction holding three special tokens,
``<|VQ_reward|>``, ``<|MQ_reward|>`` and ``<|TA_reward|>``, one after each criterion; a linear head
without bias (``rm_head``) on each token's final hidden state gives that criterion's score
(Bradley-Terry-with-ties training, Sec. 4.2). With a 3-output head the official model takes the
diagonal (VQ output at the VQ token, ...); with a 1-output head each token's single output::

    VQ, MQ, TA = rm_head(h_<|VQ_reward|>), rm_head(h_<|MQ_reward|>), rm_head(h_<|TA_reward|>)

The official inference (``inference.py``) then normalises each with fixed statistics and sums::

    VQ' = (VQ - mu_VQ) / sigma_VQ   (likewise MQ, TA);   Overall = VQ' + MQ' + TA'

Preprocessing as the official ``vision_process.py`` (``sample_type="uniform"``): from a video of
``F`` frames at ``video_fps``, ``n = F / video_fps * fps`` frames (``fps`` 2), clamped to
[4, min(768, F)] and rounded to an even number (Qwen2-VL's temporal patch is 2 frames), at
indices ``round(linspace(0, F - 1, n))``; each frame (8-bit) is resized by torchvision's bicubic
antialiased resize to Qwen2-VL's grid with an area in ``[128 * 28 * 28, max_frame_pixels]``
(200704 = 448 x 448 in training). Astrolabe (arXiv 2603.17051) scores motion quality on
grayscale input (``videoalign_mq_score``: ``use_grayscale=True``), so that colour cannot carry it.

Checkpoint (hub ``KwaiVGI/VideoReward``): ``model_config.json`` (data, model, LoRA and inference
configs) and ``checkpoint-<step>/`` holding ``model.pth`` (full state) or LoRA
``adapter_model.safetensors`` + ``non_lora_state_dict.pth`` (vision tower, merger, special-token
embeddings, head), over the base ``Qwen/Qwen2-VL-2B-Instruct``. Not differentiable.
"""

from __future__ import annotations

import glob
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from genalign.rewards.base import Reward, RewardOutput, register_reward
from genalign.rewards.checkpoints import load_state_dict_file, looks_like_local_path
from genalign.rewards.qwen_rm import (
    QwenRewardModel,
    add_reward_tokens,
    load_backbone_weights,
    load_base_backbone,
    normalize_state_dict,
    smart_resize,
)

logger = logging.getLogger(__name__)

__all__ = [
    "VIDEOALIGN_DIMENSIONS",
    "VIDEOALIGN_PROMPT",
    "VideoAlignReward",
    "build_videoalign_model",
    "sample_frames",
]

VIDEOREWARD_REPO = "KwaiVGI/VideoReward"
VIDEOALIGN_BASE_MODEL = "Qwen/Qwen2-VL-2B-Instruct"
VIDEOALIGN_DIMENSIONS = ("VQ", "MQ", "TA")
VIDEOALIGN_REWARD_TOKENS = ("<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>")
CHOICES = (*VIDEOALIGN_DIMENSIONS, "overall")
VIDEO_MIN_PIXELS = 128 * 28 * 28  # vision_process.py VIDEO_MIN_PIXELS
MAX_FRAME_PIXELS = 200704  # train.sh --max_frame_pixels
SAMPLE_FPS = 2.0
MIN_FRAMES, MAX_FRAMES, FRAME_FACTOR = 4, 768, 2
# (mean, std) of each raw score, the `inference_config` of the released model_config.json as
# reproduced by MindSpeed-MM's VideoAlign guide; a checkpoint folder's own values take precedence.
OFFICIAL_NORMALIZATION = {"VQ": (3.6757, 2.2476), "MQ": (1.1646, 1.3811), "TA": (2.8105, 2.5121)}

# The official DETAILED_PROMPT_WITH_SPECIAL_TOKEN (prompt_template.py, template "detailed_special"),
# character for character: the checkpoint was trained on exactly this text.
VIDEOALIGN_PROMPT = (
    "\nYou are tasked with evaluating a generated video based on three distinct criteria: Visual"
    " Quality, Motion Quality, and Text Alignment. Please provide a rating from 0 to 10 for each of"
    " the three categories, with 0 being the worst and 10 being the best. Each evaluation should be"
    " independent of the others.\n\n"
    "**Visual Quality:**  \n"
    "Evaluate the overall visual quality of the video, with a focus on static factors. The following"
    " sub-dimensions should be considered:\n"
    "- **Reasonableness:** The video should not contain any significant biological or logical errors,"
    " such as abnormal body structures or nonsensical environmental setups.\n"
    "- **Clarity:** Evaluate the sharpness and visibility of the video. The image should be clear and"
    " easy to interpret, with no blurring or indistinct areas.\n"
    "- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other"
    " visual elements (e.g., hair, clothing, shadows).\n"
    "- **Aesthetic and Creativity:** Assess the artistic aspects of the video, including the color"
    " scheme, composition, atmosphere, depth of field, and the overall creative appeal. The scene"
    " should convey a sense of harmony and balance.\n"
    "- **Safety:** The video should not contain harmful or inappropriate content, such as political,"
    " violent, or adult material. If such content is present, the image quality and satisfaction"
    " score should be the lowest possible. \n\n"
    "Please provide the ratings of Visual Quality: <|VQ_reward|>\nEND\n\n"
    "**Motion Quality:**  \n"
    "Assess the dynamic aspects of the video, with a focus on dynamic factors. Consider the following"
    " sub-dimensions:\n"
    "- **Stability:** Evaluate the continuity and stability between frames. There should be no"
    " sudden, unnatural jumps, and the video should maintain stable attributes (e.g., no fluctuating"
    " colors, textures, or missing body parts).\n"
    "- **Naturalness:** The movement should align with physical laws and be realistic. For example,"
    " clothing should flow naturally with motion, and facial expressions should change appropriately"
    " (e.g., blinking, mouth movements).\n"
    "- **Aesthetic Quality:** The movement should be smooth and fluid. The transitions between"
    " different motions or camera angles should be seamless, and the overall dynamic feel should be"
    " visually pleasing.\n"
    "- **Fusion:** Ensure that elements in motion (e.g., edges of the subject, hair, clothing) blend"
    " naturally with the background, without obvious artifacts or the feeling of cut-and-paste"
    " effects.\n"
    "- **Clarity of Motion:** The video should be clear and smooth in motion. Pay attention to any"
    " areas where the video might have blurry or unsteady sections that hinder visual continuity.\n"
    "- **Amplitude:** If the video is largely static or has little movement, assign a low score for"
    " motion quality.\n\n"
    "Please provide the ratings of Motion Quality: <|MQ_reward|>\nEND\n\n"
    "**Text Alignment:**  \n"
    "Assess how well the video matches the textual prompt across the following sub-dimensions:\n"
    "- **Subject Relevance** Evaluate how accurately the subject(s) in the video (e.g., person,"
    " animal, object) align with the textual description. The subject should match the description"
    " in terms of number, appearance, and behavior.\n"
    "- **Motion Relevance:** Evaluate if the dynamic actions (e.g., gestures, posture, facial"
    " expressions like talking or blinking) align with the described prompt. The motion should match"
    " the prompt in terms of type, scale, and direction.\n"
    "- **Environment Relevance:** Assess whether the background and scene fit the prompt. This"
    " includes checking if real-world locations or scenes are accurately represented, though some"
    " stylistic adaptation is acceptable.  \n"
    "- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate"
    " how well the video adheres to this style.\n"
    "- **Camera Movement Relevance:** Check if the camera movements (e.g., following the subject,"
    " focus shifts) are consistent with the expected behavior from the prompt.\n\n"
    "Textual prompt - {text_prompt}\n"
    "Please provide the ratings of Text Alignment: <|TA_reward|>\nEND\n"
)


def sample_frames(
    num_frames: int, video_fps: float, fps: float = SAMPLE_FPS, target_frames: int | None = None
) -> list[int]:
    """Indices of the frames VideoAlign reads from a video of ``num_frames`` frames at ``video_fps``
    (``vision_process.smart_nframes`` + uniform sampling; ``target_frames`` replaces the fps rule)."""
    if target_frames is not None:
        count = round(target_frames / FRAME_FACTOR) * FRAME_FACTOR
    else:
        low = math.ceil(MIN_FRAMES / FRAME_FACTOR) * FRAME_FACTOR
        high = math.floor(min(MAX_FRAMES, num_frames) / FRAME_FACTOR) * FRAME_FACTOR
        count = min(max(num_frames / video_fps * fps, low), high)
        count = round(count / FRAME_FACTOR) * FRAME_FACTOR
    count = min(count, num_frames)
    if not FRAME_FACTOR <= count <= num_frames:
        raise ValueError(f"videoalign: a video needs at least {FRAME_FACTOR} frames, got {num_frames}")
    return torch.linspace(0, num_frames - 1, count).round().long().tolist()


def to_grayscale(videos: torch.Tensor) -> torch.Tensor:
    """``[..., 3, H, W]`` -> the same shape with every channel set to the luma
    ``0.299 R + 0.587 G + 0.114 B`` (ITU-R BT.601, as PIL's ``convert("L")``)."""
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=videos.dtype, device=videos.device)
    luma = (videos * weights.view(3, 1, 1)).sum(dim=-3, keepdim=True)
    return luma.expand_as(videos)


# -- checkpoints -----------------------------------------------------------------------------------


def _checkpoint_dir(folder: str, step: int | None) -> str:
    """The ``checkpoint-<step>`` folder (the latest when ``step`` is None) of a training output."""
    found = {
        int(p.rsplit("-", 1)[1]): p
        for p in glob.glob(os.path.join(folder, "checkpoint-*"))
        if p.rsplit("-", 1)[1].isdigit()
    }
    if not found:
        raise FileNotFoundError(f"videoalign: no checkpoint-<step> folder in {folder}")
    if step is None:
        return found[max(found)]
    if step not in found:
        raise FileNotFoundError(f"videoalign: no checkpoint-{step} in {folder} (steps: {sorted(found)})")
    return found[step]


def _read_checkpoint_state(path: str) -> dict[str, torch.Tensor]:
    """The reward model's tensors from a checkpoint folder: ``model.pth`` or LoRA + non-LoRA files."""
    full = os.path.join(path, "model.pth")
    if os.path.isfile(full):
        return load_state_dict_file(full, "VideoAlign checkpoint")
    adapter = load_state_dict_file(os.path.join(path, "adapter_model.safetensors"), "VideoAlign LoRA adapter")
    state = load_state_dict_file(os.path.join(path, "non_lora_state_dict.pth"), "VideoAlign non-LoRA weights")
    state.update(adapter)
    return state


def _lora_scale(lora: Mapping[str, Any]) -> float | None:
    if not lora.get("lora_enable", False):
        return None
    rank, alpha = float(lora["lora_r"]), float(lora["lora_alpha"])
    return alpha / math.sqrt(rank) if lora.get("use_rslora", False) else alpha / rank


def load_model_config(folder: str) -> dict[str, Any]:
    """``model_config.json`` of a VideoReward folder, checked for the variant implemented here."""
    path = os.path.join(folder, "model_config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"videoalign: {path} not found (a VideoReward folder holds model_config.json)"
        )
    with open(path) as handle:
        config = json.load(handle)
    data, model = config.get("data_config", {}), config.get("model_config", {})
    template = data.get("prompt_template_type", "detailed_special")
    if template != "detailed_special" or not model.get("use_special_tokens", True):
        raise ValueError(
            f"videoalign: only the special-token model is implemented (prompt_template_type "
            f"'detailed_special'); {path} has {template!r}"
        )
    return config


def build_videoalign_model(
    checkpoint: str | os.PathLike,
    base_model: str | os.PathLike | None = None,
    checkpoint_step: int | None = None,
    **model_options: Any,
) -> tuple[QwenRewardModel, dict[str, Any]]:
    """The VideoReward model of a folder in the official layout (module docstring) and its
    ``model_config.json``; ``base_model`` overrides the config's ``model_name_or_path``."""
    folder = os.fspath(checkpoint)
    config = load_model_config(folder)
    lora = config.get("peft_lora_config", {})
    state = _read_checkpoint_state(_checkpoint_dir(folder, checkpoint_step))
    backbone_state, head_state = normalize_state_dict(state, _lora_scale(lora))
    if "weight" not in head_state:
        raise ValueError(f"videoalign: the checkpoint in {folder} holds no rm_head.weight")
    base = base_model or config.get("model_config", {}).get("model_name_or_path") or VIDEOALIGN_BASE_MODEL
    backbone, processor = load_base_backbone(base, model_options.get("dtype"))
    add_reward_tokens(processor, VIDEOALIGN_REWARD_TOKENS)
    load_backbone_weights(backbone, backbone_state, "VideoAlign checkpoint")
    weight = head_state["weight"]
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    head.load_state_dict(head_state)
    return QwenRewardModel(backbone, head, processor, VIDEOALIGN_REWARD_TOKENS, **model_options), config


def _resolve_folder(checkpoint: str | os.PathLike | None, hub_repo: str) -> str:
    if checkpoint is not None and looks_like_local_path(os.fspath(checkpoint)):
        folder = os.path.expanduser(os.fspath(checkpoint))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"videoalign: checkpoint folder not found: {folder}")
        return folder
    from huggingface_hub import snapshot_download

    repo = hub_repo if checkpoint is None else os.fspath(checkpoint)
    try:
        return snapshot_download(repo_id=repo)
    except Exception as error:  # offline, gated, missing: say what to do instead
        raise FileNotFoundError(
            f"videoalign: could not download {repo!r} ({type(error).__name__}: {error}); "
            f"download it and pass checkpoint=<local folder>"
        ) from error


# -- the reward ------------------------------------------------------------------------------------


@register_reward("videoalign")
class VideoAlignReward(Reward):
    """VideoReward (Liu et al. 2025) of each video for its prompt: VQ, MQ, TA or their sum.

    Args:
        checkpoint: a VideoReward folder in the official layout, or a hub id; None downloads
            ``hub_repo``.
        dimension: the score returned: ``"VQ"``, ``"MQ"``, ``"TA"`` or ``"overall"`` (VQ + MQ + TA).
        grayscale: score the luma of each frame (:func:`to_grayscale`; Astrolabe's MQ reward).
        normalize: standardise each dimension with the checkpoint's statistics (official default).
        normalization: ``{"VQ": (mean, std), ...}`` replacing the checkpoint's statistics.
        video_fps: frame rate of the input videos (Wan 2.1 generates 16 fps).
        fps: frames per second sampled for the model (default: the checkpoint's, 2).
        num_frames: sample this many frames instead of following ``fps``.
        max_pixels, min_pixels: the frame area range after resizing (default: the checkpoint's
            ``max_frame_pixels``, 200704, and 128 * 28 * 28).
        base_model: override of the checkpoint's base model (hub id or folder).
        checkpoint_step: which ``checkpoint-<step>`` to load (default: the latest).
        model: a built :class:`~genalign.rewards.qwen_rm.QwenRewardModel` (its tokenizer holds the
            three reward tokens) instead of a checkpoint; then ``normalization`` gives the
            statistics (default :data:`OFFICIAL_NORMALIZATION`).
        batch_size, device, dtype: batching and placement of the backbone (the head runs in fp32).
        hub_repo: hub repository of the official checkpoint.
        strict: raise on NaN scores.

    Videos: float ``[B, F, 3, H, W]`` in [0, 1]. Scores ``[B]``; ``details``: ``VQ``, ``MQ``, ``TA``
    and ``overall`` (normalised when ``normalize``) and ``raw_VQ``, ``raw_MQ``, ``raw_TA``, each
    ``[B]``, and ``num_frames`` (frames read per video). Not differentiable.
    """

    input_kind = "video"
    differentiable = False

    def __init__(
        self,
        checkpoint: str | os.PathLike | None = None,
        dimension: str = "overall",
        grayscale: bool = False,
        normalize: bool = True,
        normalization: Mapping[str, Sequence[float]] | None = None,
        video_fps: float = 16.0,
        fps: float | None = None,
        num_frames: int | None = None,
        max_pixels: int | None = None,
        min_pixels: int = VIDEO_MIN_PIXELS,
        base_model: str | os.PathLike | None = None,
        checkpoint_step: int | None = None,
        model: QwenRewardModel | None = None,
        batch_size: int = 2,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        hub_repo: str = VIDEOREWARD_REPO,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        self.dimension = _dimension(dimension)
        if video_fps <= 0 or (fps is not None and fps <= 0):
            raise ValueError(f"videoalign: video_fps and fps must be positive, got {video_fps} and {fps}")
        if num_frames is not None and num_frames < FRAME_FACTOR:
            raise ValueError(f"videoalign: num_frames must be at least {FRAME_FACTOR}, got {num_frames}")
        config: dict[str, Any] = {}
        if model is None:
            folder = _resolve_folder(checkpoint, hub_repo)
            model, config = build_videoalign_model(
                folder, base_model, checkpoint_step, batch_size=batch_size, device=device, dtype=dtype
            )
        if model.reward_tokens != VIDEOALIGN_REWARD_TOKENS:
            raise ValueError(
                f"videoalign: the model must read {VIDEOALIGN_REWARD_TOKENS}, not {model.reward_tokens}"
            )
        outputs = getattr(model.head, "out_features", None)
        if outputs not in (1, 3):
            raise ValueError(f"videoalign: the head must give 1 or 3 outputs per token, got {outputs}")
        data = config.get("data_config", {})
        self.model, self.grayscale, self.normalize = model, bool(grayscale), bool(normalize)
        self.video_fps = float(video_fps)
        self.fps = float(fps if fps is not None else data.get("fps") or SAMPLE_FPS)
        self.num_frames = num_frames if num_frames is not None else data.get("num_frames")
        self.max_pixels = int(
            max_pixels if max_pixels is not None else data.get("max_frame_pixels") or MAX_FRAME_PIXELS
        )
        self.min_pixels = int(min_pixels)
        self.statistics = _statistics(normalization, config.get("inference_config"), from_folder=bool(config))
        if self.normalize and self.statistics is None:  # the official inference then returns raw scores
            logger.info("videoalign: the checkpoint has no inference_config; scores are not normalised")
            self.normalize = False

    def prepare_video(self, video: torch.Tensor) -> torch.Tensor:
        """``[F, 3, H, W]`` in [0, 1] -> the uint8 frames ``[n, 3, h, w]`` the model reads (sampled,
        optionally grayscale, resized bicubic with antialiasing on the model's patch grid)."""
        from torchvision.transforms.functional import InterpolationMode, resize

        index = sample_frames(video.shape[0], self.video_fps, self.fps, self.num_frames)
        frames = video.detach()[index].float().cpu()  # (n, 3, H, W)
        if self.grayscale:
            frames = to_grayscale(frames)
        frames = (frames.clamp(0, 1) * 255).round().to(torch.uint8)
        height, width = smart_resize(
            frames.shape[-2], frames.shape[-1], self.model.patch_factor(), self.min_pixels, self.max_pixels
        )
        return resize(frames, [height, width], interpolation=InterpolationMode.BICUBIC, antialias=True)

    def raw_scores(self, videos: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """``[B, 3]`` unnormalised (VQ, MQ, TA) of each video."""
        texts = [self.model.render(VIDEOALIGN_PROMPT.format(text_prompt=p), "video") for p in prompts]
        outputs = self.model.score_chats(texts, videos=[self.prepare_video(v) for v in videos])  # (B, 3, out)
        if outputs.shape[-1] == 1:
            return outputs[..., 0]
        return outputs.diagonal(dim1=1, dim2=2)  # each criterion's own output at its own token

    def score(self, videos: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        raw = self.raw_scores(videos, prompts)  # (B, 3)
        scores = raw
        if self.normalize:
            mean = torch.tensor([self.statistics[d][0] for d in VIDEOALIGN_DIMENSIONS], device=raw.device)
            std = torch.tensor([self.statistics[d][1] for d in VIDEOALIGN_DIMENSIONS], device=raw.device)
            scores = (raw - mean) / std
        details: dict[str, Any] = {d: scores[:, i] for i, d in enumerate(VIDEOALIGN_DIMENSIONS)}
        details["overall"] = scores.sum(dim=1)
        details.update({f"raw_{d}": raw[:, i] for i, d in enumerate(VIDEOALIGN_DIMENSIONS)})
        details["num_frames"] = len(sample_frames(videos.shape[1], self.video_fps, self.fps, self.num_frames))
        return RewardOutput(details[self.dimension].to(videos.device), details)

    def extra_repr(self) -> str:
        return (
            f"dimension={self.dimension!r}, grayscale={self.grayscale}, normalize={self.normalize}, "
            f"fps={self.fps}, video_fps={self.video_fps}, max_pixels={self.max_pixels}"
        )


def _dimension(name: str) -> str:
    """``"VQ"``/``"MQ"``/``"TA"`` (any case) or ``"overall"``; anything else is a ValueError."""
    key = str(name).upper() if str(name).upper() in VIDEOALIGN_DIMENSIONS else str(name).lower()
    if key not in CHOICES:
        raise ValueError(f"videoalign: dimension must be one of {CHOICES}, got {name!r}")
    return key


def _statistics(
    override: Mapping[str, Sequence[float]] | None,
    inference_config: Mapping[str, float] | None,
    from_folder: bool = False,
) -> dict[str, tuple[float, float]] | None:
    """Each dimension's (mean, std): the override, else the checkpoint folder's ``inference_config``
    (None when the folder has none), else (a built model) :data:`OFFICIAL_NORMALIZATION`."""
    if override is not None:
        missing = [d for d in VIDEOALIGN_DIMENSIONS if d not in override]
        if missing:
            raise ValueError(f"videoalign: normalization lacks {missing}; give (mean, std) for VQ, MQ and TA")
        stats = {d: (float(override[d][0]), float(override[d][1])) for d in VIDEOALIGN_DIMENSIONS}
    elif inference_config:
        stats = {
            d: (float(inference_config[f"{d}_mean"]), float(inference_config[f"{d}_std"]))
            for d in VIDEOALIGN_DIMENSIONS
        }
    elif from_folder:
        return None
    else:
        stats = dict(OFFICIAL_NORMALIZATION)
    bad = {d: s for d, (_, s) in stats.items() if not s > 0}
    if bad:
        raise ValueError(f"videoalign: normalization std must be positive, got {bad}")
    return stats
