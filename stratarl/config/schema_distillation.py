"""Layer 1, config: on-policy distillation, `distillation.*` (verl 0.9.1's `distillation:` section).

With `distillation.enabled` a frozen teacher scores every response token the student sampled
(`teacher_log_prob`), and the actor adds a distillation loss (`stratarl.algo.distillation`) to its
objective — or trains on it alone (use_task_rewards=false). `teachers` gives several teachers, one per
data_source, with `teacher_model_path` as the default one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from stratarl.algo import catalog
from stratarl.config.errors import ConfigProblem
from stratarl.config.setting import setting

D = "distillation"
DL = "distillation.distillation_loss"  # verl's prefix of the loss settings


@dataclass
class DistillationConfig:
    """The teacher and the distillation term of the actor's loss."""

    enabled: bool = setting(
        False, "distil a frozen teacher into the policy on its own samples", verl=f"{D}.enabled"
    )
    teacher_model_path: str = setting(
        "",
        "directory of the teacher model; it scores the student's token ids, so its vocabulary must be "
        "the student's (model.path). With distillation.teachers: the default teacher of the rows whose "
        "data_source has none there (empty: no default, such a row is refused at data loading)",
        verl=f"{D}.teacher_models.teacher_model.model_path",
    )
    teachers: dict[str, str] = setting(
        {},
        "several teachers keyed by data_source: {data_source value: teacher model directory}; each "
        "training row is scored by the teacher of its data_source (every vocabulary must be the "
        "student's)",
        verl=f"{D}.teacher_models.<name>.key / .model_path",
    )
    loss_mode: str = setting(
        "k3",
        "distillation loss: k1/kl, abs, k2/mse, k3/low_var_kl estimate KL(π_θ‖π_teacher) on the sampled "
        "token; forward_kl_topk is KL(π_teacher‖π_θ) on the teacher's topk tokens "
        "(docs/algorithms/distillation.md)",
        verl=f"{DL}.loss_mode",
    )
    use_policy_gradient: bool = setting(
        False,
        "true: the per-token loss is a reward −ℓ_t in a PPO-clip loss; false: backpropagated directly",
        verl=f"{DL}.use_policy_gradient",
    )
    use_task_rewards: bool = setting(
        True,
        "true: L = L_task + distillation_loss_coef · L_distill; false: L = L_distill alone",
        verl=f"{DL}.use_task_rewards",
    )
    distillation_loss_coef: float = setting(
        1.0, "weight of the distillation loss beside the task loss", verl=f"{DL}.distillation_loss_coef"
    )
    loss_max_clamp: float | None = setting(
        None,
        "per-token loss clamped to [−c, c] before aggregation; null: no clamp",
        verl=f"{DL}.loss_max_clamp",
    )
    clip_ratio_low: float = setting(
        0.2, "ε_low of the policy-gradient form's PPO clip", verl=f"{DL}.clip_ratio_low"
    )
    clip_ratio_high: float = setting(
        0.2, "ε_high of the policy-gradient form's PPO clip", verl=f"{DL}.clip_ratio_high"
    )
    topk: int = setting(
        32,
        "forward_kl_topk: tokens per response position the teacher hands over (its K most likely); the "
        "batch carries [N, T, K] ids and log-probs, N·T·K·12 bytes",
        verl=f"{DL}.topk",
    )
    log_prob_min_clamp: float | None = setting(
        None,
        "forward_kl_topk: both log-probs clamped from below at this value before the KL; null: no clamp",
        verl=f"{DL}.log_prob_min_clamp",
    )
    cpus: float = setting(
        1.0,
        "cluster.backend=ray: CPUs of the teacher's process (the placement plan's teacher pool, one bundle)",
    )
    gpus: float = setting(
        0.0, "cluster.backend=ray: GPUs of the teacher's process (its models then on that GPU)"
    )
    trajectories_per_micro_batch: int = setting(
        16,
        "trajectories per teacher forward pass when computing teacher_log_prob (its token budget, "
        "layout and logit chunking are reference.*'s)",
    )


