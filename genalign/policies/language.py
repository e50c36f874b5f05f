"""The ``language`` family: transformers causal LMs and VLMs as token-level RL policies.

A language policy's action is one token; a rollout samples a completion per prompt and records,
per completion token, ``log softmax(logits / T)`` of the sampled token (T the sampling
temperature). Those log-probs are **recomputed by a separate teacher-forced forward pass** over
the finished sequences, never read off ``generate``'s scores, so :meth:`LanguagePolicy.log_prob`
under unchanged weights reproduces them exactly and the first inner ratio of a PPO update is 1
(the contract of DESIGN.md, "Language policies"; PromptRL, arXiv 2602.01382, and the official
UniRL code recompute them the same way, ``_get_per_token_logps``).

Prompts are padded on the left. Every forward gets the attention mask and position ids counted
over real tokens only (``cumsum(mask) - 1``), so a prompt's log-probs do not depend on how much
padding its batch needed (UniRL's GenEval trainer runs this forward without an attention mask;
``docs/fidelity.md``). Models with multimodal rotary positions (Qwen2-VL, Qwen2.5-VL) compute
their own 3-D positions from the attention mask and image grids instead, and their packed
``pixel_values`` are kept per sample (:mod:`genalign.policies.language_vision`).

Sampling is temperature sampling with one ``torch.Generator`` per sample: at each new token the
sample draws Gumbel noise of the vocabulary's size from its own generator and takes
``argmax(logits / T + g)`` (the Gumbel-max trick, an exact draw from ``softmax(logits / T)``), so a
sample's tokens are a function of its prompt and seed, whatever else is in the batch. Decoding
runs through ``generate`` (its KV cache and each model's own position handling) with greedy
search over a logits processor that makes the drawn token the only finite one; the model's
generation config (repetition penalty, top-k, top-p) is not used. Top-k / top-p truncation is
ours to set (``top_k`` / ``top_p`` of :meth:`LanguagePolicy.rollout`): sampling truncates the
tempered softmax, and every recomputed log-prob replays the same truncation on its own logits
(:mod:`genalign.algorithms.token_truncation`), the reference's included, so the recorded and
re-scored distributions stay the same one.

LoRA through peft (``model.add_adapter``) or full fine-tuning; the reference model
(:meth:`LanguagePolicy.reference`) is the adapter-disabled model under LoRA and a frozen copy under
full fine-tuning.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from genalign.algorithms.token_truncation import truncate_logits, validate_truncation
from genalign.policies.base import LoRASpec
from genalign.policies.language_sampling import (
    SeededSampler,
    completion_mask_after_eos,
    gumbel_max_tokens,
    own_generation_config,
    suppress_tokens,
)
from genalign.policies.language_vision import (
    forward_position_inputs,
    has_images,
    has_multimodal_positions,
    images_for_processor,
    inputs_to_device,
    pack_model_inputs,
    repeat_images,
    split_packed_inputs,
    stored_images,
)
from genalign.policies.model_folder import require_local_path
from genalign.policies.rollout_args import per_sample_generators, validate_rollout_arguments
from genalign.policies.token_trajectory import TokenSettings, TokenTrajectory

__all__ = ["LanguagePolicy", "completion_mask_after_eos", "gumbel_max_tokens", "suppress_tokens"]

logger = logging.getLogger(__name__)

# LoRA targets of the attention projections of Qwen2 / Llama-style language models
LANGUAGE_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


class LanguagePolicy(torch.nn.Module):
    """A causal LM (``AutoModelForCausalLM``) or VLM (``AutoModelForImageTextToText`` with its
    processor) as a policy over completions.

    Args:
        model: the loaded transformers model.
        processor: its tokenizer, or for a VLM its processor (which holds the tokenizer).
        lora: a :class:`~genalign.policies.LoRASpec` (or its dict) to train LoRA adapters (its
            ``target_modules`` must name the model's linear layers, e.g. ``q_proj``), or None for
            full fine-tuning (a frozen copy is kept as the reference).
        train: whether the model is trained at all (False: frozen, its own reference).
        frozen: under full fine-tuning, parameter-name prefixes that stay frozen (a VLM's
            ``model.vision_tower``); each must name at least one parameter.
        device, dtype: where and in what precision the frozen weights live (LoRA stays fp32).
    """

    family = "language"

    def __init__(
        self,
        model: Any,
        processor: Any,
        lora: LoRASpec | dict | None = None,
        train: bool = True,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        frozen: Sequence[str] = (),
    ) -> None:
        super().__init__()
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        dtype = _dtype(dtype)
        model.to(self.device)
        if dtype is not None:
            model.to(dtype=dtype)
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.tokenizer.padding_side = "left"  # generation continues the prompt's last token
        self.is_vlm = self.tokenizer is not processor
        self.eos_token_ids = self._eos_token_ids()
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.multimodal_positions = has_multimodal_positions(model)  # Qwen2-VL's 3-D rotary positions
        # a VLM's image / video placeholders: never sampled, never scored (suppress_tokens)
        names = ("image_token_id", "image_token_index", "video_token_id")
        placeholders = {getattr(model.config, name, None) for name in names} - {None}
        self.suppressed_token_ids = sorted(int(i) for i in placeholders if 0 <= int(i) < len(self.tokenizer))
        self.lora = LoRASpec(**lora) if isinstance(lora, dict) else lora
        self._reference_model: torch.nn.Module | None = None
        self.synced_generation = False  # set when the trainer shards the model (FSDP)
        model.requires_grad_(False)
        if self.lora is not None:
            self._add_lora(train)
        elif train:
            model.requires_grad_(True)
            self._freeze(frozen)
            self._reference_model = copy.deepcopy(model).requires_grad_(False).eval()
        if frozen and (self.lora is not None or not train):
            raise ValueError("frozen applies to full fine-tuning (no lora, train=True)")

    def _freeze(self, prefixes: Sequence[str]) -> None:
        """Stop gradients to the parameters under each name prefix (``model.frozen``)."""
        named = dict(self.model.named_parameters())
        for prefix in prefixes:
            hits = [name for name in named if name == prefix or name.startswith(prefix + ".")]
            if not hits:
                example = next(iter(named), "")
                raise ValueError(
                    f"model.frozen entry {prefix!r} names no parameter (they look like {example!r})"
                )
            for name in hits:
                named[name].requires_grad_(False)

    def _add_lora(self, train: bool) -> None:
        spec = self.lora
        names = {name.rsplit(".", 1)[-1] for name, _ in self.model.named_modules()}
        if not set(spec.target_modules) & names:
            raise ValueError(
                f"model.lora.target_modules {list(spec.target_modules)} name no module of "
                f"{type(self.model).__name__}; its attention projections are e.g. {list(LANGUAGE_LORA_TARGETS)}"
            )
        from peft import inject_adapter_in_model

        # peft directly: transformers' ``add_adapter`` asks for a newer peft than diffusers does
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            inject_adapter_in_model(spec.to_peft(), self.model)
        for name, parameter in self.model.named_parameters():
            if "lora_" in name:
                parameter.data = parameter.data.float()
                parameter.requires_grad_(train)

    def _eos_token_ids(self) -> list[int]:
        """The ids that end a completion: the generation config's, else the tokenizer's EOS."""
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if configured is None:
            configured = self.tokenizer.eos_token_id
        if configured is None:
            raise ValueError("neither the model's generation config nor its tokenizer names an EOS token")
        return [int(i) for i in (configured if isinstance(configured, (list, tuple)) else [configured])]

    # ---- loading -------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        lora: LoRASpec | dict | None = None,
        train: bool = True,
        dtype: torch.dtype | str | None = None,
        device: str | torch.device | None = None,
        frozen: Sequence[str] = (),
        processor_kwargs: dict[str, Any] | None = None,
        **model_kwargs: Any,
    ) -> LanguagePolicy:
        """Load from a hub id (e.g. ``Qwen/Qwen2.5-0.5B-Instruct``) or a local transformers folder.

        A model whose config has a ``vision_config`` loads as ``AutoModelForImageTextToText`` with
        ``AutoProcessor``; any other as ``AutoModelForCausalLM`` with ``AutoTokenizer``.
        ``processor_kwargs`` go to that processor's (tokenizer's) ``from_pretrained``, e.g.
        ``{"max_pixels": 786432}`` to cap a Qwen-VL's image area.
        """
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForImageTextToText,
            AutoProcessor,
            AutoTokenizer,
        )

        require_local_path(path)
        if Path(path).exists() and not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a transformers model folder: missing config.json")
        dtype = _dtype(dtype)
        if dtype is not None:
            model_kwargs.setdefault("dtype", dtype)
        config = AutoConfig.from_pretrained(str(path))
        vlm = getattr(config, "vision_config", None) is not None
        loader = AutoModelForImageTextToText if vlm else AutoModelForCausalLM
        model = loader.from_pretrained(str(path), **model_kwargs)
        processor = (AutoProcessor if vlm else AutoTokenizer).from_pretrained(
            str(path), **(processor_kwargs or {})
        )
        return cls(model, processor, lora=lora, train=train, device=device, dtype=dtype, frozen=frozen)

    def save_pretrained(self, folder: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
        """Write the trained weights with the tokenizer or processor: under LoRA a peft adapter
        folder (``adapter_config.json``, ``adapter_model.safetensors``, loadable with
        ``peft.PeftModel.from_pretrained(base_model, folder)``), otherwise the whole model in
        transformers format. ``state_dict``: the model's full state to write instead of its own
        (under FSDP the gathered one: the model's parameters are shards)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if self.lora is not None:
            from peft import get_peft_model_state_dict
            from safetensors.torch import save_file

            state = get_peft_model_state_dict(self.model, state_dict=state_dict)
            state = {f"base_model.model.{k}": v.detach().cpu().contiguous() for k, v in state.items()}
            save_file(state, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
            config = self.lora.to_peft()
            config.base_model_name_or_path = getattr(self.model, "name_or_path", None)
            config.save_pretrained(str(folder))
        else:
            self.model.save_pretrained(folder, state_dict=state_dict)
        self.processor.save_pretrained(folder)
        return folder

    # ---- the trainer's view --------------------------------------------------------------------
    @property
    def trained_module(self) -> torch.nn.Module:
        """The network whose parameters are trained (the LM, adapters included)."""
        return self.model

    @property
    def reference_module(self) -> torch.nn.Module | None:
        """The frozen copy that serves as reference under full fine-tuning (None under LoRA)."""
        return self._reference_model

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def named_trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def _enable_adapters(self, enabled: bool) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                module.enable_adapters(enabled)

    @contextlib.contextmanager
    def reference(self) -> Iterator[LanguagePolicy]:
        """Within this context the policy is the frozen base model (LoRA off / frozen copy)."""
        if self.lora is not None:
            self._enable_adapters(False)
            try:
                yield self
            finally:
                self._enable_adapters(True)
        elif self._reference_model is not None:
            trained = self.model
            self.model = self._reference_model
            try:
                yield self
            finally:
                self.model = trained
        else:
            yield self  # nothing is trained: the policy is its own reference

    # ---- prompts -------------------------------------------------------------------------------
    def render_prompts(self, prompts: Sequence[str], settings: TokenSettings, with_image: bool) -> list[str]:
        """The prompt texts the model sees: through the chat template (a user turn, after the
        optional system turn, then the assistant's generation prompt) when ``settings.chat_template``
        and the tokenizer has one, else the prompts as given."""
        template_owner = self.processor if self.is_vlm else self.tokenizer
        if not (settings.chat_template and getattr(template_owner, "chat_template", None)):
            return list(prompts)
        texts = []
        for prompt in prompts:
            content: Any = prompt
            if with_image:
                content = [{"type": "image"}, {"type": "text", "text": prompt}]
            messages = [{"role": "user", "content": content}]
            if settings.system_prompt:
                messages.insert(0, {"role": "system", "content": settings.system_prompt})
            texts.append(
                template_owner.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            )
        return texts

    def encode_prompts(
        self,
        prompts: Sequence[str],
        settings: TokenSettings,
        images: torch.Tensor | Sequence[torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Tokenize left-padded: ``input_ids`` / ``attention_mask`` ``[B, P]`` and, for a VLM given
        ``images`` ``[B, 3, H, W]`` (or B ``[3, H, W]`` tensors) in [0, 1], its processor's image
        inputs, per sample (packed ``pixel_values`` as a list of B tensors)."""
        with_image = has_images(images)
        if with_image and not self.is_vlm:
            raise ValueError("images were given, but the policy is a text-only language model")
        texts = self.render_prompts(prompts, settings, with_image)
        if with_image:
            encoded = self.processor(
                text=texts,
                images=images_for_processor(images),
                padding=True,
                return_tensors="pt",
                do_rescale=False,
            )
            encoded = split_packed_inputs(dict(encoded), len(texts))
        else:
            encoded = self.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
        return inputs_to_device(encoded, self.device)

    # ---- log-probs -----------------------------------------------------------------------------
    def _completion_logits(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, length: int, model_inputs: dict
    ) -> torch.Tensor:
        """Logits ``[B, L, V]`` (fp32) predicting the last ``length`` tokens of ``input_ids``, with
        position ids counted over real tokens so left padding changes nothing (a model with
        multimodal positions computes its own: :func:`forward_position_inputs`)."""
        model_inputs = pack_model_inputs(model_inputs, input_ids.device)
        positions = forward_position_inputs(
            self.multimodal_positions, input_ids, attention_mask, model_inputs
        )
        kwargs = {"logits_to_keep": length + 1} if self._keeps_logits else {}
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=False,
            **(model_inputs | positions),
            **kwargs,
        )
        return out.logits[:, -(length + 1) : -1].float()  # (B, L, V)

    def token_log_probs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_mask: torch.Tensor,
        temperature: float,
        model_inputs: dict[str, torch.Tensor] | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
    ) -> torch.Tensor:
        """``[B, L]`` fp32 ``log softmax(logits / T)`` of each completion token (the last
        ``L = completion_mask.shape[1]`` columns of ``input_ids``), 0 where ``completion_mask`` is 0;
        differentiable in the trainable parameters. With ``top_k`` / ``top_p`` the softmax is over
        the tokens the truncation keeps of these logits, the completion token always among them."""
        length = completion_mask.shape[1]
        logits = self._completion_logits(input_ids, attention_mask, length, dict(model_inputs or {}))
        targets = input_ids[:, -length:]
        scaled = suppress_tokens(logits, self.suppressed_token_ids) / temperature
        log_probs = torch.log_softmax(truncate_logits(scaled, top_k, top_p, keep=targets), dim=-1)
        taken = log_probs.gather(-1, targets[..., None]).squeeze(-1)  # (B, L)
        return taken * completion_mask.to(taken.dtype)

    def log_prob(self, trajectory: TokenTrajectory, step_indices: Any = None) -> torch.Tensor:
        """Per-token log-probs ``[B, L]`` of ``trajectory``'s completions under the current weights,
        at the temperature it was sampled with (``step_indices``: ignored, a completion is one step)."""
        return self.token_log_probs(
            trajectory.input_ids.to(self.device),
            trajectory.attention_mask.to(self.device),
            trajectory.completion_mask.to(self.device),
            trajectory.settings.temperature,
            pack_model_inputs(trajectory.model_inputs, self.device),
            trajectory.settings.top_k,
            trajectory.settings.top_p,
        )

    # ---- rollout -------------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(
        self,
        prompts: Sequence[str],
        group_size: int = 1,
        generator: torch.Generator | int | None = None,
        seeds: torch.Tensor | None = None,
        temperature: float = 1.0,
        max_new_tokens: int = 64,
        chat_template: bool = True,
        system_prompt: str | None = None,
        images: torch.Tensor | Sequence[torch.Tensor] | None = None,
        sampler: Any = None,
        top_k: int | None = None,
        top_p: float | None = None,
    ) -> TokenTrajectory:
        """Sample ``group_size`` completions for each prompt with per-sample seeds.

        Args:
            prompts: the distinct prompts; the batch is each repeated ``group_size`` times (B = P * G).
            generator / seeds: an int seed or ``torch.Generator`` from which one seed per sample is
                drawn, or the per-sample seeds ``[B]`` themselves; a sample drawn with the same seed,
                prompt and weights is the same completion in any batch (up to float rounding of
                the batched forward).
            temperature: ``T`` of ``softmax(logits / T)``; sampling and recorded log-probs both use it.
            max_new_tokens: the completion budget; a completion ends at its first EOS token.
            chat_template / system_prompt: render each prompt as a chat turn (module docstring).
            images: for a VLM, one image per prompt in [0, 1] (shared by its group): ``[P, 3, H, W]``,
                or P ``[3, H, W]`` tensors of any sizes (for a processor that keeps each size).
            sampler: ``sampler(generators, prompt_length, suppressed_token_ids)`` builds the
                ``generate`` logits processor that picks each token in place of the seeded
                temperature sampler (``genalign.policies.language_branch.BranchSampler``: greedy
                answers and one-token branches off them); the log-probs are still recomputed at
                ``temperature``; not with ``top_k`` / ``top_p``.
            top_k / top_p: sample from the tempered softmax truncated to its ``top_k`` most probable
                tokens, then to the smallest set of them holding mass ``top_p``; the recorded and
                every recomputed log-prob replay the truncation (None: no truncation).

        Returns:
            A :class:`TokenTrajectory`; its ``log_probs`` are recomputed by a forward pass at
            ``temperature`` over the finished sequences.
        """
        if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        validate_rollout_arguments(prompts, max_new_tokens, group_size)
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        validate_truncation(top_k, top_p)
        top_p = None if top_p is None or top_p >= 1 else float(top_p)
        if sampler is not None and (top_k is not None or top_p is not None):
            raise ValueError(
                "a custom sampler picks its own tokens: top_k / top_p apply to the seeded sampler only"
            )
        settings = TokenSettings(
            float(temperature), int(max_new_tokens), bool(chat_template), system_prompt, top_k, top_p
        )
        expanded = [p for p in prompts for _ in range(group_size)]
        batch = len(expanded)
        seeds, generators = per_sample_generators(batch, generator, self.device, seeds)
        images = repeat_images(images, len(prompts), group_size)
        # 1. Encode the prompts, left-padded
        encoded = self.encode_prompts(expanded, settings, images)
        prompt_ids, prompt_mask = encoded.pop("input_ids"), encoded.pop("attention_mask")
        # 2. Sample completions, each row from its own generator
        processor = (
            SeededSampler(generators, settings.temperature, self.suppressed_token_ids, top_k, top_p)
            if sampler is None
            else sampler(generators, prompt_ids.shape[1], self.suppressed_token_ids)
        )
        completion_ids = self._sample(prompt_ids, prompt_mask, encoded, processor, settings)
        # 3. Mask everything after each completion's first EOS
        completion_mask = completion_mask_after_eos(completion_ids, self.eos_token_ids)
        completion_ids = completion_ids.masked_fill(completion_mask == 0, self.pad_token_id)
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask.long(), completion_mask], dim=1)
        # 4. Log-probs recomputed by a teacher-forced forward at the sampling temperature
        log_probs = self.token_log_probs(
            input_ids, attention_mask, completion_mask, settings.temperature, encoded, top_k, top_p
        )
        # 5. Decode
        completions = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        return TokenTrajectory(
            prompts=expanded,
            group_ids=torch.arange(len(prompts)).repeat_interleave(group_size),
            seeds=seeds,
            input_ids=input_ids,
            attention_mask=attention_mask,
            completion_mask=completion_mask,
            log_probs=log_probs.float(),
            completions=completions,
            model_inputs=encoded,
            images=stored_images(images),
            settings=settings,
        )

    def _sample(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        model_inputs: dict[str, torch.Tensor],
        processor: Any,
        settings: TokenSettings,
    ) -> torch.Tensor:
        """``[B, L]`` completion tokens drawn through ``generate`` with ``processor`` (by default
        :class:`SeededSampler`) choosing every token."""
        from transformers import GenerationConfig, LogitsProcessorList

        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=settings.max_new_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            bos_token_id=None,
        )
        with own_generation_config(self.model, config):
            sequences = self.model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                generation_config=config,
                logits_processor=LogitsProcessorList([processor]),
                synced_gpus=self.synced_generation,  # under FSDP: the same passes on every process
                **pack_model_inputs(model_inputs, prompt_ids.device),
            )
        return sequences[:, prompt_ids.shape[1] :]
