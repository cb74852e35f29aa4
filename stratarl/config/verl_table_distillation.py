"""Layer 1, config: how verl's `distillation.*` keys (on-policy distillation) become ours — the one
teacher, the loss settings (the top-k loss's too), and what is not built here (several teachers).

Torch-free; `verl_translation` joins this table with the others.
"""

from __future__ import annotations

from typing import Any

from stratarl.config.verl_args import VerlArgs
from stratarl.config.verl_rules import NoEffect, Refused, Translation, none_if_empty, text_or_empty

D, DL = "distillation", "distillation.distillation_loss"
TEACHER = "distillation.teacher_models.teacher_model"


def _t(ours: str, *reads: str, compute: Any = None, how: str = "", back: Any = None) -> Translation:
    return Translation(ours, reads, compute, how, back=back)


def _clip(bound: str) -> Any:
    """clip_ratio_low/high of the policy-gradient form; clip_ratio where only it was given (verl's
    vanilla loss falls back to it)."""

    def clip(args: VerlArgs) -> float:
        if args.is_given(f"{DL}.clip_ratio") and not args.is_given(f"{DL}.{bound}"):
            return float(args.value(f"{DL}.clip_ratio"))
        return float(args.value(f"{DL}.{bound}"))

    return clip


TRANSLATIONS: list[Translation] = [
    _t("distillation.enabled", f"{D}.enabled"),
    _t(
        "distillation.teacher_model_path",
        f"{TEACHER}.model_path",
        compute=text_or_empty(f"{TEACHER}.model_path"),
        how="the one teacher; null → empty",
        back=none_if_empty(f"{TEACHER}.model_path"),
    ),
    _t("distillation.loss_mode", f"{DL}.loss_mode"),
    _t("distillation.use_policy_gradient", f"{DL}.use_policy_gradient"),
    _t("distillation.use_task_rewards", f"{DL}.use_task_rewards"),
    _t("distillation.distillation_loss_coef", f"{DL}.distillation_loss_coef"),
    _t("distillation.loss_max_clamp", f"{DL}.loss_max_clamp"),
    _t(
        "distillation.clip_ratio_low",
        f"{DL}.clip_ratio_low",
        f"{DL}.clip_ratio",
        compute=_clip("clip_ratio_low"),
    ),
    _t("distillation.topk", f"{DL}.topk"),
    _t("distillation.log_prob_min_clamp", f"{DL}.log_prob_min_clamp"),
    _t(
        "distillation.clip_ratio_high",
        f"{DL}.clip_ratio_high",
        f"{DL}.clip_ratio",
        compute=_clip("clip_ratio_high"),
    ),
]

NO_EFFECT: list[NoEffect] = [
    NoEffect(
        (f"{DL}.use_chunked_topk", f"{DL}.chunked_topk_chunk_size"),
        "forward_kl_topk's log-probs are always made a chunk of logits at a time here "
        "(actor.logit_chunk_size rows for the student, reference.logit_chunk_size for the teacher)",
    ),
    NoEffect(
        (f"{D}.n_gpus_per_node", f"{D}.nnodes", f"{TEACHER}.num_replicas", f"{TEACHER}.inference.*"),
        "the teacher's resource pool and inference engine: here it scores in the policy's process with "
        "the reference's forward, at the rollout temperature",
    ),
    NoEffect(
        (f"{TEACHER}.key", f"{D}.teacher_key"),
        "routes rows among several teachers; with the one teacher every row goes to it",
    ),
]

REFUSED: list[Refused] = [
    Refused(
        (f"{DL}.policy_loss_mode",),
        "verl 0.9.1 accepts only vanilla here, as ours (PPO clip)",
        "the default",
    ),
    Refused(
        (f"{D}.teacher_models.*",),
        "several teachers keyed by data_source are not built here",
        f"one teacher: {TEACHER}.model_path",
    ),
]
