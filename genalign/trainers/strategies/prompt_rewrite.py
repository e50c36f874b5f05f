"""PromptRL's rollout: a language model rewrites each prompt, the generator draws the rewrite,
the reward scores the image against the original prompt (arXiv 2602.01382, Sec. 3, Alg. 1;
UniRL's ``GenEvalJointGRPOTrainer``, ``GenEvalPromptGRPOTrainer`` and ``EditJointGRPOTrainer``)."""

from __future__ import annotations

from typing import Any

import torch

from genalign.algorithms.prompt_rewrite import (
    GENEVAL_TEMPLATE,
    refine_prompts,
    retained_format_rewards,
    retained_rows,
)
from genalign.policies import JointPolicy, JointTrajectory
from genalign.trainers.strategies.base import STRATEGIES, RolloutBatch, RolloutContext, draw_step_groups
from genalign.trainers.strategies.groups import GroupRolloutStrategy

__all__ = ["GENERATOR", "REWRITER", "PromptRewriteStrategy"]

GENERATOR, REWRITER = "generator", "rewriter"  # the policy names of a PromptRL joint policy


@STRATEGIES.register("prompt_rewrite")
class PromptRewriteStrategy(GroupRolloutStrategy):
    """Rewrite -> draw -> score against the original prompt, with one advantage per sample.

    For each of the step's ``prompts_per_step`` prompts ``p`` (the same global batch, group ids and
    generator seeds as ``groups`` draws):

    1. the rewriter (``policy["rewriter"]``) writes ``group_size`` completions ``o_i`` of
       ``template.format(prompt=p)`` under ``sampling.language`` (UniRL: temperature 1.0, up to
       512 new tokens), each from its own seed, drawn after the global batch from the step's
       generator;
    2. the refined prompt ``q_i`` is the text inside the last ``<answer>`` tag of ``o_i``
       (:func:`~genalign.algorithms.prompt_rewrite.extract_answer`; without a tag, the original
       prompt or the completion: ``train.prompt_rewrite.fallback``); the first ``num_retained``
       rows of each group draw ``p`` itself and get no rewriter gradient (their completion mask
       is zeroed) and the mean format score of their group's rewritten rows;
    3. the generator (``policy["generator"]``) draws each ``q_i`` with the recipe's sampling
       settings, ``sampling.num_sde_steps`` SDE steps then ODE (with the generator frozen,
       ``trains: rewriter``, all ODE: UniRL's prompt-only trainer), from the same seed as the
       ``groups`` strategy would draw ``p``;
    4. ``R_i = R_task(x_i, p) + format_weight * R_format(o_i)`` (eq. 2; the reward is given the
       original prompts: ``JointTrajectory.prompts``);
    5. ``A_i = clip((R_i - mean_G) / (std_G + 1e-4), -5, 5)`` with the population std
       (``train.advantage: group``, ``advantage_std: group``, ``advantage_clip: 5``), the same
       ``A_i`` for both policies (:class:`~genalign.trainers.losses.JointLoss`).

    The batch's trajectory is a :class:`~genalign.policies.JointTrajectory`; its ``extras`` hold
    the refined prompts, the retained rows and the format rewards. Reported: ``format_reward``,
    ``task_reward``, ``rewrite_tokens`` and ``answer_rate`` (global means).
    """

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.options = config.prompt_rewrite
        self.template = self.options.template or GENEVAL_TEMPLATE

    def sample(self, context: RolloutContext, step: int) -> RolloutBatch:
        policy = context.policy
        if not isinstance(policy, JointPolicy) or set(policy.names()) != {GENERATOR, REWRITER}:
            raise TypeError(
                "the prompt_rewrite strategy needs a JointPolicy of a 'generator' and a 'rewriter' "
                "(a recipe with a rewriter section builds one)"
            )
        prompts, group_ids, seeds, generator = draw_step_groups(context.prompts, self.config, step)
        rewrite_seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator)
        rows = context.local_rows(len(prompts))
        local = [prompts[i] for i in rows.tolist()]
        retained = retained_rows(group_ids, self.options.num_retained)
        with context.precision():
            rewrites = policy[REWRITER].rollout(
                [self.template.format(prompt=p) for p in local],
                seeds=rewrite_seeds[rows],
                **context.sampling.language.rollout_kwargs(),
            )
        refined, tagged = refine_prompts(rewrites.completions, local, self.options.fallback)
        local_retained = retained[rows]
        drawn = [p if keep else q for p, q, keep in zip(local, refined, local_retained.tolist(), strict=True)]
        rewrites.completion_mask[local_retained.to(rewrites.completion_mask.device)] = 0
        kwargs = context.rollout_kwargs()
        if self.options.trains == "rewriter":
            kwargs["num_sde_steps"] = 0  # a frozen generator samples by ODE (GenEvalPromptGRPOTrainer)
        with context.precision():
            images = policy[GENERATOR].rollout(drawn, seeds=seeds[rows], **kwargs)
        images.group_ids = group_ids[rows]
        trajectory = JointTrajectory(
            parts={GENERATOR: images, REWRITER: rewrites},
            primary=REWRITER if self.options.trains == "rewriter" else GENERATOR,
            prompts=local,
            group_ids=group_ids[rows],
            seeds=seeds[rows],
            outputs_from=GENERATOR,
        )
        task, details = context.score(trajectory)  # the original prompts (trajectory.prompts)
        global_tagged = context.gather(tagged.to(context.device)).cpu()
        global_format = retained_format_rewards(global_tagged, retained, group_ids)
        local_format = global_format[rows].to(context.device)
        rewards = task + self.options.format_weight * local_format
        trajectory.extras.update(drawn_prompts=drawn, retained=local_retained, format_rewards=local_format)
        tokens = rewrites.completion_mask.sum(dim=1).float().to(context.device)
        metrics = {
            "format_reward": float(global_format.mean()),
            "answer_rate": float(global_tagged.mean()),
            "task_reward": float(context.gather(task).mean()),
            "rewrite_tokens": float(context.gather(tokens)[~retained.to(context.device)].mean()),
        }
        return RolloutBatch.of_groups(
            context, trajectory, rewards, details, rows, prompts, group_ids, metrics=metrics
        )
