"""Options of the methods that bring their own settings: the ``b2diffurl``, ``sol_rl`` and
``prompt_rewrite`` strategies, the ``nft``, ``rwr``, ``refl`` and ``token_ppo`` losses, Astrolabe's
``astrolabe`` strategy and loss (the ``ar_video`` family), and the
``language`` family's ``svg`` tasks, ``sft`` and ``q_hawkeye`` (``train.<method>`` in a recipe).

Each schema documents its fields and checks them in ``__post_init__``; checks that need other
sections of the recipe live in :class:`~genalign.trainers.train_config.TrainConfig` and
:class:`~genalign.trainers.config.RecipeConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from genalign.algorithms.selective_kl import SelectiveKLConfig
from genalign.config import ConfigError

__all__ = [
    "AstrolabeConfig",
    "SelectiveKLConstants",
    "B2DiffuRLConfig",
    "NFTConfig",
    "PromptRewriteConfig",
    "QHawkeyeConfig",
    "ReFLConfig",
    "RWRConfig",
    "SFTConfig",
    "SVGTaskConfig",
    "SolRLConfig",
    "TokenPPOConfig",
]


# -- the checks the schemas share (``section``: the recipe's ``train.<section>``) ----------------------
def _positive(section: str, config: Any, *keys: str) -> None:
    for key in keys:
        value = getattr(config, key)
        if value <= 0:
            raise ConfigError(f"train.{section}.{key} must be positive, got {value}")


def _non_negative(section: str, config: Any, *keys: str) -> None:
    for key in keys:
        value = getattr(config, key)
        if value < 0:
            raise ConfigError(f"train.{section}.{key} must be >= 0, got {value}")


def _below_one(section: str, config: Any, key: str) -> None:
    """A decay or mixing rate in [0, 1)."""
    value = getattr(config, key)
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"train.{section}.{key} must lie in [0, 1), got {value}")


@dataclass
class B2DiffuRLConfig:
    """Options of the ``b2diffurl`` rollout strategy (Hu et al., CVPR 2025, "Towards Better
    Alignment: Training Diffusion Models with Reinforcement Learning Against Sparse Rewards").

    Backward progressive training: a step trains the window ``[T - split_step, T)`` of the T
    sampling steps; ``split_step`` rises from ``split_step_start`` to ``split_step_end`` (None:
    T) by ``split_step_increment``, holding each value for ``stage_steps`` training steps (None:
    the values are spread evenly over ``train.num_steps``, as the official ``run_process.sh``
    does). Branch-based sampling: every sample's prefix is drawn once and continued ``branches``
    times from the window start. Selection: rewards are normalised per prompt against the last
    ``history_steps`` steps' rewards; in each branch group the best sample is kept if its
    normalised reward is ``>= pos_threshold`` and the worst if ``< neg_threshold``; their
    advantages (the normalised rewards clipped to ``train.advantage_clip``) are scaled by
    ``pos_weight`` (positive) or ``neg_weight`` (otherwise). ``sample_batch_size`` bounds the
    source samples rolled out in one call (None: all of this process's at once).
    """

    split_step_start: int = 14
    split_step_end: int | None = None
    split_step_increment: int = 1
    stage_steps: int | None = None
    branches: int = 5
    pos_threshold: float = 0.5
    neg_threshold: float = -0.5
    pos_weight: float = 1.0
    neg_weight: float = 1.0
    history_steps: int = 8
    sample_batch_size: int | None = None

    def __post_init__(self) -> None:
        optional = ("stage_steps", "sample_batch_size", "split_step_end")
        set_optional = [key for key in optional if getattr(self, key) is not None]
        _positive("b2diffurl", self, "split_step_start", "split_step_increment", "branches", *set_optional)
        if self.split_step_end is not None and self.split_step_end < self.split_step_start:
            raise ConfigError(
                f"train.b2diffurl.split_step_end {self.split_step_end} is below "
                f"train.b2diffurl.split_step_start {self.split_step_start}"
            )
        if self.neg_threshold > self.pos_threshold:
            raise ConfigError(
                f"train.b2diffurl.neg_threshold {self.neg_threshold} exceeds "
                f"train.b2diffurl.pos_threshold {self.pos_threshold}"
            )
        _non_negative("b2diffurl", self, "pos_weight", "neg_weight", "history_steps")


@dataclass
class NFTConfig:
    """Options of the ``nft`` loss (DiffusionNFT, Zheng et al. 2025; ``genalign.trainers.losses.nft``).

    ``beta``: the implicit-policy mixing strength of eq. 7; ``advantage_clip``: c of
    r = clip(A, -c, c) / (2c) + 1/2; the old (sampling) policy's soft update
    theta_old <- eta theta_old + (1 - eta) theta uses eta = min(ema_rate * (i - ema_flat), ema_max)
    after i optimiser steps (the paper's 0.001 / 0.5 / 0); ``rollout_policy``: "old" samples with
    the old policy as the paper does, "current" with the trained weights; ``adaptive_weighting``:
    divide each x0-space error by its stop-gradient mean absolute error (official code), clamped at
    ``weight_min``; ``guided``: train the output the rollouts were sampled with, classifier-free
    guidance included, instead of the conditional branch alone. The default (False) is the official
    trainer's: DiffusionNFT is CFG-free (Zheng et al. 2025, Sec. 4), it regresses the conditional
    velocity, whatever guidance the rollouts used (a guidance scale embedded in the denoiser, as in
    FLUX.1-dev, stays: it is an input of the conditional model).
    """

    renamed_keys: ClassVar[dict[str, str]] = {"adv_clip": "advantage_clip"}

    beta: float = 1.0
    advantage_clip: float = 5.0
    ema_rate: float = 0.001
    ema_max: float = 0.5
    ema_flat: int = 0
    rollout_policy: Literal["old", "current"] = "old"
    adaptive_weighting: bool = True
    weight_min: float = 1e-5
    guided: bool = False

    def __post_init__(self) -> None:
        _positive("nft", self, "beta", "advantage_clip", "weight_min")
        if self.ema_rate < 0 or self.ema_flat < 0:
            raise ConfigError(
                f"train.nft.ema_rate and train.nft.ema_flat must be >= 0, got {self.ema_rate}, {self.ema_flat}"
            )
        _below_one("nft", self, "ema_max")


@dataclass(frozen=True)
class SelectiveKLConstants(SelectiveKLConfig):
    """``train.astrolabe.selective_kl_constants``: the selective KL's constants, the released values
    by default (fields and meaning: :class:`genalign.algorithms.selective_kl.SelectiveKLConfig`)."""

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ValueError as error:
            raise ConfigError(f"train.astrolabe.selective_kl_constants: {error}") from error
        _positive(
            "astrolabe.selective_kl_constants", self, "fraction_rate", "kl_threshold", "kl_threshold_step"
        )


@dataclass
class AstrolabeConfig:
    """Options of Astrolabe (arXiv 2603.17051): the ``astrolabe`` strategy and loss of the
    ``ar_video`` family (``genalign.trainers.strategies.astrolabe``, ``...losses.astrolabe``; the
    math is :mod:`genalign.algorithms.astrolabe`). Defaults are the released Self-Forcing configs.

    Rollouts: ``num_latent_frames`` per video (a multiple of the model's block size; None: the
    policy's default, 7 blocks), drawn with ``sampling.num_inference_steps`` steps per block.
    Advantages: ``A = clip((R - prompt mean) / (batch std + 1e-4), -advantage_clip, advantage_clip)``.
    Loss: per loss call one ``timesteps`` level (unwarped, ``t = level / 1000``) for every frame of
    every sample; ``beta`` the NFT mixing strength; ``kl_weight`` lambda of ``|x0_theta - x0_ref|^2``
    against the adapter-disabled model (1e-4; 1e-3 in the 16/24-GPU configs; 0: no reference pass);
    ``adaptive_weighting`` / ``clip_over_beta``: DiffusionNFT's per-sample weighting and c/beta
    factor (off, as Astrolabe). Old policy: rollouts from it (``rollout_policy: old``), moved after
    each step by ``theta_old <- eta theta_old + (1 - eta) theta``, ``eta = min(ema_rate * i, ema_max)``
    after i optimiser steps. ``device_batch_size`` (the official per-GPU ``train.batch_size``, 3 in
    the released configs): a loss call's rows are cut in order into chunks of this many, each with
    its own noise level and its own (masked) KL mean, the KL term their mean over chunks, as the
    official GPUs each draw a level and DDP averages them; None: one level and one mean a call.
    ``window_frames`` (streaming windows, the paper's; not in the
    released script): train only a window of this many latent frames (a multiple of the block
    size), its start drawn per loss call among the block starts, the frames before it a detached
    history (:meth:`genalign.policies.ARVideoPolicy.predict_window_x0`); None: the whole video.
    ``window_per_step`` (the released streaming config's window-level reward, whose training
    script is not public): one window start per training step instead, drawn uniformly among the
    block starts with ``num_latent_frames`` the longest video (the config's ``sample_frames``);
    rollouts stop at the window's end, the reward scores the window's frames only, and every loss
    call of the step trains that window.

    Selective KL (``selective_kl``; the released multi-reward runs' ``use_select_kl``, "GARDO";
    :mod:`genalign.algorithms.selective_kl`): the KL applies only to the samples whose rank under
    ``main_reward`` (an ``ensemble`` member's key; the official ``main_reward``, HPSv3) is worst
    against the mean rank under ``other_rewards`` (None: the first two other members, as
    released), and its reference is a lagging copy of the trained weights, reset by the released
    rule, instead of the adapter-disabled model. Needs ``kl_weight > 0`` and ``reward.name:
    ensemble``; ``selective_kl_constants`` holds its constants (:class:`SelectiveKLConstants`).
    """

    num_latent_frames: int | None = None
    window_frames: int | None = None
    window_per_step: bool = False
    timesteps: list[int] = field(default_factory=lambda: [1000, 750, 500, 250])
    device_batch_size: int | None = None
    beta: float = 0.1
    kl_weight: float = 1e-4
    advantage_clip: float = 5.0
    adaptive_weighting: bool = False
    clip_over_beta: bool = False
    ema_rate: float = 0.001
    ema_max: float = 0.5
    rollout_policy: Literal["old", "current"] = "old"
    selective_kl: bool = False
    main_reward: str | None = None
    other_rewards: list[str] | None = None
    selective_kl_constants: SelectiveKLConstants = field(default_factory=SelectiveKLConstants)

    def __post_init__(self) -> None:
        self._check_selective_kl()
        if self.num_latent_frames is not None:
            _positive("astrolabe", self, "num_latent_frames")
        if self.window_frames is not None:
            _positive("astrolabe", self, "window_frames")
        if self.device_batch_size is not None:
            _positive("astrolabe", self, "device_batch_size")
        if self.window_per_step and self.window_frames is None:
            raise ConfigError(
                "train.astrolabe.window_per_step draws one streaming window per step: it needs train.astrolabe.window_frames"
            )
        if not self.timesteps or any(not 0 < int(t) <= 1000 for t in self.timesteps):
            raise ConfigError(f"train.astrolabe.timesteps must be levels in (0, 1000], got {self.timesteps}")
        _positive("astrolabe", self, "beta", "advantage_clip")
        if self.kl_weight < 0 or self.ema_rate < 0:
            raise ConfigError(
                f"train.astrolabe.kl_weight and train.astrolabe.ema_rate must be >= 0, got {self.kl_weight}, {self.ema_rate}"
            )
        _below_one("astrolabe", self, "ema_max")

    def _check_selective_kl(self) -> None:
        if not self.selective_kl:
            for key in ("main_reward", "other_rewards"):
                if getattr(self, key) is not None:
                    raise ConfigError(
                        f"train.astrolabe.{key} is an option of train.astrolabe.selective_kl, which is off"
                    )
            return
        if self.kl_weight <= 0:
            raise ConfigError(
                f"train.astrolabe.selective_kl selects the samples of the KL term: it needs train.astrolabe.kl_weight > 0, got {self.kl_weight}"
            )
        if not self.main_reward:
            raise ConfigError(
                "train.astrolabe.main_reward is required with train.astrolabe.selective_kl (the key of an ensemble member)"
            )
        others = self.other_rewards
        if others is not None and (
            not others or self.main_reward in others or len(set(others)) < len(others)
        ):
            raise ConfigError(
                f"train.astrolabe.other_rewards must be distinct ensemble member keys other than main_reward {self.main_reward!r}, got {others}"
            )


@dataclass
class RWRConfig:
    """Options of the ``rwr`` loss (reward-weighted regression, the baseline of DDPO, Black et al.
    2023; ``genalign.trainers.losses.rwr``): ``weighting`` "exp" (w = exp(beta * A)) or "sparse"
    (w = 1[A >= threshold]), A being each sample's advantage; ``guided``: regress the output the
    rollouts were sampled with (classifier-free guidance included) instead of the conditional
    branch."""

    weighting: Literal["exp", "sparse"] = "exp"
    beta: float = 1.0
    threshold: float = 0.0
    guided: bool = False

    def __post_init__(self) -> None:
        _positive("rwr", self, "beta")


@dataclass
class ReFLConfig:
    """Options of the ``refl`` loss (reward feedback learning, Xu et al. 2023;
    ``genalign.trainers.losses.refl``): the grid steps ``min_step .. max_step`` (0 = the noisiest; None:
    the last) whose one-step x0 prediction is scored; ``guided``: predict with the rollouts'
    classifier-free guidance instead of the conditional branch; ``objective``: ``"linear"``, the
    loss ``-scale * reward``, or ``"relu"``, ImageReward's ``scale * ReLU(margin - reward)`` (the
    official ReFL trains with ``guided: false``, ``objective: relu``, ``margin: 2`` and
    ``scale: 1e-3``, its ``grad_scale``)."""

    min_step: int = 0
    max_step: int | None = None
    guided: bool = True
    scale: float = 1.0
    objective: Literal["linear", "relu"] = "linear"
    margin: float = 2.0

    def __post_init__(self) -> None:
        _non_negative("refl", self, "min_step")
        if self.max_step is not None and self.max_step < self.min_step:
            raise ConfigError(
                f"train.refl.max_step {self.max_step} must be >= train.refl.min_step {self.min_step}"
            )
        _positive("refl", self, "scale")


@dataclass
class SolRLConfig:
    """Options of the ``sol_rl`` rollout strategy (Sol-RL, 2025; ``genalign.trainers.strategies.sol_rl``).

    Per prompt, ``pool_size`` candidates are drawn with the denoiser in ``preview_precision`` and
    ``preview_steps`` sampling steps (0: no preview stage, the pool is drawn at training precision
    and steps and selected directly: the "naive scaling" baseline), scored, and ``selection``
    keeps ``keep_top`` best and ``keep_bottom`` worst (``best_worst``), ``keep_top + keep_bottom``
    at random (``random``) or the whole pool (``all``); the kept ones are regenerated from the same
    seeds and initial noise at training precision with the training sampler and step count.
    ``skip_modules`` / ``min_dim``: linear layers kept in high precision (Sol-RL's
    ``nvfp4_skip_modules`` / ``nvfp4_min_dim``). ``preview_batch_size``: candidates per rollout
    call (None: all of this process's at once).
    """

    pool_size: int = 96
    keep_top: int = 12
    keep_bottom: int = 12
    preview_steps: int = 6
    preview_precision: Literal["fp32", "bf16", "fp16", "fp8", "nvfp4", "nvfp4_simulated", "int8"] = "nvfp4"
    selection: Literal["best_worst", "random", "all"] = "best_worst"
    skip_modules: list[str] = field(default_factory=list)
    min_dim: int = 0
    preview_batch_size: int | None = None

    def __post_init__(self) -> None:
        _positive("sol_rl", self, "pool_size")
        if self.keep_top < 0 or self.keep_bottom < 0 or self.keep_top + self.keep_bottom == 0:
            raise ConfigError(
                f"train.sol_rl.keep_top / keep_bottom must be >= 0 and not both 0, got {self.keep_top} / {self.keep_bottom}"
            )
        if self.keep_top + self.keep_bottom > self.pool_size:
            raise ConfigError(
                f"train.sol_rl.keep_top + keep_bottom ({self.keep_top + self.keep_bottom}) exceeds "
                f"train.sol_rl.pool_size {self.pool_size}"
            )
        if self.preview_steps < 0 or self.min_dim < 0:
            raise ConfigError(
                f"train.sol_rl.preview_steps and train.sol_rl.min_dim must be >= 0, got {self.preview_steps}, {self.min_dim}"
            )
        if self.preview_batch_size is not None:
            _positive("sol_rl", self, "preview_batch_size")

    @property
    def kept_per_prompt(self) -> int:
        return self.pool_size if self.selection == "all" else self.keep_top + self.keep_bottom


@dataclass
class TokenPPOConfig:
    """Options of the ``token_ppo`` loss of the ``language`` family
    (``genalign.trainers.losses.token_ppo``; the math is :func:`genalign.algorithms.token_ppo_loss`).

    ``eps_low`` / ``eps_high``: the per-token ratio is clipped to ``[1 - eps_low, 1 + eps_high]``
    (PPO / GRPO: both 0.2; DAPO's clip-higher, Yu et al. 2025, eq. 10: 0.2 / 0.28).
    ``aggregation``: how per-token terms become the loss: ``"sequence_mean"`` (each completion's
    mean over its tokens, then the mean over completions: GRPO, Shao et al. 2024, eq. 3, and UniRL's
    PromptRL trainer), ``"token_mean"`` (every token of the minibatch weighs the same: DAPO) or
    ``"constant"`` (the token sum over ``B * sampling.language.max_new_tokens``: Dr. GRPO, Liu et
    al. 2025). The weight of the k3 KL to the reference is ``train.kl_coef`` (UniRL: 0.01).
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    aggregation: Literal["sequence_mean", "token_mean", "constant"] = "sequence_mean"

    def __post_init__(self) -> None:
        if not 0.0 < self.eps_low < 1.0:
            raise ConfigError(f"train.token_ppo.eps_low must lie in (0, 1), got {self.eps_low}")
        _positive("token_ppo", self, "eps_high")


@dataclass
class PromptRewriteConfig:
    """Options of the ``prompt_rewrite`` rollout strategy (PromptRL, arXiv 2602.01382; UniRL's
    joint trainers; ``genalign.trainers.strategies.prompt_rewrite``). The rewriter is the recipe's
    ``rewriter`` section, its sampling ``sampling.language`` (UniRL: temperature 1.0, 512 tokens).

    ``template``: what the rewriter is asked, with ``{prompt}`` for the original prompt (default:
    UniRL's GenEval template, :data:`genalign.algorithms.prompt_rewrite.GENEVAL_TEMPLATE`).
    ``fallback``: the prompt drawn when a completion has no closed ``<answer>`` tag, the
    ``"original"`` prompt or the whole ``"completion"`` (UniRL's). ``format_weight``: weight of
    the format reward (1 with an answer tag, else 0) added to the task reward (UniRL: 1).
    ``num_retained``: rows of each group that draw the original prompt and get no rewriter
    gradient (UniRL's edit trainer, ``NUM_SKIP_REFINEMENT=2`` of 8; 0 as its GenEval trainer).
    ``trains``: ``"both"`` (the joint trainer), ``"rewriter"`` (the generator frozen and sampled
    by ODE: UniRL's ``GenEvalPromptGRPOTrainer``) or ``"generator"`` (the rewriter frozen).
    ``rewriter_kl_coef``: the k3 KL coefficient of the rewriter's ``token_ppo`` loss (UniRL
    hard-codes 0.01; ``train.kl_coef`` is the generator's beta).
    """

    template: str | None = None
    fallback: Literal["original", "completion"] = "original"
    format_weight: float = 1.0
    num_retained: int = 0
    trains: Literal["both", "rewriter", "generator"] = "both"
    rewriter_kl_coef: float = 0.01

    def __post_init__(self) -> None:
        if self.template is not None and "{prompt}" not in self.template:
            raise ConfigError("train.prompt_rewrite.template must hold '{prompt}' (the original prompt)")
        _non_negative("prompt_rewrite", self, "num_retained", "rewriter_kl_coef")


@dataclass
class SVGTaskConfig:
    """Options of the ``svg`` rollout strategy: RLRF's SVG-writing tasks on the ``language`` family
    (Rodriguez et al. 2025, arXiv 2505.20793; ``genalign.trainers.strategies.svg``).

    ``task``: ``"image_to_svg"`` shows each prompt's image (prompt metadata ``images``) to a VLM
    with the prompt as the instruction; ``"text_to_svg"`` gives a language model the prompt (a
    caption) alone. Either way the reward gets the SVG extracted from each completion
    (:func:`genalign.rewards.svg.extract_svg`; ``repair``: close a root cut off by
    ``max_new_tokens``) and, per sample, ``targets`` (the prompt's image, when the pool has
    ``images``) and ``reference_svgs`` (when it has them).

    ``baseline``: ``"group"`` (the group mean, as ``train.advantage: group``) or ``"greedy"``
    (ReMax, Li et al. 2023: each group's prompt is also answered at ``greedy_temperature`` and that
    answer's reward replaces the group mean, so a sample is reinforced only when it beats the
    policy's mode; ``train.advantage_std`` still scales; docs/language.md section 5.2).
    ``credit`` (with the greedy baseline): ``"sequence"`` (every completion token carries the
    sample's advantage) or ``"divergence"`` (only the tokens from the first one where the sample
    leaves its group's greedy answer: the shared prefix is the mode's, not the sample's choice).
    ``rollout``: ``"sample"`` (G completions at the sampling temperature, RLRF's) or ``"branch"``
    (our variant: each sample copies its group's greedy answer up to one position, draws another
    token there and finishes greedily; only that token is trained, against the greedy answer's
    reward, whatever ``baseline`` says; ``genalign.trainers.strategies.svg_branch``).
    """

    task: Literal["image_to_svg", "text_to_svg"] = "image_to_svg"
    repair: bool = True
    baseline: Literal["group", "greedy"] = "group"
    greedy_temperature: float = 0.01  # ~greedy (sampling needs a positive temperature)
    credit: Literal["sequence", "divergence"] = "sequence"
    rollout: Literal["sample", "branch"] = "sample"

    def __post_init__(self) -> None:
        if self.rollout not in ("sample", "branch"):
            raise ConfigError(f"train.svg.rollout must be 'sample' or 'branch', got {self.rollout!r}")
        if self.rollout == "branch" and self.credit != "sequence":
            raise ConfigError(
                "train.svg.rollout 'branch' trains each sample's branch token alone; "
                "leave train.svg.credit at 'sequence'"
            )
        if self.baseline not in ("group", "greedy"):
            raise ConfigError(f"train.svg.baseline must be 'group' or 'greedy', got {self.baseline!r}")
        if self.credit not in ("sequence", "divergence"):
            raise ConfigError(f"train.svg.credit must be 'sequence' or 'divergence', got {self.credit!r}")
        if self.credit == "divergence" and self.baseline != "greedy":
            raise ConfigError(
                "train.svg.credit 'divergence' needs train.svg.baseline 'greedy' (its greedy answers)"
            )
        _positive("svg", self, "greedy_temperature")


@dataclass
class SFTConfig:
    """Options of supervised fine-tuning of a ``language`` policy (``train.method: sft``: the
    ``sft`` strategy and loss; RLRF's stage 1, "SVG-SFT", Rodriguez et al. 2025, Sec. 3.1).

    ``target``: the prompt-metadata column holding each prompt's target text (``completions``,
    or ``reference_svgs`` to imitate the ground-truth SVGs); ``image_inputs``: show each prompt's
    image (metadata ``images``) to a VLM; ``aggregation``: ``"token_mean"`` (the minibatch's
    target tokens weigh the same, as transformers' causal-LM loss) or ``"sequence_mean"`` (each
    target's token mean, then the mean over targets). An end-of-turn token closes every target.
    """

    target: str = "completions"
    image_inputs: bool = False
    aggregation: Literal["token_mean", "sequence_mean"] = "token_mean"


@dataclass
class QHawkeyeConfig:
    """Options of Q-Hawkeye (Xie et al. 2026, arXiv 2601.22920): the ``q_hawkeye`` strategy and loss
    of the ``language`` family (``genalign.trainers.strategies.q_hawkeye``, ``...losses.q_hawkeye``).

    Advantages (strategy): ``uncertainty``: scale each group's GRPO advantages by
    ``exp(-alpha * clip(Var(parsed scores) / (0.25 (score_max - score_min)^2), 0, 1))`` (UA-GRPO;
    false: plain GRPO advantages, the ablation); ``alpha``, ``score_min``, ``score_max`` (official
    0.2, 1, 5). Loss: ``perception_gamma``: weight of the perception term ``-gamma * mean(k3)``
    between the completion's log-probs given the original and the degraded image (official 1e-4;
    0: off); ``perception_anneal_steps``: training steps over which gamma is cosine-annealed to 0
    (None: ``train.num_steps``; 0: constant); ``perception_clamp``: the per-token k3 clamp (10);
    ``ratio_clip``: clip the token ratio to ``train.token_ppo``'s range (false: the official loss,
    ``exp(logp - sg(logp)) * A``, whose ``epsilon_high`` is passed but never used).
    ``rank_weight``: weight of a ranking term added to each completion's reward before the
    advantages, VisualQuality-R1's Thurstone fidelity against the step's other images
    (:func:`genalign.algorithms.thurstone_fidelity_rewards`; not in Q-Hawkeye: 0, the official run).
    ``copy_weight``: with w > 0 every drawn image's degraded copy is rolled out as a group of its
    own, without a MOS (no accuracy term), and each copy completion earns ``w`` when its score is
    below the mean of its original's group (:func:`genalign.algorithms.copy_below_original_rewards`;
    our variant, not in Q-Hawkeye: 0, the official run). It doubles the completions per step.
    """

    uncertainty: bool = True
    alpha: float = 0.2
    score_min: float = 1.0
    score_max: float = 5.0
    perception_gamma: float = 1e-4
    perception_anneal_steps: int | None = None
    perception_clamp: float = 10.0
    ratio_clip: bool = False
    rank_weight: float = 0.0
    copy_weight: float = 0.0

    def __post_init__(self) -> None:
        _non_negative("q_hawkeye", self, "alpha")
        _non_negative("q_hawkeye", self, "rank_weight")
        _non_negative("q_hawkeye", self, "copy_weight")
        if self.score_max <= self.score_min:
            raise ConfigError(
                f"train.q_hawkeye.score_max {self.score_max} must exceed train.q_hawkeye.score_min {self.score_min}"
            )
        _non_negative("q_hawkeye", self, "perception_gamma")
        if self.perception_anneal_steps is not None:
            _non_negative("q_hawkeye", self, "perception_anneal_steps")
        _positive("q_hawkeye", self, "perception_clamp")
