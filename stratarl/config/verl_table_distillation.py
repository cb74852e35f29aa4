"""Layer 1, config: how verl's `distillation.*` keys (on-policy distillation) become ours — the one
teacher or several keyed by data_source (`teacher_models.<name>.key`), the loss settings (the top-k
loss's too), and the pool and inference knobs that have no effect here.

Torch-free; `verl_translation` joins this table with the others.
"""

from __future__ import annotations

from typing import Any

from stratarl.config.verl_args import VerlArgs
from stratarl.config.verl_rules import (
    NoEffect,
    NoVerlForm,
    Refused,
    RefusedValue,
    Translation,
    none_if_empty,
    text_or_empty,
)

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


def _entries(args: VerlArgs) -> dict[str, dict[str, Any]]:
    """verl's teacher_models entries: name -> {key, model_path} (what the routing reads)."""
    entries: dict[str, dict[str, Any]] = {}
    for rest, value in args.subtree(f"{D}.teacher_models").items():
        name, _, leaf = rest.partition(".")
        if leaf in ("key", "model_path"):
            entries.setdefault(name, {})[leaf] = value
    return entries


def _several(args: VerlArgs) -> dict[str, dict[str, Any]]:
    """The entries of several teachers (verl drops the default entry teacher_model then); {} for one."""
    entries = _entries(args)
    return {name: e for name, e in entries.items() if name != "teacher_model"} if len(entries) > 1 else {}


def _one_teacher(args: VerlArgs) -> str:
    """The one teacher's model_path; empty with several teachers (verl has no default teacher)."""
    return "" if _several(args) else text_or_empty(f"{TEACHER}.model_path")(args)


def _teachers(args: VerlArgs) -> dict[str, str]:
    """Several teachers: each entry's key (a data_source value) -> its model_path."""
    teachers: dict[str, str] = {}
    for name, entry in _several(args).items():
        key = entry.get("key")
        if not key:
            raise RefusedValue(
                f"teacher {name!r} has no key (the data_source it scores)",
                f"{D}.teacher_models.{name}.key=<data_source>",
            )
        if str(key) in teachers:
            raise RefusedValue(f"two teachers have the key {key!r}", "one teacher per data_source")
        teachers[str(key)] = "" if entry.get("model_path") is None else str(entry["model_path"])
    return teachers


def _teachers_back(teachers: dict[str, str], cfg: Any) -> dict[str, Any]:
    if not teachers:
        return {}
    if cfg.distillation.teacher_model_path:
        raise NoVerlForm("verl has no default teacher beside teachers keyed by data_source")
    out: dict[str, Any] = {}
    for i, (source, path) in enumerate(sorted(teachers.items()), start=1):
        out |= {
            f"{D}.teacher_models.teacher_{i}.key": source,
            f"{D}.teacher_models.teacher_{i}.model_path": path,
        }
    return out


TRANSLATIONS: list[Translation] = [
    _t("distillation.enabled", f"{D}.enabled"),
    _t(
        "distillation.teacher_model_path",
        f"{TEACHER}.model_path",
        compute=_one_teacher,
        how="the one teacher; null → empty; with several teachers: empty (no default teacher)",
        back=none_if_empty(f"{TEACHER}.model_path"),
    ),
    Translation(
        "distillation.teachers",
        (),
        _teachers,
        "several teachers: {teacher_models.<name>.key: teacher_models.<name>.model_path}; one teacher: {}",
        subtrees=(f"{D}.teacher_models",),
        back=_teachers_back,
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
        (
            f"{D}.n_gpus_per_node",
            f"{D}.nnodes",
            f"{D}.teacher_models.*.num_replicas",
            f"{D}.teacher_models.*.inference.*",
            f"{D}.teacher_models.*._target_",
        ),
        "the teacher's resource pool and inference engine: here it scores with the reference's forward "
        "at the rollout temperature, in the policy's process (in-process) or in one process of its own "
        "on Ray (distillation.cpus / distillation.gpus)",
    ),
    NoEffect(
        (f"{TEACHER}.key",),
        "the one teacher's key: every row goes to it (with several teachers verl drops teacher_model)",
    ),
]

REFUSED: list[Refused] = [
    Refused(
        (f"{DL}.policy_loss_mode",),
        "verl 0.9.1 accepts only vanilla here, as ours (PPO clip)",
        "the default",
    ),
    Refused(
        (f"{D}.teacher_key",),
        "rows choose their teacher by data_source here",
        "the default (data_source)",
    ),
]
