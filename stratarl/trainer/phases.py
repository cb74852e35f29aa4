"""Layer 2, control flow: one function per phase of a step (docs/design.md#one-step).

Each phase reads named fields of the batch, checks them against their contracts, computes, and
returns the batch with the fields it writes (checked too). Workers are reached through the
`PolicyHandle` / `CriticHandle` (`cluster/handles.py`); the math comes from `algo/`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from stratarl.algo.advantages import get_advantage_estimator
from stratarl.algo.groups import group_ids_from_uids
from stratarl.algo.kl_control import apply_kl_penalty
from stratarl.cluster.handles import (
    DEFAULT_TEACHER,
    CriticCompute,
    CriticHandle,
    PolicyCompute,
    PolicyHandle,
    ScoreRequest,
    UpdateRequest,
)
from stratarl.observe.trace_fields import weight_version_spans
from stratarl.reward.batch_scorer import RewardResult
from stratarl.reward.manager import RewardInputs, RewardManager, as_reward_manager
from stratarl.reward.score_call import finite_float
from stratarl.reward.token_scores import place_on_last_token
from stratarl.rollout.interface import SamplingParams
from stratarl.transport.data_proto import DataProto
from stratarl.transport.field_checks import validate
from stratarl.transport.fields import FIELDS

# Estimator argument names (the math layer's vocabulary) that differ from the batch's field names.
ESTIMATOR_ARGUMENT_FIELDS = {"old_log_prob": "old_log_probs"}

# The reward manager's per-source columns (reward.manager), shown in each trajectory record.
REWARD_SOURCE_COLUMNS = ("rule_score", "rm_score", "remote_score", "overlong_reward")

ROLLOUT_FIELDS = ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask")


def expand_prompts(prompts: DataProto, n: int, uid_prefix: int | str) -> DataProto:
    """B prompts -> N = B·n sessions: `uid` shared by a prompt's n samples, `sample_index` 0..n-1."""
    uids = np.array([f"{uid_prefix}-{i}" for i in range(len(prompts))], dtype=object)
    with_uid = prompts.union(DataProto.from_dict(non_tensors={"uid": uids}))
    expanded = with_uid.repeat(n, interleave=True)
    sample_index = torch.arange(len(expanded), dtype=torch.int64) % n
    batch = expanded.union(DataProto.from_dict({"sample_index": sample_index}))
    validate(batch, writes=["uid", "sample_index"], phase="expand")
    return batch


def generate(worker: PolicyHandle, batch: DataProto, sampling: SamplingParams, seed: int | None) -> DataProto:
    """Rollout: one response per session, token-in/token-out, with the weight version that made it."""
    generated = worker.generate(batch, sampling, seed=seed)
    batch = batch.union(generated)
    validate(batch, writes=[*ROLLOUT_FIELDS, "rollout_log_probs", "weight_version"], phase="rollout")
    return batch


def decode_responses(tokenizer: Any, batch: DataProto) -> list[str]:
    """The text of each response's action tokens (special tokens such as EOS dropped)."""
    mask = batch["response_mask"].bool()
    return [
        tokenizer.decode(ids[row_mask].tolist(), skip_special_tokens=True)
        for ids, row_mask in zip(batch["responses"], mask, strict=True)
    ]


def reward(
    batch: DataProto, tokenizer: Any, rewards: RewardManager | Callable[..., Any]
) -> tuple[DataProto, RewardResult, list[str]]:
    """Score each response with the run's reward sources (`RewardManager`; a plain scorer function is
    called in this process); the score sits on its last action token (`token_level_scores`), each
    sample's failure reason (or "") in `reward_failure`."""
    validate(batch, reads=["responses", "response_mask", "data_source"], phase="reward")
    texts = decode_responses(tokenizer, batch)
    result = as_reward_manager(rewards).score(reward_inputs(batch, texts))
    scores = place_on_last_token(result.scores, batch["response_mask"])  # [N, T]
    batch = with_reward_columns(batch.union(DataProto.from_dict({"token_level_scores": scores})), result)
    validate(batch, writes=["token_level_scores"], phase="reward")
    return batch, result, texts


