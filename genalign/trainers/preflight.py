"""Checks of a recipe's names and ``train`` settings before any model loads.

A typo in ``train.loss`` ("losss") or ``train.strategy`` used to be reported only after the
policy had loaded, minutes into a run on a real model; an unknown reward option surfaced as a
``TypeError`` traceback (issue 23.6). :func:`check_recipe_names` resolves every registry name of
a recipe (policy family, reward, monitors, strategy, loss), imports ``"module:Class"`` plug-ins
and checks reward options against the reward's constructor, raising a
:class:`~genalign.config.ConfigError` that names the key, offers the closest registered name and
lists the rest.

Then :func:`check_train_settings` refuses ``train`` values the schema accepts but no run can
use (a negative or non-finite learning rate, a non-positive advantage clip, a negative
gradient-norm clip or PPO clip range), ``train`` keys the selected loss or strategy never reads
(``kl_coef`` under the ``astrolabe`` and ``sft`` losses; ``advantage``, ``advantage_std`` and
``tracker_*`` under the ``q_hawkeye`` and ``astrolabe`` strategies; ``advantage`` and
``advantage_std`` under ``b2diffurl`` and ``sft``; ``advantage_clip`` under ``astrolabe``;
``advantage_std`` unless ``advantage: group`` where the strategy follows ``train.advantage``),
these only when set to a value other than the default, and ``group_noise`` with
``drop_zero_advantage``, whose re-split minibatches can cut a prompt group.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

from genalign.config import ConfigError
from genalign.registry import Registry, import_object, unknown_option_message

__all__ = ["check_recipe_names", "check_train_settings", "resolve_name"]


def resolve_name(registry: Registry, name: str, key: str) -> Any:
    """The entry ``name`` of ``registry``, or a :class:`ConfigError` naming ``key``."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{key}: expected a {registry.kind} name, got {name!r}")
    if ":" in name:  # a plug-in named "module.path:Class"
        try:
            return import_object(name)
        except (ImportError, ValueError) as error:
            raise ConfigError(f"{key}: {error}") from error
    if name in registry:
        return registry.get(name)
    known = registry.names()
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(
        f"{key}: unknown {registry.kind} {name!r}{hint}; registered {registry.kind}s: {', '.join(known)}"
    )


def check_options(factory: Any, options: dict[str, Any], key: str, what: str) -> None:
    """Raise naming ``key`` when ``options`` holds a keyword ``factory`` does not take."""
    message = unknown_option_message(factory, options, what)
    if message is not None:
        raise ConfigError(f"{key}: {message}")


def _check_reward_class(entry: Any, key: str, base: type) -> None:
    """A reward plug-in must be a :class:`~genalign.rewards.Reward` subclass (it is called as one)."""
    if not (isinstance(entry, type) and issubclass(entry, base)):
        raise ConfigError(f"{key}: {entry!r} is not a genalign.rewards.Reward subclass")


def check_recipe_names(config: Any) -> None:
    """Resolve every registry name in a :class:`~genalign.trainers.config.RecipeConfig`, then
    :func:`check_train_settings` (the trainer runs both before any model loads)."""
    from genalign.policies import POLICIES
    from genalign.rewards import Reward
    from genalign.rewards.base import REWARDS
    from genalign.trainers.losses import LOSSES
    from genalign.trainers.strategies import STRATEGIES

    resolve_name(POLICIES, config.model.family, "model.family")
    if getattr(config, "rewriter", None) is not None:
        resolve_name(POLICIES, config.rewriter.family, "rewriter.family")
    reward = resolve_name(REWARDS, config.reward.name, "reward.name")
    _check_reward_class(reward, "reward.name", Reward)
    check_options(reward, dict(config.reward.kwargs), "reward.kwargs", f"reward {config.reward.name!r}")
    for name, kwargs in config.reward.monitors.items():
        monitor = resolve_name(REWARDS, name, f"reward.monitors.{name}")
        _check_reward_class(monitor, f"reward.monitors.{name}", Reward)
        check_options(monitor, dict(kwargs or {}), f"reward.monitors.{name}", f"reward {name!r}")
    resolve_name(STRATEGIES, config.train.strategy, "train.strategy")
    loss = resolve_name(LOSSES, config.train.loss, "train.loss")
    if config.train.fuse_timesteps:
        _check_fusable(loss, config)
    if config.train.group_noise and not getattr(loss, "group_noise", False):
        raise ConfigError(
            f"train.group_noise: the {config.train.loss!r} loss does not draw its forward noise by "
            "prompt group (the loss that does: nft)"
        )
    check_train_settings(config.train)


def _check_fusable(loss: Any, config: Any) -> None:
    """``train.fuse_timesteps`` needs a loss that is a mean over per-row terms (``row_mean``)."""
    if getattr(config, "rewriter", None) is not None:
        raise ConfigError(
            "train.fuse_timesteps: a joint run's loss (rewriter and generator) cannot fuse steps"
        )
    if not getattr(loss, "row_mean", False):
        raise ConfigError(
            f"train.fuse_timesteps: the {config.train.loss!r} loss is not a mean over per-row terms, "
            "so its trained steps cannot run as one call (losses that can: nft, ppo_clip)"
        )


