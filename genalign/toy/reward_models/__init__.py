"""Learned reward models of the toy world: ``toy-clip`` and ``toy-vlm`` (issue #6), as runnable recipes.

Both are trained only on scenes of :func:`~genalign.toy.train_prompts` (their captions are the only
text they ever see) and are evaluated on the held-out prompts, whose combinations they never met.
They are the *rewards* of toy RL runs; ShapesEval, which they never see, is the verifier.

``toy-clip`` -- an open_clip CLIP of a small custom architecture (ViT on 64 px, 8 px patches; a
three-layer text transformer over open_clip's BPE) trained with CLIP's symmetric InfoNCE
(Radford et al. 2021, "Learning Transferable Visual Models From Natural Language Supervision",
Fig. 3) plus NegCLIP's hard negatives (Yuksekgonul et al. 2023, "When and Why Vision-Language
Models Behave like Bags-of-Words", Sec. 5: the same image with a caption that changes one
attribute). Because the toy grammar has entailment ("a photo of a circle" is true of every scene
with a circle), the contrastive targets are *all* captions true of a scene, not only its own:

    L_i2t = -1/B sum_i log sum_{t in P(i)} softmax_t(s * <v_i, u_t>)          over all train captions t
    L_t2i = -1/|T| sum_t log sum_{i in P(t)} softmax_i(s * <v_i, u_t>)         over the batch images i
    L_hn  = -1/B sum_i log softmax(s * <v_i, u_{c_i}>, s * <v_i, u_{n_i}>)_0    true c_i vs negative n_i
    L = (L_i2t + L_t2i) / 2 + lambda_hn * L_hn

with ``P(i)`` the captions whose GenEval spec holds for scene i (checked on the scene itself,
:func:`~genalign.toy.check_spec`), ``v``/``u`` the normalised image/text features and ``s`` CLIP's
learned temperature. With one positive per row and column this is exactly CLIP's loss
(``tests/toy/test_toy_reward_models.py`` checks it against ``F.cross_entropy``). Images are
augmented (colour jitter, blur, noise, JPEG, downscale-upscale, 48 px renders) so the model still
reads a generator's imperfect samples. Shipped in open_clip's hub layout, so
``load_reward("clip", model="local-dir:assets/models/toy-clip", pretrained=None)`` loads it.

``toy-vlm`` -- a LLaVA-1.5-style ``LlavaForConditionalGeneration`` (Liu et al. 2023; CLIP vision
tower, two-layer projector, Qwen2 language model) with a BPE tokenizer trained on the toy
grammar and a Qwen-style chat template. It is trained with next-token cross-entropy on the answer
token (the token the rewards read) of three instruction tasks, each rendered exactly as its reward
renders it (the templates are imported from the reward modules):

(a) VQAScore (Lin et al. 2024): ``Does this figure show "{caption}"? Please answer yes or no.``,
    "yes" for a true caption, "no" for a one-attribute-changed or a random false caption;
(b) RewardDance's comparative question (Wu et al. 2025, ``vlm_yes`` mode "comparative"): two
    images, "yes" when Image 1 is better -- it matches the prompt and the other does not, or it
    is the less degraded of two renders of one scene;
(c) Q-Align's rating (Wu et al. 2023, the ``iqa`` preset "qalign"): "How would you rate the
    quality of this image?" / "The quality of the image is" -> excellent, good, fair, poor, bad
    for renders degraded by blur, noise, JPEG or downsampling at severities 0-4.

Both are shipped (``assets/models/toy-clip``, ``assets/models/toy-vlm``; scores in their cards).
Two things made toy-vlm learn. Its vision tower is toy-clip's image encoder, frozen, read at the
penultimate layer as in LLaVA-1.5; a tower trained from scratch along with the LM collapsed to
image-independent features. And the true yes/no chats get a next-token loss on their question,
i.e. the caption is predicted from the image (``VLMRecipe.question_weight``); without it the answer
token stayed at its prior.

Recipes (``python -m genalign.toy.reward_models {toy-clip,toy-vlm} --out DIR --seed 0``) train,
save, evaluate (:func:`evaluate_reward_model` on the fixed held-out set of :func:`heldout_eval_set`)
and write the model card (``README.md``, ``card.json``).

Modules: ``data`` (scene banks, hard negatives, degradations), ``clip`` (toy-clip), ``vlm_model`` and
``vlm_train`` (toy-vlm), ``evaluate`` (the held-out evaluation), ``card`` and ``cli``; the
open_clip -> transformers weight conversions are :mod:`genalign.toy.conversion`.

``similarity`` -- toy-dreamsim, a perceptual metric for ``svg_fidelity``'s semantic term: toy-clip's
image tower fine-tuned with DreamSim's 2AFC hinge loss on scene edits (its own recipe,
``python -m genalign.toy.reward_models.similarity --out DIR``; not shipped). Its scenes come from
the train prompts, but an edit (a colour or shape changed, an object added) can draw a
combination of the held-out set, so it is not a clean reward for ``unseen_combinations`` studies.

``scene_judge`` -- toy-scene-judge, a pair judge of "same objects" for ``svg_fidelity``'s ``judge``
term (:class:`genalign.rewards.svg.judge.PairJudge`), trained on the same scene edits
(``python -m genalign.toy.reward_models.scene_judge --out DIR``; not shipped; the same caveat).
"""