def reward_unless_scored(
    batch: DataProto, tokenizer: Any, rewards: RewardManager
) -> tuple[DataProto, RewardResult | None]:
    """The reward phase, unless the rollout scored its rows already (agent.streaming_reward: the
    episodes were scored while generating); (batch, the reward's result or None)."""
    if "token_level_scores" in batch:
        return batch, None
    batch, result, _ = reward(batch, tokenizer, rewards)
    return batch, result


def reward_inputs(batch: DataProto, texts: Sequence[str]) -> RewardInputs:
    """What the reward sources read for N rows: rule inputs, the conversation (the prompt's messages,
    then the response as the assistant's), and each response's length in tokens (observations too)."""
    response_width = batch["responses"].shape[1]  # T
    prompts = batch["raw_prompt"] if "raw_prompt" in batch else [[] for _ in texts]
    return RewardInputs(
        data_sources=[str(s) for s in batch["data_source"]],
        texts=list(texts),
        ground_truths=list(batch["ground_truth"]),
        extra_infos=list(batch["extra_info"]),
        conversations=[
            [*map(dict, prompt), {"role": "assistant", "content": text}]
            for prompt, text in zip(prompts, texts, strict=True)
        ],
        response_lengths=batch["attention_mask"][:, -response_width:].sum(-1),
    )


def with_reward_columns(batch: DataProto, result: RewardResult) -> DataProto:
    """`batch` with the scorers' numeric extras and `reward_failure` (each row's reason, "" if none)."""
    reasons = np.array(
        [reason or "" for reason in result.sample_failures or [None] * len(batch)], dtype=object
    )
    columns = reward_extra_columns(result, batch)
    return batch.union(DataProto.from_dict(columns or None, non_tensors={"reward_failure": reasons}))


def reward_extra_columns(result: RewardResult, batch: DataProto) -> dict[str, torch.Tensor]:
    """The scorer's numeric extra keys (e.g. `acc`) as [N] float columns, for dynamic sampling's metric
    and GDPO's components. A row the scorer failed on has no extras: it reads 0 there. A key that
    would shadow an existing column, or whose values are not all finite numbers, is skipped."""
    columns = {}
    for key, values in result.extra.items():
        numbers = [finite_float(v) for v in values if v is not None]
        if key in batch or not numbers or None in numbers:
            continue
        columns[key] = torch.tensor([0.0 if v is None else float(v) for v in values], dtype=torch.float32)
    return columns


def old_log_prob(worker: PolicyCompute, batch: DataProto, *, with_sum_pi_squared: bool = False) -> DataProto:
    """log π_old of every response token under the weights that are about to be updated (and Σ_v π²,
    for the optimal-token-baseline estimators, from the same forward)."""
    validate(
        batch, reads=["input_ids", "attention_mask", "position_ids", "responses"], phase="actor.log_prob"
    )
    request = ScoreRequest(with_entropy=True, with_sum_pi_squared=with_sum_pi_squared)
    batch = batch.union(worker.compute_log_prob(batch, request))
    writes = ["old_log_probs", "entropys", *(["sum_pi_squared"] if with_sum_pi_squared else [])]
    validate(batch, writes=writes, phase="actor.log_prob")
    return batch


def ref_log_prob(worker: PolicyHandle, batch: DataProto) -> DataProto:
    """log π_ref of every response token under the frozen reference policy."""
    batch = batch.union(worker.compute_ref_log_prob(batch))
    validate(batch, writes=["ref_log_prob"], phase="reference.log_prob")
    return batch


