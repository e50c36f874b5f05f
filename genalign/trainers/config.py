"""Typed schemas of a training recipe (``genalign train configs/...yaml key=value ...``).

A recipe has five sections: ``model`` (what to load and train), ``sampling`` (how rollouts are
drawn), ``reward``, ``prompts`` and ``train`` (the RL algorithm and optimiser), plus ``logging``.
Cross-field checks run at load time and name the offending keys. ``train`` is
:class:`~genalign.trainers.train_config.TrainConfig`, whose method options (``train.nft``,
``train.b2diffurl``, ...) are in :mod:`genalign.trainers.method_config`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_type_hints

from genalign.algorithms.token_truncation import validate_truncation
from genalign.config import ConfigError, load_config, to_dict
from genalign.trainers.model_config import LoRAConfig, ModelConfig, RewriterConfig
from genalign.trainers.train_config import TrainConfig

# families the nft loss trains: those whose forward_noise / predict_x0 are the denoiser's own
# training process (consistency is left out: its UNet is eps-parameterised, but it was distilled
# for the LCM sampler, not trained on the DDPM process)
NFT_FAMILIES = ("flow", "sd")
# what trains the language family: sampled completions (token_ppo) or given targets (sft)
LANGUAGE_LOSSES = ("token_ppo", "sft", "q_hawkeye")
LANGUAGE_STRATEGIES = ("groups", "svg", "sft", "q_hawkeye")


@dataclass
class LanguageSamplingConfig:
    """``sampling.language``: how a ``language`` policy samples completions
    (:meth:`genalign.policies.LanguagePolicy.rollout`).

    ``temperature``: ``T`` of ``softmax(logits / T)``, used for sampling and for every recorded and
    recomputed log-prob (UniRL's PromptRL samples at 1.0); ``max_new_tokens``: the completion
    budget (a completion also ends at its first EOS token; Dr. GRPO's constant normaliser);
    ``chat_template``: render each prompt as a user turn of the tokenizer's chat template when it
    has one; ``system_prompt``: an optional system turn before it; ``top_k`` / ``top_p``: sample
    from the tempered softmax truncated to its k most probable tokens, then to the smallest set
    holding mass p (None: no truncation); every recorded and recomputed log-prob replays it
    (:mod:`genalign.algorithms.token_truncation`).
    """

    temperature: float = 1.0
    max_new_tokens: int = 64
    chat_template: bool = True
    system_prompt: str | None = None
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ConfigError(f"sampling.language.temperature must be positive, got {self.temperature}")
        if self.max_new_tokens <= 0:
            raise ConfigError(f"sampling.language.max_new_tokens must be positive, got {self.max_new_tokens}")
        try:
            validate_truncation(self.top_k, self.top_p)
        except ValueError as error:
            raise ConfigError(f"sampling.language.{error}") from None

    def rollout_kwargs(self) -> dict[str, Any]:
        """The settings as keyword arguments of ``LanguagePolicy.rollout``."""
        return {
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "chat_template": self.chat_template,
            "system_prompt": self.system_prompt,
            "top_k": self.top_k,
            "top_p": self.top_p,
        }


@dataclass
class SamplingConfig:
    """``sampling``: how rollouts are drawn.

    ``num_inference_steps``: sampling steps T; ``guidance_scale``: classifier-free guidance
    (``negative_prompt`` its unconditional prompt); ``height`` / ``width``: image size (None: the
    family's default); ``eta``: DDIM stochasticity (sd family); ``noise_level`` / ``mode``:
    the flow SDE (flow family); ``lcm_schedule``: the consistency family's timesteps, diffusers'
    ``LCMScheduler`` ("diffusers") or RLCM's patched scheduler ("rlcm": 519/399/279/159 at the
    tail of 8 steps where diffusers has 499/379/259/139); ``lcm_final_noise``: re-noise the last
    consistency step at its own timestep and train on it, as RLCM's code does (False: the last
    step is deterministic and untrained, as in diffusers). ``num_sde_steps``: only the first this
    many steps are stochastic (and trainable), the rest deterministic (DDIM eta 0, the flow ODE):
    PromptRL's generator (UniRL's ``--num_sde``); None: every step. ``language``: the ``language``
    family's settings (:class:`LanguageSamplingConfig`); the diffusion families ignore them.
    ``training``: sampler settings for the training rollouts only (keys: ``eta``, ``noise_level``,
    ``mode``, ``num_sde_steps``); evaluations (``Trainer.rollout_kwargs``) keep the others. E.g.
    ``training: {eta: 0.0}`` collects DiffusionNFT's data with deterministic DDIM (its official
    code samples with an ODE solver: the loss needs only clean samples) while the model is
    judged with eta 1."""

    num_inference_steps: int = 20
    guidance_scale: float = 5.0
    eta: float = 1.0
    noise_level: float = 0.7
    mode: Literal["sde", "cps", "ode"] = "sde"
    height: int | None = None
    width: int | None = None
    negative_prompt: str = ""
    lcm_schedule: Literal["diffusers", "rlcm"] = "diffusers"
    lcm_final_noise: bool = False
    num_sde_steps: int | None = None
    language: LanguageSamplingConfig = field(default_factory=LanguageSamplingConfig)
    training: dict[str, Any] = field(default_factory=dict)

    TRAINING_KEYS = ("eta", "noise_level", "mode", "num_sde_steps")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.training) - set(self.TRAINING_KEYS))
        if unknown:
            raise ConfigError(
                f"sampling.training.{unknown[0]} is not a sampler setting the training rollouts can "
                f"override; choose from {list(self.TRAINING_KEYS)}"
            )
        modes = get_args(get_type_hints(SamplingConfig)["mode"])  # the field's own Literal
        if "mode" in self.training and self.training["mode"] not in modes:
            raise ConfigError(
                f"sampling.training.mode must be {', '.join(modes[:-1])} or {modes[-1]}, got {self.training['mode']!r}"
            )
        if self.num_inference_steps <= 0:
            raise ConfigError(
                f"sampling.num_inference_steps must be positive, got {self.num_inference_steps}"
            )
        for key in ("eta", "noise_level"):
            for where, value in (("", getattr(self, key)), ("training.", self.training.get(key))):
                if value is not None and not value >= 0:
                    raise ConfigError(f"sampling.{where}{key} must be >= 0, got {value}")
        for key in ("height", "width"):
            value = getattr(self, key)
            if value is not None and (value <= 0 or value % 8):
                raise ConfigError(f"sampling.{key} must be a positive multiple of 8, got {value}")
        for where, k in (("", self.num_sde_steps), ("training.", self.training.get("num_sde_steps"))):
            if k is not None and not 0 <= k <= self.num_inference_steps:
                raise ConfigError(
                    f"sampling.{where}num_sde_steps must lie in [0, num_inference_steps={self.num_inference_steps}], got {k}"
                )


@dataclass
class RewardConfig:
    """``reward``: the training reward, and optional monitors.

    ``name``: a registered reward (``genalign list``) or ``"package.module:Class"``; ``kwargs``:
    its keyword arguments. ``monitors`` maps a registered reward name to its keyword arguments; each monitor scores the
    same rollouts as the training reward, for logging only (``monitor_<name>`` in the metrics),
    never for advantages. A verifier the policy is not trained on (``shapes_eval``) makes reward
    hacking visible: the training reward rises while the monitor does not.
    """

    name: str = "jpeg_compressibility"
    kwargs: dict[str, Any] = field(default_factory=dict)
    monitors: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class PromptsConfig:
    """``prompts``: the prompt pool, an inline list (``prompts``) or a text file (``file``, one
    prompt per line, ``#`` comments; relative to the recipe's folder when not found as given).

    Prompts with per-sample metadata (a :class:`~genalign.trainers.prompt_pool.PromptPool`: target
    images, reference SVGs, supervised targets) come from ``records``, a JSON-lines file of
    ``{"prompt", "image", "svg", "completion", ...}`` records, or from ``source``, a
    ``"package.module:function"`` called with ``source_kwargs`` that returns a pool (e.g.
    ``genalign.toy.svg_tasks:toy_svg_pool``).
    """

    prompts: list[str] = field(default_factory=list)
    file: str | None = None
    records: str | None = None
    source: str | None = None
    source_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        given = [k for k in ("prompts", "file", "records", "source") if getattr(self, k)]
        if not given:
            raise ConfigError(
                "prompts: give prompts.prompts (a list), prompts.file (one prompt per line), "
                "prompts.records (JSON lines) or prompts.source (module:function)"
            )
        if len(given) > 1:
            raise ConfigError(f"prompts: give one of prompts.{', prompts.'.join(given)}")
        if self.source is not None and ":" not in self.source:
            raise ConfigError(f"prompts.source must be 'package.module:function', got {self.source!r}")

    def _resolve(self, name: str, base_dir: Path | None) -> Path:
        path = Path(name)
        if not path.is_absolute() and base_dir is not None and not path.exists():
            path = base_dir / path
        return path

    def load(self, base_dir: Path | None = None) -> list[str]:
        if self.prompts:
            return list(self.prompts)
        if self.records or self.source:
            return self._load_pool(base_dir)
        from genalign.trainers.prompt_pool import read_prompt_file

        return read_prompt_file(self._resolve(self.file, base_dir))

    def _load_pool(self, base_dir: Path | None) -> list[str]:
        """A :class:`~genalign.trainers.prompt_pool.PromptPool` from ``records`` or ``source``."""
        from genalign.registry import import_object
        from genalign.trainers.prompt_pool import PromptPool, read_prompt_records

        if self.records:
            path = self._resolve(self.records, base_dir)
            if not path.is_file():
                raise FileNotFoundError(f"prompts.records not found: {path}")
            return read_prompt_records(path)
        pool = import_object(self.source)(**self.source_kwargs)
        if not isinstance(pool, PromptPool) or not pool:
            raise ConfigError(f"prompts.source {self.source!r} returned no PromptPool of prompts")
        return pool


@dataclass
class LoggingConfig:
    """``logging``: where a run writes and what it records.

    * ``run_dir``: the run folder; ``{name}`` is the recipe's name.
    * ``trackers``: accelerate trackers that receive the numeric metrics ("wandb", "tensorboard").
    * ``sample_every``: write a sample grid every N steps (0: never).
    * ``checkpoint_every``: write a checkpoint every N steps (0: only at the end and on SIGTERM /
      Ctrl-C / a failed step); 10 by default so a crash the trainer cannot catch (kill -9, power)
      loses at most 10 steps. ``keep_last``: checkpoints kept (at least the one a resume needs).
    * ``resume``: "latest" or a checkpoint folder (None: a fresh run).
    * ``overwrite``: a fresh run (no resume) into a folder holding another run's checkpoints or
      metrics refuses; true deletes that run's outputs first
      (:data:`genalign.trainers.run_folder.RUN_OUTPUTS`).
    * ``progress``: show a progress bar.
    * ``param_change``: log each step's parameter change (``param_change``, ``param_change_rel``);
      keeps one copy of the trainable parameters during the update: turn off for a full
      fine-tune that cannot afford it.
    """

    run_dir: str = "runs/{name}"
    trackers: list[Literal["wandb", "tensorboard"]] = field(default_factory=list)
    sample_every: int = 0
    checkpoint_every: int = 10
    keep_last: int = 2
    resume: str | None = None
    overwrite: bool = False
    progress: bool = True
    param_change: bool = True

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ConfigError(
                f"logging.keep_last must be >= 1 (the checkpoint a resume needs), got {self.keep_last}"
            )
        for key in ("checkpoint_every", "sample_every"):
            if getattr(self, key) < 0:
                raise ConfigError(f"logging.{key} must be >= 0 (0: off), got {getattr(self, key)}")
        if not self.run_dir.strip():  # it would be the working directory, the user's files beside the run's
            raise ConfigError("logging.run_dir is empty: a run needs its own folder (default runs/{name})")
        try:
            self.run_dir.format(name="run")
        except (KeyError, IndexError, ValueError) as error:
            raise ConfigError(
                f"logging.run_dir {self.run_dir!r}: the only placeholder allowed is {{name}} "
                f"(braces otherwise doubled: {{{{ }}}}); {type(error).__name__}: {error}"
            ) from error


@dataclass
class RecipeConfig:
    """A training recipe: ``name`` (the run's name, ``{name}`` in ``logging.run_dir``) and the
    sections ``model``, ``sampling``, ``reward``, ``prompts``, ``train`` and ``logging``.
    ``__post_init__`` holds the checks across sections (a method's family and loss, options of one
    family set for another, B2-DiffuRL's window against the sampling steps). ``rewriter`` (optional)
    is the language model of a ``prompt_rewrite`` joint run (:class:`RewriterConfig`)."""

    name: str = "run"
    model: ModelConfig = field(default_factory=lambda: ModelConfig(path="?"))
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    prompts: PromptsConfig | None = None
    train: TrainConfig = field(default_factory=TrainConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    rewriter: RewriterConfig | None = None

    def __post_init__(self) -> None:
        # sections without defaults: "?" is ModelConfig's placeholder; no prompts had meant "a photo"
        for key, missing in (("model.path", self.model.path == "?"), ("prompts", self.prompts is None)):
            if missing:
                raise ConfigError(f"{key} is required: the recipe has no {key.split('.')[0]} section")
        methods = {
            "ddpo": ("sd",),
            "flow_grpo": ("flow",),
            "rlcm": ("consistency",),
            "diffusion_nft": NFT_FAMILIES,
            "sol_rl": ("flow",),
            "sft": ("language",),
            "q_hawkeye": ("language",),
            "astrolabe": ("ar_video",),
        }
        families = methods.get(self.train.method)
        if families is not None and self.model.family not in families:
            names = " or ".join(repr(f) for f in families)
            raise ConfigError(
                f"train.method {self.train.method!r} is for the {names} family, but model.family is {self.model.family!r}"
            )
        # methods defined by their loss: another loss would silently train something else
        losses = {
            "diffusion_nft": "nft",
            "rwr": "rwr",
            "refl": "refl",
            "sft": "sft",
            "astrolabe": "astrolabe",
        }
        loss = losses.get(self.train.method)
        if loss is not None and self.train.loss != loss:
            raise ConfigError(
                f"train.method {self.train.method!r} trains with train.loss {loss!r}, but train.loss is {self.train.loss!r}"
            )
        sampling = self.sampling
        if (
            sampling.lcm_schedule != "diffusers" or sampling.lcm_final_noise
        ) and self.model.family != "consistency":
            raise ConfigError(
                "sampling.lcm_schedule / sampling.lcm_final_noise are options of the consistency family, "
                f"but model.family is {self.model.family!r}"
            )
        if sampling.lcm_final_noise and self.train.loss != "ppo_clip":
            raise ConfigError(
                "sampling.lcm_final_noise records a re-noised last latent, which only the ppo_clip loss "
                f"trains on; train.loss {self.train.loss!r} needs the clean last latent"
            )
        self._check_language()
        self._check_ar_video()
        self._check_prompt_rewrite()
        b2 = self.train.b2diffurl
        steps = self.sampling.num_inference_steps
        if self.train.strategy == "b2diffurl" and max(b2.split_step_start, b2.split_step_end or 0) > steps:
            raise ConfigError(
                f"train.b2diffurl.split_step_start / split_step_end ({b2.split_step_start} / "
                f"{b2.split_step_end}) exceed sampling.num_inference_steps {steps}"
            )

    def _check_language(self) -> None:
        """The ``language`` family trains with ``token_ppo`` on plain groups, and only it does."""
        language = self.model.family == "language"
        loss, strategy = self.train.loss, self.train.strategy
        if language and loss not in LANGUAGE_LOSSES and ":" not in loss:
            raise ConfigError(
                f"model.family 'language' trains with train.loss 'token_ppo' (or 'sft'), but train.loss is {loss!r}"
            )
        if loss in LANGUAGE_LOSSES and not language:
            raise ConfigError(
                f"train.loss {loss!r} trains token sequences of the 'language' family, but model.family is {self.model.family!r}"
            )
        if not language:
            if self.model.frozen:
                raise ConfigError(
                    f"model.frozen is for the 'language' family, but model.family is {self.model.family!r}"
                )
            if strategy in ("svg", "sft", "q_hawkeye"):
                raise ConfigError(
                    f"train.strategy {strategy!r} is for the 'language' family, but model.family is {self.model.family!r}"
                )
            return
        if strategy not in LANGUAGE_STRATEGIES and ":" not in strategy:
            raise ConfigError(
                f"train.strategy {strategy!r} rolls out denoising chains; the 'language' family rolls out "
                "with 'groups', 'svg' or 'q_hawkeye' (or trains supervised with 'sft')"
            )
        self._check_q_hawkeye()
        # supervised fine-tuning is its own strategy and loss: either alone would train on nonsense
        if (self.train.method == "sft" or loss == "sft" or strategy == "sft") and not (
            loss == "sft" and strategy == "sft"
        ):
            raise ConfigError(
                f"supervised fine-tuning (train.method 'sft') takes train.loss 'sft' and train.strategy 'sft', "
                f"but train.loss is {loss!r} and train.strategy is {strategy!r}"
            )
        language_sampling = self.sampling.language
        truncated = language_sampling.top_k is not None or language_sampling.top_p is not None
        if truncated and strategy == "svg" and self.train.svg.rollout == "branch":
            raise ConfigError(
                "train.svg.rollout 'branch' draws its own tokens; sampling.language.top_k / top_p apply to "
                "rollout 'sample' only"
            )
        lora = self.model.lora
        if self.model.frozen and lora is not None:
            raise ConfigError(
                "model.frozen applies to full fine-tuning; under model.lora only the adapters train"
            )
        if lora is not None and list(lora.target_modules) == LoRAConfig().target_modules:
            raise ConfigError(
                f"model.lora.target_modules {list(lora.target_modules)} are a diffusers denoiser's layers; "
                "a language model's are e.g. [q_proj, k_proj, v_proj, o_proj]"
            )

    def _check_ar_video(self) -> None:
        """The ``ar_video`` family rolls out with the ``astrolabe`` strategy and loss (or plug-ins),
        without classifier-free guidance; the ``astrolabe`` strategy and loss are for it alone."""
        video = self.model.family == "ar_video"
        for key in ("strategy", "loss"):
            name = getattr(self.train, key)
            if video and name != "astrolabe" and ":" not in name:
                raise ConfigError(
                    f"model.family 'ar_video' trains with train.{key} 'astrolabe', but train.{key} is {name!r}"
                )
            if name == "astrolabe" and not video:
                raise ConfigError(
                    f"train.{key} 'astrolabe' is for the 'ar_video' family, but model.family is {self.model.family!r}"
                )
        name = self.reward.name
        if video and self.train.astrolabe.selective_kl and name != "ensemble" and ":" not in name:
            raise ConfigError(
                f"train.astrolabe.selective_kl ranks the members of an 'ensemble' reward, but reward.name is {name!r}"
            )
        if video and self.sampling.guidance_scale != 1.0:
            raise ConfigError(
                f"sampling.guidance_scale must be 1.0 for the 'ar_video' family (distilled models sample "
                f"without classifier-free guidance), got {self.sampling.guidance_scale}"
            )

    def _check_prompt_rewrite(self) -> None:
        """``prompt_rewrite`` needs a ``rewriter`` section and an sd / flow generator, and only it
        reads one; ``rewriter.learning_rate`` becomes ``train.policy_learning_rates.rewriter``."""
        rewrite = self.train.strategy == "prompt_rewrite"
        if rewrite != (self.rewriter is not None):
            raise ConfigError(
                "train.strategy 'prompt_rewrite' needs a rewriter section (the language model), and a "
                f"rewriter section needs it; got train.strategy {self.train.strategy!r} and "
                f"rewriter {'set' if self.rewriter is not None else 'missing'}"
            )
        if self.train.method == "promptrl" and not rewrite:
            raise ConfigError("train.method 'promptrl' rolls out with train.strategy 'prompt_rewrite'")
        steps = self.sampling.num_sde_steps
        if (rewrite or steps is not None) and self.model.family not in ("sd", "flow"):
            key = "train.strategy 'prompt_rewrite'" if rewrite else "sampling.num_sde_steps"
            raise ConfigError(
                f"{key} is for the 'sd' or 'flow' family, but model.family is {self.model.family!r}"
            )
        if not rewrite:
            return
        rate = self.rewriter.learning_rate
        rates = self.train.policy_learning_rates
        if rate is not None:
            if rates.get("rewriter", rate) != rate:
                raise ConfigError(
                    f"rewriter.learning_rate {rate} and train.policy_learning_rates.rewriter "
                    f"{rates['rewriter']} disagree: give one"
                )
            rates["rewriter"] = rate

    def _check_q_hawkeye(self) -> None:
        """Q-Hawkeye's perception term needs the degraded copies only its strategy rolls out."""
        train = self.train
        if train.method == "q_hawkeye" and train.strategy != "q_hawkeye" and ":" not in train.strategy:
            raise ConfigError(
                f"train.method 'q_hawkeye' rolls out with train.strategy 'q_hawkeye', but train.strategy is {train.strategy!r}"
            )
        if (
            train.loss == "q_hawkeye"
            and train.q_hawkeye.perception_gamma > 0
            and train.strategy != "q_hawkeye"
            and ":" not in train.strategy
        ):
            raise ConfigError(
                "train.q_hawkeye.perception_gamma > 0 needs the degraded image of each sample, which "
                f"train.strategy 'q_hawkeye' keeps; train.strategy is {train.strategy!r} (or set it to 0)"
            )

    def fingerprint(self, prompts: Sequence[str] | None = None) -> str:
        """Identifies the recipe for resuming: model, reward and algorithm, not run-time knobs.

        ``prompts``: the loaded prompt pool. With ``prompts.file`` the recipe holds only the file's
        name, so the pool's contents are hashed in: editing the file changes the fingerprint and a
        resume with other prompts is refused. The hash of :meth:`fingerprint_data`.
        """
        blob = json.dumps(self._fingerprinted(prompts), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def fingerprint_data(self, prompts: Sequence[str] | None = None) -> dict[str, Any]:
        """The recipe as :meth:`fingerprint` hashes it, as JSON data (checkpoints store it, so that
        a resume after an upgrade that added options can tell new options from changed ones)."""
        return json.loads(json.dumps(self._fingerprinted(prompts), sort_keys=True, default=str))

    def _fingerprinted(self, prompts: Sequence[str] | None) -> dict[str, Any]:
        data = to_dict(self)
        data.pop("logging")
        data["train"].pop("num_steps")
        for key in ("records", "source", "source_kwargs"):  # unset: fingerprints of older runs hold
            if not data["prompts"].get(key):
                data["prompts"].pop(key, None)
        if not data["model"].get("processor"):  # unset: as before model.processor existed
            data["model"].pop("processor", None)
        for key in ("svg", "sft", "q_hawkeye", "astrolabe"):  # method options of one family, likewise
            if key not in (self.train.strategy, self.train.loss):
                data["train"].pop(key, None)
        if self.prompts.file and prompts is not None:
            data["prompts"]["contents"] = hashlib.sha256("\n".join(prompts).encode()).hexdigest()
        if hasattr(prompts, "digest"):  # a PromptPool: its metadata (images, SVGs) too
            data["prompts"]["contents"] = prompts.digest()
        return data


def load_recipe(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RecipeConfig:
    """Load a recipe YAML with dotted overrides; errors name the key."""
    return load_config(RecipeConfig, path, overrides)


# Deprecated aliases: class names spell acronyms in upper case (#22); the old names keep working.
LoraConfig = LoRAConfig
