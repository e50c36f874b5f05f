"""Policies: model-family adapters that roll out real diffusers models with exact log-probs.

Families are registered by name; outside code can add one with :func:`register_policy` or name
a class directly as ``"package.module:Class"``::

    policy = load_policy("sd", "stabilityai/stable-diffusion-2-1", lora={"rank": 8})
    trajectory = policy.rollout(["a red circle"], group_size=4, generator=0)

The ``language`` family (:mod:`.language`) wraps transformers LMs and VLMs; its rollouts are
:class:`TokenTrajectory` records of tokens, masks and per-token log-probs::

    policy = load_policy("language", "Qwen/Qwen2.5-0.5B-Instruct", lora={"rank": 8,
                         "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]})
    trajectory = policy.rollout(["a red circle"], group_size=4, generator=0, temperature=1.0)

The ``ar_video`` family (:mod:`.ar_video`) samples block-causal video transformers block by block
(Self-Forcing), with a KV cache (:mod:`.video_kv_cache`) equal to recomputing the prefix::

    policy = load_policy("ar_video", "tiny:ar_video")
    trajectory = policy.rollout(["a red circle"], group_size=2, generator=0, num_frames=6, height=32, width=32)
    trajectory.images    # the videos [B, F_pixels, 3, H, W] in [0, 1]
    policy.local_window = LocalWindow(12, 3)   # LongLive's window with sink frames: a bounded cache
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from genalign.policies.ar_video import ARVideoPolicy
from genalign.policies.base import DiffusionPolicy, LoRASpec, LoraSpec, check_group_size
from genalign.policies.consistency import ConsistencyPolicy
from genalign.policies.flow import FlowPolicy, FluxPolicy, SanaPolicy, SD3Policy
from genalign.policies.joint import JointPolicy, JointTrajectory
from genalign.policies.language import LanguagePolicy
from genalign.policies.model_folder import check_model_folder
from genalign.policies.sd import SDPolicy
from genalign.policies.supervised import teacher_forced_trajectory
from genalign.policies.token_trajectory import TokenSettings, TokenTrajectory
from genalign.policies.trajectory import RolloutSettings, Trajectory
from genalign.policies.video_kv_cache import LocalWindow
from genalign.registry import Registry

POLICIES: Registry[type[DiffusionPolicy] | type[LanguagePolicy]] = Registry("policy family")
POLICIES.add("sd", SDPolicy)
POLICIES.add("flow", FlowPolicy)
POLICIES.add("consistency", ConsistencyPolicy)
POLICIES.add("language", LanguagePolicy)
POLICIES.add("ar_video", ARVideoPolicy)


def register_policy(name: str):
    """Class decorator registering an outside policy family."""
    return POLICIES.register(name)


def load_policy(family: str, path: str | Path, **kwargs: Any) -> DiffusionPolicy | LanguagePolicy:
    """Load a policy of ``family`` from a hub id, a local folder, or ``tiny:NAME`` (an offline tiny
    model, see :mod:`genalign.tiny.materialize`); kwargs go to ``from_pretrained``."""
    from genalign.tiny.materialize import materialize

    cls = POLICIES.get(family)
    return cls.from_pretrained(materialize(path), **kwargs)


def list_policies() -> list[str]:
    return POLICIES.names()


__all__ = [
    "POLICIES",
    "ARVideoPolicy",
    "ConsistencyPolicy",
    "DiffusionPolicy",
    "FlowPolicy",
    "FluxPolicy",
    "JointPolicy",
    "JointTrajectory",
    "LanguagePolicy",
    "LocalWindow",
    "LoRASpec",
    "LoraSpec",  # deprecated alias of LoRASpec
    "RolloutSettings",
    "SD3Policy",
    "SDPolicy",
    "SanaPolicy",
    "TokenSettings",
    "TokenTrajectory",
    "teacher_forced_trajectory",
    "Trajectory",
    "check_group_size",
    "check_model_folder",
    "list_policies",
    "load_policy",
    "register_policy",
]