def teacher_log_prob(
    worker: PolicyHandle, batch: DataProto, teacher_sources: frozenset[str] = frozenset()
) -> tuple[DataProto, dict[str, float]]:
    """log π_teacher of every response token under the frozen distillation teacher of its row — the
    teacher of its data_source where `teacher_sources` has one, else the default teacher — and its
    mean over the response tokens (`distillation/teacher_log_prob_mean`)."""
    groups = teacher_groups(batch["data_source"] if teacher_sources else None, teacher_sources, len(batch))
    if len(groups) == 1:
        (name,) = groups
        scored = worker.compute_teacher_log_prob(batch, name)
    else:  # each teacher scores its rows; the rows go back in the batch's order
        parts = {
            name: worker.compute_teacher_log_prob(batch.take(rows), name) for name, rows in groups.items()
        }
        order = torch.as_tensor([i for rows in groups.values() for i in rows]).argsort()
        scored = DataProto.concat(list(parts.values())).take(order)
    batch = batch.union(scored)
    validate(batch, writes=list(scored.columns), phase="teacher.log_prob")
    mask = batch["response_mask"].bool()
    mean = batch["teacher_log_prob"][mask].mean().item() if mask.any() else 0.0
    return batch, {"distillation/teacher_log_prob_mean": mean}


def teacher_groups(data_sources, teacher_sources: frozenset[str], rows: int) -> dict[str, list[int]]:
    """Teacher name -> the rows it scores: a data source's own teacher (named by the data source),
    or DEFAULT_TEACHER for the rest (every row when `data_sources` is None)."""
    if data_sources is None:
        return {DEFAULT_TEACHER: list(range(rows))}
    groups: dict[str, list[int]] = {}
    for i, source in enumerate(data_sources):
        groups.setdefault(source if source in teacher_sources else DEFAULT_TEACHER, []).append(i)
    return groups


def values(critic: CriticHandle, batch: DataProto) -> DataProto:
    """V(s_t) of every response token under the critic, before its update (`values`)."""
    validate(batch, reads=["input_ids", "attention_mask", "position_ids", "responses"], phase="critic.value")
    batch = batch.union(critic.compute_values(batch))
    validate(batch, writes=["values"], phase="critic.value")
    return batch


def advantage(
    batch: DataProto,
    *,
    estimator: str,
    hyperparameters: dict[str, Any],
    kl_in_reward: tuple[float, str] | None = None,
    component_keys: Sequence[str] = (),
) -> tuple[DataProto, dict[str, float]]:
    """token_level_rewards (scores, minus β·KL when KL is in the reward), then advantages/returns."""
    validate(batch, reads=["token_level_scores", "response_mask", "uid"], phase="advantage")
    metrics: dict[str, float] = {}
    rewards = batch["token_level_scores"]
    if kl_in_reward is not None:
        beta, kind = kl_in_reward
        rewards, kl_metrics = apply_kl_penalty(
            rewards, batch["old_log_probs"], batch["ref_log_prob"], batch["response_mask"], beta, kind
        )
        metrics |= {f"actor/{name}": float(value) for name, value in kl_metrics.items()}
    entry = get_advantage_estimator(estimator)
    fields = {"token_level_rewards": rewards, "group": group_ids_from_uids(batch["uid"])}
    if "component_scores" in entry.inputs:  # GDPO: the reward components the scorer returned
        keys = list(component_keys) or []
        fields["component_scores"] = {k: batch[k] for k in keys} if keys else [rewards.sum(-1)]
    for name in (entry.inputs | entry.optional_inputs) - fields.keys():
        column = ESTIMATOR_ARGUMENT_FIELDS.get(name, name)
        if column in batch:
            fields[name] = batch[column]
    advantages, returns = entry(fields, **entry.accepted(hyperparameters))
    mask = batch["response_mask"].to(advantages.dtype)
    batch = batch.union(
        DataProto.from_dict(
            {"token_level_rewards": rewards, "advantages": advantages * mask, "returns": returns * mask}
        )
    )
    validate(batch, writes=["token_level_rewards", "advantages", "returns"], phase="advantage")
    return batch, metrics


