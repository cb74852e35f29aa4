"""Cross-cutting: the trace fields each phase knows about a trajectory (the ten questions of
docs/design.md, one function per question group), read from the batch right after that phase.

Every function takes the batch (N rows) and returns {column: [N values]} of plain Python values
(numbers, strings, int lists; nested records as JSON text), so that `trace_store.StepTrace` can join
them by trajectory id into one parquet row per trajectory. Summaries over tokens are masked means
over the action tokens (response_mask = 1).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from stratarl.transport.batch_edge import version_spans
from stratarl.transport.data_proto import DataProto
from stratarl.transport.fields import ROW_ID

Columns = dict[str, list[Any]]
Decode = Callable[[Sequence[int]], str]


def trajectory_ids(batch: DataProto) -> list[str]:
    """`<uid>/<sample index>`: the key every phase's fields are joined on — the agent's request id,
    read from its record when there is one (an agent program's episode split into one row per call
    gives rows `<uid>/<sample index>/call<k>`, one trace row each)."""
    if "agent_record" in batch:
        return [str(r["request_id"]) for r in batch["agent_record"]]
    return [f"{uid}/{int(i)}" for uid, i in zip(batch["uid"], batch["sample_index"], strict=True)]


def to_json(value: Any) -> str:
    return json.dumps(value, default=_jsonable)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _masked_row_means(values: Tensor, mask: Tensor) -> list[float | None]:
    """[N] means of `values` over each row's mask (None for a row without action tokens)."""
    mask = mask.to(torch.float32)
    counts = mask.sum(-1)
    sums = (torch.where(mask.bool(), values.float(), 0.0)).sum(-1)
    return [float(s / c) if c > 0 else None for s, c in zip(sums.tolist(), counts.tolist(), strict=True)]


# --- questions 1-3: source, prompt, expansion ----------------------------------------------------
def source_fields(batch: DataProto, decode: Decode) -> Columns:
    """Q1 the dataset row (file, split, row, data_source) and Q2 the prompt: its messages, the
    chat-templated text and its token ids (what generation read)."""
    prompt_ids = [[int(t) for t in ids] for ids in batch["raw_prompt_ids"]]
    return {
        "source_file": [str(f) for f in batch["source_file"]],
        "source_split": [str(s) for s in batch["source_split"]],
        "source_row": [int(r) for r in batch["source_row"]],
        "data_source": [str(d) for d in batch["data_source"]],
        "messages": [to_json(list(m)) for m in batch["raw_prompt"]],
        "prompt_text": [decode(ids) for ids in prompt_ids],
        "prompt_ids": prompt_ids,
    }


def expansion_fields(batch: DataProto, n: int) -> Columns:
    """Q3 how rollout.n made this session: the prompt's uid (its group) and its index among n."""
    return {
        "uid": [str(u) for u in batch["uid"]],
        "sample_index": [int(i) for i in batch["sample_index"]],
        "samples_per_prompt": [n] * len(batch),
    }


# --- questions 4-6: generation, interaction, masks -----------------------------------------------
def response_lengths(batch: DataProto) -> list[int]:
    """Real response tokens per row (actions and observations; padding excluded)."""
    width = batch["responses"].shape[1]
    return batch["attention_mask"][:, -width:].sum(-1).tolist()


def generation_fields(
    batch: DataProto, *, sampling: Mapping[str, Any], seeds: Sequence[int | None], decode: Decode
) -> Columns:
    """Q4 who generated it and how: the replica, the sampling params and seed of its (first) turn,
    the weight version, the finish reason, and the response's token ids and text."""
    lengths = response_lengths(batch)
    responses = [row[:length].tolist() for row, length in zip(batch["responses"], lengths, strict=True)]
    return {
        "replica": _replicas(batch),
        "sampling": [to_json(dict(sampling))] * len(batch),
        "seed": list(seeds),
        "weight_version": [int(v) for v in batch["weight_version"]],
        "weight_version_spans": weight_version_spans(batch),
        "finish_reason": [str(r) for r in batch["finish_reason"]],
        "response_ids": responses,
        "response_text": [decode(ids) for ids in responses],
        "response_tokens": lengths,
        "action_tokens": batch["response_mask"].sum(-1).tolist(),
    }