from __future__ import annotations

from genalign.toy.conversion import (
    open_clip_blocks_to_transformers,
    open_clip_vision,
    open_clip_vision_to_transformers,
)
from genalign.toy.reward_models.card import continued_record, write_card
from genalign.toy.reward_models.cli import VLM_OPTIONS, main
from genalign.toy.reward_models.clip import (
    CLIPRecipe,
    ClipRecipe,
    build_clip,
    clip_batch_loss,
    clip_loss,
    multi_positive_info_nce,
    save_clip,
    train_clip,
)
from genalign.toy.reward_models.data import (
    ATTRIBUTES,
    DEGRADATIONS,
    SEVERITIES,
    SceneBank,
    augment,
    augment_batch,
    build_bank,
    degrade,
    down_up,
    false_variants,
    gaussian_blur,
    jpeg,
    one_attribute_variants,
    render_backend,
    to_size,
    truth_matrix,
)
from genalign.toy.reward_models.evaluate import (
    EVAL_PER_CATEGORY,
    EVAL_SEED,
    MODEL_NAMES,
    SUBSET_SIZE,
    EvalItem,
    evaluate_reward_model,
    heldout_eval_set,
    load_toy_reward,
    subset_indices,
    subset_scores,
)
from genalign.toy.reward_models.vlm_model import (
    RATING_WORDS,
    VLMRecipe,
    answer_token,
    build_vlm,
    vlm_tokenizer,
)
from genalign.toy.reward_models.vlm_train import (
    CAPTION_QUESTION,
    VLMTasks,
    caption_loss,
    question_loss,
    save_vlm,
    train_vlm,
)

__all__ = [
    "ATTRIBUTES",
    "CAPTION_QUESTION",
    "DEGRADATIONS",
    "EVAL_PER_CATEGORY",
    "EVAL_SEED",
    "MODEL_NAMES",
    "RATING_WORDS",
    "SEVERITIES",
    "SUBSET_SIZE",
    "VLM_OPTIONS",
    "CLIPRecipe",
    "ClipRecipe",  # deprecated alias of CLIPRecipe
    "EvalItem",
    "SceneBank",
    "VLMRecipe",
    "VLMTasks",
    "answer_token",
    "augment",
    "augment_batch",
    "build_bank",
    "build_clip",
    "build_vlm",
    "caption_loss",
    "clip_batch_loss",
    "clip_loss",
    "continued_record",
    "degrade",
    "down_up",
    "evaluate_reward_model",
    "false_variants",
    "gaussian_blur",
    "heldout_eval_set",
    "jpeg",
    "load_toy_reward",
    "main",
    "multi_positive_info_nce",
    "one_attribute_variants",
    "open_clip_blocks_to_transformers",
    "open_clip_vision",
    "open_clip_vision_to_transformers",
    "question_loss",
    "render_backend",
    "save_clip",
    "save_vlm",
    "subset_indices",
    "subset_scores",
    "to_size",
    "train_clip",
    "train_vlm",
    "truth_matrix",
    "vlm_tokenizer",
    "write_card",
]