def update_actor(
    worker: PolicyCompute,
    batch: DataProto,
    loss_fn: Any,
    *,
    mini_batch_size: int,
    epochs: int,
    seed: int | None,
) -> dict[str, float]:
    """The policy update; returns `actor/*` metrics. A loss that takes π_old from its own forward
    (`trainer.pi_old.FromUpdate`) reads no `old_log_probs` and needs the forward's entropy too."""
    from_forward = loss_fn.old_log_prob_from_forward
    reads = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]
    reads += [] if from_forward else ["old_log_probs"]
    validate(batch, reads=[*reads, "advantages"], phase="actor.update")
    entropy = loss_fn.needs_entropy or from_forward
    request = UpdateRequest(
        mini_batch_size, epochs, shuffle_seed=seed, with_entropy=entropy, score_at_ids=loss_fn.scores_at_ids
    )
    metrics = worker.update_actor(batch, loss_fn, request)
    # Engine metrics (grad_norm, lr) get verl's `actor/` prefix; the loss's own metrics are already
    # named (`actor/pg_loss`, `rollout_corr/...`).
    return {name if "/" in name else f"actor/{name}": value for name, value in metrics.items()}


def update_critic(
    critic: CriticCompute,
    batch: DataProto,
    loss_fn: Any,
    *,
    mini_batch_size: int,
    epochs: int,
    seed: int | None,
) -> dict[str, float]:
    """The value-model update on the step's returns; returns `critic/*` metrics (verl's names)."""
    reads = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]
    validate(batch, reads=[*reads, "values", "returns"], phase="critic.update")
    metrics = critic.update_critic(batch, loss_fn, UpdateRequest(mini_batch_size, epochs, shuffle_seed=seed))
    return {name if "/" in name else f"critic/{name}": value for name, value in metrics.items()}


def sync_weights(worker: PolicyHandle, version: int | None = None) -> dict[str, float]:
    """Actor -> rollout engine as `version` (default: the served version + 1); the engine reports
    what it loaded (`weights_shared` 1: it serves the actor's own model, nothing was copied)."""
    report = worker.sync_weights(version)
    return {
        "rollout/weight_version": float(report.version),
        "rollout/weight_sync_bytes": float(report.num_bytes),
        "rollout/weights_shared": float(report.shared),
    }


def trajectory_records(
    batch: DataProto, texts: Sequence[str], prompt_texts: Sequence[str], step: int
) -> list[dict[str, Any]]:
    """One JSON record per trajectory: where it came from, what it said, what it earned (the trace's
    questions 1-4, 7, 8 in short, docs/design.md), with the ground truth it was scored against and
    the scorer's extra values (e.g. `acc`)."""
    scores = batch["token_level_scores"].sum(-1)
    mask = batch["response_mask"].bool()
    advantages = [
        float(row[m][0]) if m.any() else 0.0 for row, m in zip(batch["advantages"], mask, strict=True)
    ]
    extras = scorer_extra_columns(batch)
    spans = weight_version_spans(batch)
    return [
        {
            "step": step,
            "source_split": batch["source_split"][i],
            "source_row": int(batch["source_row"][i]),
            "data_source": batch["data_source"][i],
            "uid": batch["uid"][i],
            "sample_index": int(batch["sample_index"][i]),
            "prompt": prompt_texts[i],
            "ground_truth": batch["ground_truth"][i],
            "response": texts[i],
            "response_tokens": int(mask[i].sum()),
            "finish_reason": batch["finish_reason"][i],
            "reward": float(scores[i]),
            "reward_extra": {name: float(column[i]) for name, column in extras.items()},
            # where it came from (the trace's question 7): each source's weighted part, the penalty
            "reward_sources": {k: float(batch[k][i]) for k in REWARD_SOURCE_COLUMNS if k in batch},
            "reward_failure": batch["reward_failure"][i] if "reward_failure" in batch else "",
            "advantage": advantages[i],
            "weight_version": int(batch["weight_version"][i]),
            "weight_version_spans": spans[i],  # [[first response index, version], ...]
        }
        for i in range(len(batch))
    ]


def scorer_extra_columns(batch: DataProto) -> dict[str, torch.Tensor]:
    """The [N] float columns `reward_extra_columns` added (the scorer's extra keys, e.g. `acc`):
    those no field contract declares."""
    return {
        name: batch[name]
        for name in batch.tensor_keys
        if name not in FIELDS and batch[name].dim() == 1 and batch[name].is_floating_point()
    }