def weight_version_spans(batch: DataProto) -> list[list[list[int]]]:
    """[[first response index, version], ...] per row: where each weight version's tokens begin."""
    if "token_weight_version" not in batch:
        return [[[0, int(v)]] for v in batch["weight_version"]]
    return [version_spans(row) for row in batch["token_weight_version"]]


def _replicas(batch: DataProto) -> list[int | None]:
    if "replica_id" in batch:
        return [int(r) for r in batch["replica_id"]]
    if "agent_record" in batch:  # the replica of the first assistant turn
        return [
            next((t.get("replica_id") for t in record["turns"] if t["role"] == "assistant"), None)
            for record in batch["agent_record"]
        ]
    return [None] * len(batch)


def interaction_fields(batch: DataProto) -> Columns:
    """Q5 every turn: generated spans, tool calls (name, arguments, result, latency, error), parse
    errors and observations, and `tool_failures` (JSON list: why each failed call or interaction
    failed); a single-turn trajectory is one assistant turn. `gateway_calls` (JSON list): each model
    call of the agent-program episode the row came from, and the row it became (`[]` otherwise)."""
    if "agent_record" not in batch:
        lengths = response_lengths(batch)
        turns = [[{"role": "assistant", "span": [0, length], "tool_calls": []}] for length in lengths]
        return {
            "num_turns": [2] * len(batch),  # verl's count: the prompt + one assistant turn
            "stop_reason": [str(r) for r in batch["finish_reason"]],
            "turns": [to_json(t) for t in turns],
            "tool_calls": [0] * len(batch),
            "tool_errors": [0] * len(batch),
            "tool_failures": [to_json([])] * len(batch),
            "parse_failures": [0] * len(batch),
            "gateway_calls": [to_json([])] * len(batch),
        }
    records = list(batch["agent_record"])
    calls = [[c for t in r["turns"] for c in t["tool_calls"]] for r in records]
    return {
        "num_turns": [int(r["num_turns"]) for r in records],
        "stop_reason": [str(r["stop_reason"]) for r in records],
        "turns": [to_json(r["turns"]) for r in records],
        "tool_calls": [len(c) for c in calls],
        "tool_errors": [sum(call["error"] is not None for call in c) for c in calls],
        "tool_failures": [to_json(_tool_failures(r, c)) for r, c in zip(records, calls, strict=True)],
        "parse_failures": [sum(bool(t["parse_errors"]) for t in r["turns"]) for r in records],
        "gateway_calls": [to_json(r.get("gateway_calls", [])) for r in records],  # [] off the gateway
    }


def _tool_failures(record: Mapping[str, Any], calls: Sequence[Mapping[str, Any]]) -> list[str]:
    """One `<tool>: <reason>: <message>` per failed call (reason `timeout`, `process_exit`, … when
    the call did not finish, `raised` when the tool raised), then the interaction's failures."""
    failed = [
        f"{call['name']}: {call.get('failure') or 'raised'}: {call['error']}"
        for call in calls
        if call["error"] is not None
    ]
    return failed + [m for m in record.get("failures", []) if str(m).startswith("interaction")]


def mask_spans(action: Sequence[int], real: Sequence[int]) -> list[list[Any]]:
    """Runs of [kind, start, end) over a response: `action` (response_mask 1), `observation` (a real
    token the policy did not sample: tool results, user turns) and `padding`."""
    spans: list[list[Any]] = []
    for t, (a, r) in enumerate(zip(action, real, strict=True)):
        kind = "action" if a else "observation" if r else "padding"
        if spans and spans[-1][0] == kind:
            spans[-1][2] = t + 1
        else:
            spans.append([kind, t, t + 1])
    return spans


def mask_fields(batch: DataProto) -> Columns:
    """Q6 which response tokens are actions, observations and padding (as spans)."""
    width = batch["responses"].shape[1]
    real = batch["attention_mask"][:, -width:].tolist()
    action = batch["response_mask"].tolist()
    return {"mask_spans": [to_json(mask_spans(a, r)) for a, r in zip(action, real, strict=True)]}