def distillation_problems(
    d: DistillationConfig, *, model_path: str, backend: str, check_paths: bool = True
) -> list[ConfigProblem]:
    """The problems of `distillation.*` (part of `validate_config`), each naming its keys. Every
    trainer.mode and both backends are accepted: the teacher phase runs in the training half of the
    step, on the batch's tokens whatever weight version generated them (on Ray in a process of its
    own, on the plan's teacher pool)."""
    if not d.enabled:
        return []
    problems = []
    kind = catalog.DISTILLATION_LOSS_KINDS.get(d.loss_mode)  # unknown names: `registries()`
    if kind is not None and not kind[1] and not d.use_policy_gradient:
        message = (
            f"loss_mode={d.loss_mode!r} backpropagated directly does not depend on the teacher "
            "(∇k1 = ∇log π_θ); set use_policy_gradient=true or use 'k3'"
        )
        problems.append(ConfigProblem((f"{D}.loss_mode", f"{D}.use_policy_gradient"), message))
    ranges = [
        (d.distillation_loss_coef < 0, "distillation_loss_coef", "must be ≥ 0"),
        (d.loss_max_clamp is not None and d.loss_max_clamp <= 0, "loss_max_clamp", "must be null or > 0"),
        (not 0 <= d.clip_ratio_low < 1, "clip_ratio_low", "must be in [0, 1)"),
        (d.clip_ratio_high < 0, "clip_ratio_high", "must be ≥ 0"),
        (d.trajectories_per_micro_batch < 1, "trajectories_per_micro_batch", "must be ≥ 1"),
        (d.topk < 1, "topk", "must be ≥ 1"),
    ]
    problems += [ConfigProblem((f"{D}.{key}",), message) for bad, key, message in ranges if bad]
    if d.cpus <= 0 and d.gpus <= 0 and backend == "ray":
        problems.append(
            ConfigProblem((f"{D}.cpus", f"{D}.gpus"), "the teacher's process needs some CPU or GPU")
        )
    if not d.teacher_model_path and not d.teachers:
        message = "distillation needs a teacher model directory (or distillation.teachers by data_source)"
        problems.append(ConfigProblem((f"{D}.teacher_model_path",), message))
    problems += [
        ConfigProblem((f"{D}.teachers.{source}",), "needs a teacher model directory")
        for source, path in d.teachers.items()
        if not path
    ]
    if check_paths:
        for key, path in teacher_paths(d).items():
            problems += _vocabulary_problems(key, path, model_path)
        problems += _top_k_problems(d, model_path)
    return problems


def teacher_paths(d: DistillationConfig) -> dict[str, str]:
    """Each teacher's config key -> its model directory (the default teacher's key is
    distillation.teacher_model_path)."""
    paths = {f"{D}.teachers.{source}": path for source, path in d.teachers.items() if path}
    return paths | ({f"{D}.teacher_model_path": d.teacher_model_path} if d.teacher_model_path else {})


def _top_k_problems(d: DistillationConfig, student: str) -> list[ConfigProblem]:
    """A top-k loss keeps K ≤ V tokens per position."""
    kind = catalog.DISTILLATION_LOSS_KINDS.get(d.loss_mode)
    vocab = _vocab_size(student)
    if kind is None or not kind[0] or vocab is None or d.topk <= vocab:
        return []
    message = f"topk={d.topk} exceeds the vocabulary of model.path={student} ({vocab} tokens)"
    return [ConfigProblem((f"{D}.topk", "model.path"), message)]


def _vocabulary_problems(key: str, teacher: str, student: str) -> list[ConfigProblem]:
    """The teacher scores the student's token ids: both config.json must give the same vocab_size.
    (Missing directories and files are reported by the model-directory checks.)"""
    sizes = [_vocab_size(path) for path in (teacher, student)]
    if None in sizes or sizes[0] == sizes[1]:
        return []
    message = (
        f"the teacher {teacher} has a vocabulary of {sizes[0]} tokens, the student model.path={student} "
        f"{sizes[1]}; the teacher scores the student's token ids, so both need the same tokenizer"
    )
    return [ConfigProblem((key, "model.path"), message)]


def _vocab_size(path: str) -> int | None:
    config = Path(path) / "config.json"
    try:
        return json.loads(config.read_text()).get("vocab_size")
    except (OSError, ValueError):
        return None
