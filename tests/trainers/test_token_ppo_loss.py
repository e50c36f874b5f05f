"""The token_ppo loss: a hand computation with padded completions, on-policy ratio 1 through a real
language policy, and the recipe checks of the language family's options."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
import torch

from genalign.config import ConfigError
from genalign.policies import LanguagePolicy, TokenSettings, TokenTrajectory
from genalign.tiny.language import qwen2_lm
from genalign.trainers import load_recipe
from genalign.trainers.losses import LOSSES, TokenPPOLoss
from genalign.trainers.train_config import TrainConfig

# two completions of a padded length 4: the first stops after 2 tokens (its EOS included)
NEW = [[-1.0, -2.0, 0.0, 0.0], [-0.5, -1.5, -2.5, -0.1]]
OLD = [[-1.2, -1.9, 0.0, 0.0], [-0.5, -1.0, -2.6, -0.4]]
REF = [[-1.1, -2.5, 0.0, 0.0], [-0.7, -1.5, -2.0, -0.2]]
MASK = [[1, 1, 0, 0], [1, 1, 1, 1]]
ADVANTAGES = [1.5, -0.8]


class FixedPolicy:
    """Returns NEW as its log-probs, and REF inside ``reference()``."""

    def __init__(self) -> None:
        self.new = torch.tensor(NEW, requires_grad=True)
        self.in_reference = False

    def log_prob(self, trajectory):
        return torch.tensor(REF) if self.in_reference else self.new

    @contextlib.contextmanager
    def reference(self):
        self.in_reference = True
        try:
            yield self
        finally:
            self.in_reference = False


def hand_trajectory(max_new_tokens: int = 6) -> TokenTrajectory:
    mask = torch.tensor(MASK)
    return TokenTrajectory(
        prompts=["p", "p"],
        group_ids=torch.zeros(2, dtype=torch.long),
        seeds=torch.arange(2),
        input_ids=torch.zeros(2, 7, dtype=torch.long),
        attention_mask=torch.cat([torch.ones(2, 3, dtype=torch.long), mask], dim=1),
        completion_mask=mask,
        log_probs=torch.tensor(OLD),
        completions=["a", "b"],
        settings=TokenSettings(max_new_tokens=max_new_tokens),
    )


def hand_loss(eps_low: float, eps_high: float, beta: float, aggregation: str, max_new_tokens: int) -> float:
    """Per token: max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high)) + beta k3, by loops."""
    per_sequence, total, count = [], 0.0, 0
    for i in range(2):
        terms = []
        for t in range(4):
            if not MASK[i][t]:
                continue  # padding after EOS adds nothing
            rho = math.exp(NEW[i][t] - OLD[i][t])
            clipped = min(max(rho, 1 - eps_low), 1 + eps_high)
            a = ADVANTAGES[i]
            surrogate = max(-a * rho, -a * clipped)
            d = REF[i][t] - NEW[i][t]
            k3 = math.exp(d) - d - 1
            terms.append(surrogate + beta * k3)
        per_sequence.append(sum(terms) / len(terms))
        total += sum(terms)
        count += len(terms)
    if aggregation == "sequence_mean":
        return sum(per_sequence) / 2
    if aggregation == "token_mean":
        return total / count
    return total / (2 * max_new_tokens)


@pytest.mark.parametrize("aggregation", ["sequence_mean", "token_mean", "constant"])
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_loss_equals_a_hand_computation_with_padding(aggregation, beta):
    config = TrainConfig(loss="token_ppo", kl_coef=beta)
    config.token_ppo.eps_low, config.token_ppo.eps_high = 0.1, 0.3
    config.token_ppo.aggregation = aggregation
    loss_fn = LOSSES.get("token_ppo")(config)
    assert isinstance(loss_fn, TokenPPOLoss)
    policy = FixedPolicy()
    loss, info = loss_fn(policy, hand_trajectory(max_new_tokens=6), torch.zeros(2), torch.tensor(ADVANTAGES))
    expected = hand_loss(0.1, 0.3, beta, aggregation, max_new_tokens=6)
    assert loss.item() == pytest.approx(expected, rel=1e-6, abs=1e-7)
    loss.backward()
    assert torch.all(policy.new.grad[0, 2:] == 0)  # no gradient reaches padding
    assert ("kl" in info) == (beta > 0)
    # clipped tokens outside [0.9, 1.3]: the second sequence's rho = exp(-0.5) and exp(0.3)
    assert info["clipfrac"].item() == pytest.approx(2 / 6)
    assert info["completion_tokens"].item() == 3.0


def test_on_policy_ratio_is_one_through_a_language_policy():
    model, tokenizer = qwen2_lm(seed=0)
    policy = LanguagePolicy(model, tokenizer, lora=None)
    trajectory = policy.rollout(
        ["a red circle", "a blue square"], group_size=2, generator=0, max_new_tokens=8
    )
    config = TrainConfig(loss="token_ppo", kl_coef=0.01)
    loss, info = TokenPPOLoss(config)(
        policy, trajectory, torch.zeros(4), torch.tensor([1.0, -1.0, 0.5, -0.5])
    )
    assert info["ratio"].item() == 1.0 and info["clipfrac"].item() == 0.0 and info["approx_kl"].item() == 0.0
    assert info["kl"].item() == 0.0  # the frozen copy is the untrained model
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())


ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "toy" / "grpo_language.yaml"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("train.token_ppo.eps_hihg=0.3", "eps_hihg"),
        ("sampling.language.temprature=0.5", "temprature"),
        ("train.token_ppo.aggregation=mean", "train.token_ppo.aggregation"),
        ("train.token_ppo.eps_low=1.5", "train.token_ppo.eps_low"),
        ("sampling.language.temperature=0", "sampling.language.temperature"),
        ("sampling.language.max_new_tokens=0", "sampling.language.max_new_tokens"),
        ("train.loss=ppo_clip", "train.loss"),
        ("train.strategy=b2diffurl", "train.strategy"),
        ("model.lora={rank: 4}", "model.lora.target_modules"),
    ],
)
def test_bad_language_options_fail_naming_the_key(override, named):
    with pytest.raises(ConfigError) as error:
        load_recipe(RECIPE, [override])
    message = str(error.value)
    assert named in message and "\n" not in message


def test_token_ppo_needs_the_language_family():
    with pytest.raises(ConfigError, match="train.loss 'token_ppo'.*model.family is 'sd'"):
        load_recipe(
            ROOT / "configs" / "tiny" / "ddpo_jpeg.yaml", ["train.loss=token_ppo", "train.method=grpo"]
        )
