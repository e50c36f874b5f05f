"""Rewards: the protocol, the registry and every reward model (see base.py for the contract)."""

from __future__ import annotations

from genalign.rewards.base import REWARDS, Reward, RewardOutput, list_rewards, load_reward, register_reward

__all__ = ["REWARDS", "Reward", "RewardOutput", "list_rewards", "load_reward", "register_reward"]
