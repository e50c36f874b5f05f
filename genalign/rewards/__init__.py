"""Rewards: the protocol, the registry and every reward model (see base.py for the contract).

Importing this package registers every reward (``shapes_eval``, ``toy_video_eval`` and
``toy_svg_verifier`` lazily: their modules are imported when the reward is first loaded):

=========================  ==========================================================  =====
name                       what                                                        grad
=========================  ==========================================================  =====
``clip``                   CLIPScore (Hessel et al. 2021) or CLIP cosine               yes
``pickscore``              PickScore v1 (Kirstain et al. 2023)                         yes
``hpsv2``                  HPS v2 / v2.1 (Wu et al. 2023)                              yes
``hpsv3``                  HPSv3 (Ma et al. 2025): Qwen2-VL + mu/sigma head, the mu    no
``aesthetic``              LAION improved aesthetic predictor (as in DDPO)             yes
``jpeg_compressibility``   -JPEG size in kB (DDPO)                                     no
``jpeg_incompressibility`` +JPEG size in kB (DDPO)                                     no
``ensemble``               weighted, optionally normalised sum of members              if all
``svg_fidelity``           RLRF rendering reward on SVG text (Rodriguez et al. 2025)   no
``svg_render``             any image reward on each SVG's render (text-to-SVG)          no
``vlm_yes``                P("yes") from a VLM: VQAScore / RewardDance (comparative)   no
``iqa``                    VLM expected rating: Q-Align, Q-Boost; Q-Hawkeye variance   no
``clip_iqa``               CLIP-IQA antonym prompts (Wang et al. 2023)                 yes
``keyword``                text: keyword occurrences in a completion (verifiable)      no
``text_length``            text: closeness of a completion's length to a target         no
``iqa_answer``             text: Q-Hawkeye accuracy + format + repetition vs. true MOS  no
``shapes_eval``            toy-world verifier: GenEval-style checks from pixels         no
``video``                  any image reward per frame; top-30% / mean / min per video  if it
``videoalign``             VideoReward (Liu et al. 2025): VQ / MQ / TA / overall       no
``toy_video_eval``         toy video verifier: objects, motion, relations from frames   no
``toy_svg_verifier``       toy oracle for SVG writers: ShapesEval on each SVG's render  no
=========================  ==========================================================  =====
"""

from __future__ import annotations

from genalign.rewards.aesthetic import AestheticMLP, AestheticReward
from genalign.rewards.base import REWARDS, Reward, RewardOutput, list_rewards, load_reward, register_reward
from genalign.rewards.clip_models import (
    CLIPBackendReward,
    CLIPEmbedder,
    ClipEmbedder,
    OpenCLIPEmbedder,
    OpenClipEmbedder,
    TransformersCLIPEmbedder,
    TransformersClipEmbedder,
    load_clip_embedder,
    register_open_clip_config,
)
from genalign.rewards.clip_score import CLIPScoreReward, ClipScoreReward
from genalign.rewards.ensemble import EnsembleReward
from genalign.rewards.hps import HPSv2Reward
from genalign.rewards.hpsv3 import HPSv3Reward
from genalign.rewards.iqa import (
    CLIPIQAReward,
    ClipIQAReward,
    VLMQualityReward,
    rollout_variance,
    uncertainty_weights,
)
from genalign.rewards.jpeg import (
    JPEGCompressibilityReward,
    JpegCompressibilityReward,
    JPEGIncompressibilityReward,
    JpegIncompressibilityReward,
)
from genalign.rewards.pickscore import PickScoreReward
from genalign.rewards.preprocess import PreprocessConfig, preprocess_images
from genalign.rewards.qwen_rm import QwenRewardModel
from genalign.rewards.svg import SVGFidelityReward, SVGRenderedReward
from genalign.rewards.text import IQAAnswerReward, KeywordReward, TextLengthReward
from genalign.rewards.video import VideoReward
from genalign.rewards.videoalign import VideoAlignReward
from genalign.rewards.vlm import VLMJudge, VLMJudgeReward, load_vlm, resolve_word_ids
from genalign.rewards.vlm_yes import VLMYesReward

# The toy world's verifier lives above this package (genalign.toy sits on the library); the
# registry imports it the first time `load_reward("shapes_eval")` asks for it (the video verifier
# likewise).
REWARDS.add_lazy("shapes_eval", "genalign.toy.shapes_eval:ShapesEvalReward")
REWARDS.add_lazy("toy_video_eval", "genalign.toy.video.reward:ToyVideoEvalReward")
REWARDS.add_lazy("toy_svg_verifier", "genalign.toy.svg_oracle:SVGVerifierReward")

__all__ = [
    "REWARDS",
    "CLIPIQAReward",
    "VLMJudge",
    "VLMQualityReward",
    "VLMYesReward",
    "load_vlm",
    "resolve_word_ids",
    "rollout_variance",
    "uncertainty_weights",
    "AestheticMLP",
    "AestheticReward",
    "CLIPEmbedder",
    "CLIPScoreReward",
    "EnsembleReward",
    "HPSv2Reward",
    "HPSv3Reward",
    "QwenRewardModel",
    "VideoAlignReward",
    "IQAAnswerReward",
    "KeywordReward",
    "TextLengthReward",
    "JPEGCompressibilityReward",
    "JPEGIncompressibilityReward",
    "OpenCLIPEmbedder",
    "PickScoreReward",
    "PreprocessConfig",
    "Reward",
    "RewardOutput",
    "SVGFidelityReward",
    "SVGRenderedReward",
    "TransformersCLIPEmbedder",
    "VideoReward",
    "list_rewards",
    "load_clip_embedder",
    "load_reward",
    "preprocess_images",
    "register_open_clip_config",
    "register_reward",
    "CLIPBackendReward",
    "VLMJudgeReward",
    # deprecated aliases of the CLIP... / JPEG... names above
    "ClipEmbedder",
    "ClipIQAReward",
    "ClipScoreReward",
    "JpegCompressibilityReward",
    "JpegIncompressibilityReward",
    "OpenClipEmbedder",
    "TransformersClipEmbedder",
]