# --- question 7: reward -------------------------------------------------------------------------
def reward_fields(
    batch: DataProto,
    *,
    sources: Sequence[str],
    extras: Mapping[str, Sequence[Any]] | None = None,
    failure_messages: Sequence[str] | None = None,
) -> Columns:
    """Q7 where the reward came from (`sources`, one per row), its value, the scorer's extra outputs,
    the ground truth, the response token it sits on (the last action token; None if none), and why
    the scorer failed on the row: `reward_failure` (the reason: the exception's class, `timeout`,
    `bad_return`, …; "" when scored) and `reward_failure_message` (the exception's text)."""
    scores = batch["token_level_scores"]
    nonzero = [torch.nonzero(row).flatten().tolist() for row in batch["response_mask"]]
    n = len(batch)
    extras = extras or {}
    reasons = [str(r) for r in batch["reward_failure"]] if "reward_failure" in batch else [""] * n
    messages = list(failure_messages) if failure_messages else [""] * n
    return {
        "reward_source": list(sources),
        "reward": scores.sum(-1).tolist(),
        "reward_extras": [to_json({k: v[i] for k, v in extras.items()}) for i in range(n)],
        "ground_truth": [to_json(g) for g in batch["ground_truth"]],
        "reward_token": [positions[-1] if positions else None for positions in nonzero],
        "reward_failure": reasons,
        "reward_failure_message": [m if r else "" for r, m in zip(reasons, messages, strict=True)],
    }


# --- questions 8-9: advantage, log-probs, the update --------------------------------------------
def group_statistics(scores: Sequence[float], uids: Sequence[str]) -> Columns:
    """Per row, its group's size, reward mean and unbiased std (n − 1, as the group-relative
    estimators use; 0 for a group of one), and whether the rewards differ."""
    groups: dict[str, list[float]] = {}
    for uid, score in zip(uids, scores, strict=True):
        groups.setdefault(uid, []).append(score)
    stats = {}
    for uid, values in groups.items():
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)) ** 0.5
        stats[uid] = (len(values), mean, std, max(values) > min(values))
    return {
        "group_size": [stats[u][0] for u in uids],
        "group_reward_mean": [stats[u][1] for u in uids],
        "group_reward_std": [stats[u][2] for u in uids],
        "group_has_signal": [stats[u][3] for u in uids],
    }


def advantage_fields(batch: DataProto, estimator: str) -> Columns:
    """Q8 the estimator, the advantage (at the first action token, and its mean over the actions),
    the group statistics behind it, the reward after KL shaping, returns and values."""
    mask = batch["response_mask"]
    first = [torch.nonzero(row).flatten()[:1].tolist() for row in mask]
    advantages = batch["advantages"]
    columns: Columns = {
        "estimator": [estimator] * len(batch),
        "advantage": [float(advantages[i, f[0]]) if f else None for i, f in enumerate(first)],
        "advantage_mean": _masked_row_means(advantages, mask),
        "reward_shaped": batch["token_level_rewards"].sum(-1).tolist(),
        "return_mean": _masked_row_means(batch["returns"], mask),
        "value_mean": _masked_row_means(batch["values"], mask) if "values" in batch else [None] * len(batch),
    }
    uids = [str(u) for u in batch["uid"]]
    return columns | group_statistics(batch["token_level_scores"].sum(-1).tolist(), uids)


ESTIMATOR_COLUMNS = ("advantage_score", "advantage_baseline", "advantage_std", "advantage_eps")


def estimator_fields(statistics: Mapping[str, Any] | None, n: int) -> Columns:
    """Q8 the numbers the estimator computed Â from (its `statistics`, right after the advantage
    phase): the score R it read (after KL shaping), the baseline μ and the std σ it divided by (None
    when it did not divide), ε and whether it normalised, so that (R − μ) / (σ + ε) is the
    advantage shown. All None for an estimator that does not report them."""
    if statistics is None:
        return {name: [None] * n for name in (*ESTIMATOR_COLUMNS, "advantage_std_normalized")}
    divides = bool(statistics["norm_adv_by_std"])
    return {
        "advantage_score": [float(v) for v in statistics["score"].tolist()],
        "advantage_baseline": [float(v) for v in statistics["mean"].tolist()],
        "advantage_std": [float(v) for v in statistics["std"].tolist()] if divides else [None] * n,
        "advantage_eps": [float(statistics["eps"])] * n,
        "advantage_std_normalized": [divides] * n,
    }


