"""load_reward names the reward and the option at fault (found by a new-user tryout: eval-reward and
reno passed --reward-arg typos and bad values straight to the constructor)."""

from __future__ import annotations

import pytest

from genalign.rewards import load_reward


def test_an_unknown_option_lists_the_rewards_options():
    with pytest.raises(
        ValueError, match="reward 'jpeg_compressibility' takes no option 'qualty'; its options: quality"
    ):
        load_reward("jpeg_compressibility", qualty=3)


def test_a_value_the_constructor_rejects_names_the_reward_and_the_value():
    with pytest.raises(ValueError, match=r"reward 'jpeg_compressibility' \(quality='high'\): "):
        load_reward("jpeg_compressibility", quality="high")
    assert load_reward("jpeg_compressibility", quality=50) is not None