# train keys a loss never reads (key -> what to use instead), by loss name
_IGNORED_BY_LOSS: dict[str, dict[str, str]] = {
    "astrolabe": {"kl_coef": "its KL weight is train.astrolabe.kl_weight; set that instead"},
    "sft": {"kl_coef": "supervised fine-tuning has no KL term; leave train.kl_coef at 0"},
}
_QH_ADVANTAGES = (
    "it always computes its own uncertainty-aware group advantages (train.q_hawkeye.uncertainty, "
    "alpha, score_min, score_max; clipped to train.advantage_clip); remove the key"
)
_ASTROLABE_ADVANTAGES = (
    "its advantages are (reward - prompt mean) / batch std, clipped to train.astrolabe.advantage_clip; "
    "remove the key"
)
# train keys a rollout strategy never reads, by strategy name
_IGNORED_BY_STRATEGY: dict[str, dict[str, str]] = {
    "q_hawkeye": {
        key: _QH_ADVANTAGES
        for key in ("advantage", "advantage_std", "tracker_buffer_size", "tracker_min_count")
    },
    "astrolabe": {
        **{
            key: _ASTROLABE_ADVANTAGES
            for key in ("advantage", "advantage_std", "tracker_buffer_size", "tracker_min_count")
        },
        "advantage_clip": "its advantages are clipped to train.astrolabe.advantage_clip; set that instead",
    },
    "b2diffurl": {
        key: "its advantages are the branch scores clipped to train.advantage_clip and weighted by "
        "train.b2diffurl.pos_weight / neg_weight; remove the key"
        for key in ("advantage", "advantage_std")
    },
    "sft": {
        key: "supervised fine-tuning has no advantages; remove the key"
        for key in ("advantage", "advantage_std")
    },
}
# the strategies whose advantages follow train.advantage (GroupRolloutStrategy.advantages);
# advantage_std is read only under its "group" mode. tracker_* under another mode (or strategy) are not refused:
# recipes carry them, and switching train.advantage on the command line should not need them reset.
_USES_ADVANTAGE_MODE = ("groups", "sol_rl", "prompt_rewrite", "svg")


def _svg_own_baseline(train: Any) -> bool:
    """The svg strategy with a greedy baseline or branch rollouts: its advantages are ``(reward -
    baseline)`` scaled by ``advantage_std``, whatever ``train.advantage`` says."""
    svg = getattr(train, "svg", None)
    return (
        train.strategy == "svg" and svg is not None and (svg.baseline == "greedy" or svg.rollout == "branch")
    )


def _check_advantage_mode(train: Any, defaults: dict[str, Any]) -> None:
    if train.strategy not in _USES_ADVANTAGE_MODE:
        return
    if _svg_own_baseline(train):
        if train.advantage != defaults["advantage"]:
            raise ConfigError(
                f"train.advantage: train.svg's greedy baseline / branch rollouts set the advantages, "
                f"so {train.advantage!r} is ignored (they are reward - baseline, scaled by "
                f"train.advantage_std); remove the key"
            )
        return
    if train.advantage != "group" and train.advantage_std != defaults["advantage_std"]:
        raise ConfigError(
            f"train.advantage_std: train.advantage is {train.advantage!r}, which ignores it "
            f"({train.advantage_std!r}): it is read only with train.advantage: group; remove the key"
        )


def check_train_settings(train: Any) -> None:
    """Refuse, naming the key, ``train`` values no run can use, keys the selected loss or strategy
    ignores (only when not at their default) and ``group_noise`` with ``drop_zero_advantage``."""
    defaults = {f.name: f.default for f in dataclasses.fields(train) if f.default is not dataclasses.MISSING}
    for ignored, what in ((_IGNORED_BY_LOSS, "loss"), (_IGNORED_BY_STRATEGY, "strategy")):
        name = train.loss if what == "loss" else train.strategy
        for key, instead in ignored.get(name, {}).items():
            value = getattr(train, key)
            if value != defaults[key]:
                raise ConfigError(
                    f"train.{key}: the {name!r} {what} ignores it ({value!r}; default {defaults[key]!r}): {instead}"
                )
    _check_advantage_mode(train, defaults)
    if train.group_noise and train.drop_zero_advantage:
        raise ConfigError(
            "train.group_noise: train.drop_zero_advantage re-splits the kept samples into minibatches "
            "that can cut a prompt group across optimiser steps, so groups no longer train whole; "
            "set one of them to false"
        )
    rate = train.learning_rate
    if not (math.isfinite(rate) and rate >= 0):  # 0 stays: the lr-0 control runs (docs/language.md)
        raise ConfigError(
            f"train.learning_rate must be finite and >= 0 (0: a control run that trains nothing), got {rate}"
        )
    if not train.max_grad_norm >= 0:
        raise ConfigError(
            f"train.max_grad_norm must be >= 0 (0: no gradient clipping), got {train.max_grad_norm}"
        )
    if not 0 <= train.clip_range <= 1:
        raise ConfigError(
            f"train.clip_range must lie in [0, 1] (PPO clips the ratio to [1 - clip_range, 1 + clip_range]), "
            f"got {train.clip_range}"
        )
    if not train.advantage_clip > 0:
        raise ConfigError(
            f"train.advantage_clip must be positive (advantages are clipped to [-advantage_clip, "
            f"advantage_clip]), got {train.advantage_clip}"
        )