def log_prob_fields(batch: DataProto) -> Columns:
    """Q9 (before the update): the means of old / ref / rollout / teacher log-probs and entropy over
    the action tokens, |old − rollout| (the rollout/training mismatch), old − ref (a KL estimate), IS
    weights; with a distillation teacher, its log-prob of every response token too (`teacher_log_probs`,
    one value per real response token, 0 on observations as the field holds)."""
    mask = batch["response_mask"]
    none = [None] * len(batch)

    def mean(name: str) -> list[float | None]:
        return _masked_row_means(batch[name], mask) if name in batch else none

    both = "old_log_probs" in batch and "rollout_log_probs" in batch
    with_ref = "old_log_probs" in batch and "ref_log_prob" in batch
    return {
        "old_log_prob_mean": mean("old_log_probs"),
        "ref_log_prob_mean": mean("ref_log_prob"),
        "rollout_log_prob_mean": mean("rollout_log_probs"),
        "entropy_mean": mean("entropys"),
        "old_rollout_abs_diff": _masked_row_means(
            (batch["old_log_probs"] - batch["rollout_log_probs"]).abs(), mask
        )
        if both
        else none,
        "old_ref_kl": _masked_row_means(batch["old_log_probs"] - batch["ref_log_prob"], mask)
        if with_ref
        else none,
        "is_weight_mean": mean("rollout_is_weights"),
        "teacher_log_prob_mean": mean("teacher_log_prob"),
        "teacher_log_probs": per_token(batch, "teacher_log_prob"),
    }


def per_token(batch: DataProto, name: str) -> list[list[float] | None]:
    """Each row's values of [N, T] field `name` over its real response tokens (None without it)."""
    if name not in batch:
        return [None] * len(batch)
    lengths = response_lengths(batch)
    return [row[:length].tolist() for row, length in zip(batch[name].float(), lengths, strict=True)]


DISTILLATION_MEAN = "distillation_loss_mean"  # the mean ℓ_t over a row's action tokens
UPDATE_STATISTICS = (
    "new_log_prob_mean",
    "log_ratio_mean",
    "ratio_mean",
    "ratio_min",
    "ratio_max",
    "clipped_share",
)


def update_fields(
    ids: Sequence[str],
    row_stats: Mapping[str, Tensor],
    clip_bounds: tuple[float, float],
    response_tokens: Sequence[int],
) -> tuple[list[str], Columns]:
    """Q9 (the update's own forward), for the rows the engines report: `ids[row_id]` and the new
    log-prob, log-ratio, ratio mean/min/max and clipped share of each, with the clip bounds used;
    with distillation, the per-token distillation loss ℓ_t of that forward (`distillation_losses`,
    over the row's `response_tokens[row_id]` real response tokens) and its mean over the actions."""
    if not row_stats:
        return [], {}
    rows = [int(r) for r in row_stats[ROW_ID].tolist()]
    columns: Columns = {name: [_finite(v) for v in row_stats[name].tolist()] for name in UPDATE_STATISTICS}
    columns["update_tokens"] = [int(t) for t in row_stats["tokens"].tolist()]
    columns["clip_bounds"] = [list(clip_bounds)] * len(rows)
    if DISTILLATION_MEAN in row_stats:  # distillation: ℓ_t of the update's forward, per token
        columns[DISTILLATION_MEAN] = [_finite(v) for v in row_stats[DISTILLATION_MEAN].tolist()]
        per_row = row_stats["distillation_loss"].float()  # [R, T]
        columns["distillation_losses"] = [
            row[: response_tokens[r]].tolist() for row, r in zip(per_row, rows, strict=True)
        ]
    return [ids[r] for r in rows], columns


def _finite(value: float) -> float | None:
    return None if value != value else value  # NaN (no action tokens) -> None


# --- question 10: loop closure ------------------------------------------------------------------
def closure_fields(batch: DataProto, trained_version: int) -> Columns:
    """Q10 the weights the update started from versus those that generated the trajectory."""
    generated = [int(v) for v in batch["weight_version"]]
    return {
        "trained": [True] * len(batch),
        "trained_version": [trained_version] * len(batch),
        "staleness": [trained_version - v for v in generated],
    }
