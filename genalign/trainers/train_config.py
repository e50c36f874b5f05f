"""``train``: the schema of a recipe's RL algorithm and optimiser (:class:`TrainConfig`).

Every field is documented once, in the section of the class docstring for what it controls; the
fields are declared in the same groups, and each group's cross-field checks sit in the check
method named after it (run by ``__post_init__``), as trl documents and checks its configs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from genalign.algorithms.schedules import learning_rate_factor
from genalign.config import ConfigError
from genalign.trainers.method_config import (
    AstrolabeConfig,
    B2DiffuRLConfig,
    NFTConfig,
    PromptRewriteConfig,
    QHawkeyeConfig,
    ReFLConfig,
    RWRConfig,
    SFTConfig,
    SolRLConfig,
    SVGTaskConfig,
    TokenPPOConfig,
)

__all__ = ["TrainConfig"]

Method = Literal[
    "ddpo",
    "grpo",
    "flow_grpo",
    "rlcm",
    "b2diffurl",
    "diffusion_nft",
    "sol_rl",
    "rwr",
    "refl",
    "sft",
    "promptrl",
    "q_hawkeye",
    "astrolabe",
]


@dataclass
class TrainConfig:
    """The RL algorithm and optimiser (``train`` in a recipe).

    **What is trained**

    * ``method``: the recipe's method (``genalign list``); it fixes the policy family it is for
      and, for methods defined by their loss (``diffusion_nft``, ``rwr``, ``refl``), the loss
      (checked by :class:`~genalign.trainers.config.RecipeConfig`).
    * ``strategy``: the rollout strategy, a name in ``genalign.trainers.strategies.STRATEGIES``
      (``groups``, ``b2diffurl``, ``sol_rl``) or ``"package.module:Class"``.
    * ``loss``: the loss, a name in ``genalign.trainers.losses.LOSSES`` (``ppo_clip``, ``nft``,
      ``rwr``, ``refl``, ``token_ppo`` for the ``language`` family) or ``"package.module:Class"``.
    * ``seed``: the global batch of every step (prompts, sample seeds, permutations) is a pure
      function of ``(seed, step)``.

    **Batch** (``_check_batch``, ``_check_minibatches``)

    * ``num_steps``: training steps of the run.
    * ``prompts_per_step`` / ``group_size``: each step draws ``prompts_per_step`` prompts and
      ``group_size`` samples for each: ``samples_per_step = prompts_per_step * group_size``
      samples across all processes. ``batch_size`` (optional) gives the samples per step
      instead; ``prompts_per_step`` is then ``batch_size / group_size``.
    * ``minibatch_size``: samples per minibatch of an inner epoch; must divide the batch.
    * ``gradient_accumulation_steps``: one optimiser step per this many minibatches.
    * ``inner_epochs``: passes over each step's samples (PPO's epochs).

    **Which denoising steps are trained** (``_check_steps``)

    * ``timestep_fraction``: ``k = int(T * timestep_fraction)`` (at least 1) with T the grid steps
      (within a loss's or strategy's window), floored as DDPO and Flow-GRPO do; k of the
      stochastic ones among them are trained (all of them if fewer).
    * ``timestep_order``: "random" trains a random subset per sample (DDPO), "first" the first k
      in sampling order for every sample (Flow-GRPO).
    * ``fuse_timesteps``: run a minibatch's k trained steps as one loss call on k x its samples
      instead of k calls (the same loss and gradient: the mean over rows of per-row terms; faster
      for small models, k times the activation memory). Only for losses that are such a mean
      (``nft``, ``ppo_clip``: :attr:`~genalign.trainers.losses.base.PolicyLoss.row_mean`).
    * ``group_noise``: for a forward-process loss (``nft``), the samples of one prompt group train
      on the same noise levels with the same forward noise eps, and minibatches hold whole groups
      (``minibatch_size`` a multiple of ``group_size``). Group advantages sum to zero, so the eps
      in the regression targets cancels in the group's gradient where the samples' Jacobians
      agree, as Diffusion-DPO's code gives its winner and loser one noise and timestep
      (SalesforceAIResearch/DiffusionDPO ``train.py``; our variant for groups, docs/fidelity.md).
      On the toy demo it cut the gradient variance but did not raise the gain
      (docs/toy_rl_study.md section 18).

    **Optimiser and learning rate** (``_check_optimiser``)

    * ``learning_rate``, ``adam_betas``, ``adam_weight_decay``, ``adam_epsilon``: AdamW's.
    * ``max_grad_norm``: the gradient norm is clipped to it (0: not clipped).
    * ``lr_warmup_steps``: optimiser steps of linear warm-up; then ``lr_schedule`` "constant" or
      "linear" (to 0 after ``lr_decay_steps`` optimiser steps; None: the run's planned optimiser
      steps, :attr:`planned_optimizer_steps`) or "step" (times ``lr_step_factor`` every
      ``lr_step_every`` optimiser steps: RLRF's decay) or "cosine" (to 0 after ``lr_decay_steps``, as
      transformers' cosine schedule with warm-up: Q-Hawkeye),
      :func:`genalign.algorithms.schedules.learning_rate_factor`.
    * ``policy_learning_rates``: the learning rate of each policy of a joint run (a
      :class:`~genalign.policies.JointPolicy`, e.g. PromptRL's ``{rewriter: 1.0e-6, generator:
      2.0e-7}`` as UniRL), each its own AdamW parameter group under the same schedule; a policy
      not named trains at ``learning_rate``.
    * ``ema_decay``: keep an EMA of the trained weights with this decay and export it (None: off).

    **Policy-gradient loss and KL** (``_check_loss``)

    * ``clip_range``: PPO's clip range of the ``ppo_clip`` loss.
    * ``ratio_reduction``: "mean" divides log-probs by the number of latent elements before the
      ratio (DDPO, Flow-GRPO, so their clip ranges carry over); "sum" uses exact ratios.
    * ``cps_log_prob``: the ``ppo_clip`` ratio on flow CPS steps. "official" scores a step as
      flow_grpo's CPS branch does, ``-(x - mean)^2`` with every constant and the ``1 / (2 std^2)``
      dropped (the exact log-ratio times ``2 std^2``, per step), so its clip range and learning
      rate carry over; "exact" takes the Gaussian density's ratio. Other steps are exact either way.
    * ``kl_coef``: weight of the KL penalty to the reference model (0: none); for ``ppo_clip``
      ``kl_coef * ||mu_theta - mu_ref||^2 / (2 s^2)`` per trained step, for the forward-process
      losses (nft, rwr, refl) ``kl_coef * ||f_theta - f_ref||^2`` (a mean over elements, whatever
      ``kl_reduction``), for ``token_ppo`` ``kl_coef`` times the k3 estimator per completion token.
      The ``astrolabe`` loss's KL weight is ``train.astrolabe.kl_weight`` and ``sft`` has none: a
      non-zero ``kl_coef`` with either is refused (:mod:`genalign.trainers.preflight`).
    * ``kl_convention``: ``s`` of the ``ppo_clip`` KL. "official" takes Flow-GRPO's (flow_grpo's
      ``std_dev_t = noise_level sqrt(sigma / (1 - sigma))`` for the flow SDE, without the step's
      ``sqrt(-dt)``), so published ``beta`` values carry over; "exact" takes the step's own std,
      the exact Gaussian KL between the two step policies, ``1 / |dt|`` times larger for the flow
      SDE. They agree for flow CPS, DDIM (sd) and consistency steps.
    * ``kl_reduction``: sum or mean of the ``ppo_clip`` KL over latent elements (independent of the
      convention).

    **Advantages** (``_check_advantages``)

    * ``advantage``: "group" (GRPO / Flow-GRPO group-relative), "tracker" (DDPO's per-prompt
      statistics tracker), "batch" (the batch mean and std); ``advantage_std``: the std of
      "group" advantages, the group's, the global one or none (refused at load under another
      mode, which would ignore it).
    * ``tracker_buffer_size`` / ``tracker_min_count``: the tracker's history per prompt and the
      count below which it uses the batch's statistics.
    * ``advantage_clip``: advantages are clipped to ``[-advantage_clip, advantage_clip]`` (the
      ``astrolabe`` strategy clips to ``train.astrolabe.advantage_clip`` instead).
    * ``drop_zero_advantage``: samples whose advantage is exactly 0 (a group whose rewards are all
      equal) leave the update, and each minibatch's loss is the mean over its kept samples
      (Flow-GRPO's code; :mod:`genalign.trainers.minibatches`). ``zero_advantage_fraction`` is
      logged either way.

    **Precision and distribution**

    * ``mixed_precision``: accelerate's autocast for rollouts and updates ("no", "fp16", "bf16").
    * ``fsdp``: shard the denoiser (a language policy's model; a joint run's rewriter and
      generator each) with FSDP2 over the processes (also on with accelerate's FSDP config); ``fsdp_wrap``: block class names made FSDP units (empty:
      genalign's default list; a language model's own ``_no_split_modules``).

    **Method options** (:mod:`genalign.trainers.method_config`; ``_check_methods``)

    * ``b2diffurl`` (strategy ``b2diffurl``), ``sol_rl`` (strategy ``sol_rl``), ``nft`` (loss
      ``nft``), ``rwr`` (loss ``rwr``), ``refl`` (loss ``refl``), ``token_ppo`` (loss ``token_ppo``),
      ``svg`` (strategy ``svg``: RLRF's image-to-SVG / text-to-SVG tasks), ``sft`` (strategy and
      loss ``sft``: supervised fine-tuning of a language policy), ``prompt_rewrite`` (strategy
      ``prompt_rewrite``: PromptRL), ``q_hawkeye`` (strategy and loss ``q_hawkeye``: IQA judges
      trained with uncertainty-aware GRPO and a perception term), ``astrolabe`` (strategy and
      loss ``astrolabe``: the ``ar_video`` family's forward-process RL).
    """

    # what is trained
    method: Method = "grpo"
    strategy: str = "groups"
    loss: str = "ppo_clip"
    seed: int = 0
    # batch
    num_steps: int = 10
    prompts_per_step: int = 2
    group_size: int = 4
    batch_size: int | None = None
    minibatch_size: int = 8
    gradient_accumulation_steps: int = 1
    inner_epochs: int = 1
    # which denoising steps are trained
    timestep_fraction: float = 1.0
    timestep_order: Literal["random", "first"] = "random"
    fuse_timesteps: bool = False
    group_noise: bool = False
    # optimiser and learning rate
    learning_rate: float = 3e-4
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_weight_decay: float = 1e-4
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    lr_warmup_steps: int = 0
    lr_schedule: Literal["constant", "linear", "step", "cosine"] = "constant"
    lr_decay_steps: int | None = None
    lr_step_every: int = 100
    lr_step_factor: float = 0.3
    policy_learning_rates: dict[str, float] = field(default_factory=dict)
    ema_decay: float | None = None
    # policy-gradient loss and KL
    clip_range: float = 1e-4
    ratio_reduction: Literal["sum", "mean"] = "mean"
    kl_coef: float = 0.0
    kl_reduction: Literal["sum", "mean"] = "mean"
    kl_convention: Literal["official", "exact"] = "official"
    cps_log_prob: Literal["official", "exact"] = "official"
    # advantages
    advantage: Literal["group", "tracker", "batch"] = "group"
    advantage_std: Literal["group", "global", "none"] = "group"
    tracker_buffer_size: int = 32
    tracker_min_count: int = 16
    advantage_clip: float = 5.0
    drop_zero_advantage: bool = False
    # precision and distribution
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    fsdp: bool = False
    fsdp_wrap: list[str] = field(default_factory=list)
    # method options
    b2diffurl: B2DiffuRLConfig = field(default_factory=B2DiffuRLConfig)
    nft: NFTConfig = field(default_factory=NFTConfig)
    rwr: RWRConfig = field(default_factory=RWRConfig)
    refl: ReFLConfig = field(default_factory=ReFLConfig)
    sol_rl: SolRLConfig = field(default_factory=SolRLConfig)
    token_ppo: TokenPPOConfig = field(default_factory=TokenPPOConfig)
    prompt_rewrite: PromptRewriteConfig = field(default_factory=PromptRewriteConfig)
    svg: SVGTaskConfig = field(default_factory=SVGTaskConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    q_hawkeye: QHawkeyeConfig = field(default_factory=QHawkeyeConfig)
    astrolabe: AstrolabeConfig = field(default_factory=AstrolabeConfig)

    def __post_init__(self) -> None:
        # in this order, so a recipe with several faults reports the same one first as before
        self._check_batch()
        self._check_steps()
        self._check_advantages()
        self._check_minibatches()
        self._check_loss()
        self._check_optimiser()
        self._check_methods()

    def _check_batch(self) -> None:
        if self.batch_size is not None:
            if self.group_size <= 0 or self.batch_size % self.group_size != 0:
                raise ConfigError(
                    f"train.group_size {self.group_size} does not divide train.batch_size {self.batch_size}: "
                    f"a batch must hold whole prompt groups"
                )
            self.prompts_per_step = self.batch_size // self.group_size
        for key in (
            "num_steps",
            "prompts_per_step",
            "group_size",
            "minibatch_size",
            "gradient_accumulation_steps",
            "inner_epochs",
        ):
            if getattr(self, key) <= 0:
                raise ConfigError(f"train.{key} must be positive, got {getattr(self, key)}")

    def _check_minibatches(self) -> None:
        if self.samples_per_step % self.minibatch_size != 0:
            raise ConfigError(
                f"train.minibatch_size {self.minibatch_size} does not divide the batch size "
                f"{self.samples_per_step} (= prompts_per_step {self.prompts_per_step} x group_size {self.group_size})"
            )

    def _check_steps(self) -> None:
        if not 0.0 < self.timestep_fraction <= 1.0:
            raise ConfigError(f"train.timestep_fraction must lie in (0, 1], got {self.timestep_fraction}")
        if self.group_noise and self.minibatch_size % self.group_size != 0:
            raise ConfigError(
                f"train.group_noise: train.minibatch_size {self.minibatch_size} must be a multiple of "
                f"train.group_size {self.group_size}, so that a minibatch holds whole groups"
            )

    def _check_optimiser(self) -> None:
        if self.lr_decay_steps is not None and self.lr_decay_steps <= 0:
            raise ConfigError(f"train.lr_decay_steps must be positive, got {self.lr_decay_steps}")
        if (
            self.strategy == "b2diffurl"
            and self.lr_schedule in ("linear", "cosine")
            and self.lr_decay_steps is None
        ):
            raise ConfigError(
                f"train.lr_decay_steps: a {self.lr_schedule} schedule with b2diffurl needs it set (the "
                "selected branches vary in number, so the run's optimiser steps are not known ahead)"
            )
        if self.lr_step_every <= 0 or not 0 < self.lr_step_factor <= 1:
            raise ConfigError(
                f"train.lr_step_every must be positive and train.lr_step_factor in (0, 1], got "
                f"{self.lr_step_every} and {self.lr_step_factor}"
            )
        for name, rate in self.policy_learning_rates.items():
            if not rate > 0:
                raise ConfigError(f"train.policy_learning_rates.{name} must be positive, got {rate}")
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise ConfigError(f"train.ema_decay must lie in (0, 1), got {self.ema_decay}")

    def _check_loss(self) -> None:
        if self.kl_coef < 0:
            raise ConfigError(f"train.kl_coef must be >= 0, got {self.kl_coef}")

    def _check_advantages(self) -> None:
        # b2diffurl compares branches, not prompt groups: one sample per prompt is its usual setting
        # nor does supervised fine-tuning (sft): it has no rewards to compare
        grouped = self.strategy not in ("b2diffurl", "sft")
        if grouped and self.advantage == "group" and self.advantage_std == "group" and self.group_size < 2:
            raise ConfigError("train.group_size must be at least 2 for group advantages (advantage=group)")

    def _check_methods(self) -> None:
        if self.strategy == "sol_rl" and self.group_size != self.sol_rl.kept_per_prompt:
            raise ConfigError(
                f"train.group_size {self.group_size} must equal the samples sol_rl keeps per prompt "
                f"({self.sol_rl.kept_per_prompt}: train.sol_rl.keep_top + keep_bottom, or pool_size for selection=all)"
            )
        retained = self.prompt_rewrite.num_retained
        if self.strategy == "prompt_rewrite" and retained >= self.group_size:
            raise ConfigError(
                f"train.prompt_rewrite.num_retained {retained} must be below train.group_size "
                f"{self.group_size}: a group needs a rewritten row"
            )

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def trained_samples_per_step(self) -> int:
        """Samples a step trains on: ``samples_per_step``, twice that when the ``q_hawkeye``
        strategy also rolls out every image's degraded copy as a group (``copy_weight`` > 0)."""
        copies = self.strategy == "q_hawkeye" and self.q_hawkeye.copy_weight > 0
        return self.samples_per_step * (2 if copies else 1)

    @property
    def planned_optimizer_steps(self) -> int:
        """Optimiser steps of the run when every sample of every step is trained on:
        ``num_steps * inner_epochs * ceil(ceil(trained batch / minibatch) / accumulation)``."""
        minibatches = -(-self.trained_samples_per_step // self.minibatch_size)
        return self.num_steps * self.inner_epochs * -(-minibatches // self.gradient_accumulation_steps)

    def learning_rate_factor(self, optimizer_steps: int) -> float:
        """The factor of ``learning_rate`` after ``optimizer_steps`` steps (warm-up and schedule)."""
        return learning_rate_factor(
            optimizer_steps,
            self.lr_warmup_steps,
            self.lr_schedule,
            self.lr_decay_steps if self.lr_decay_steps is not None else self.planned_optimizer_steps,
            step_every=self.lr_step_every,
            step_factor=self.lr_step_factor,
        )
