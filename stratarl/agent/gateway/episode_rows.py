"""Layer 5, agent gateway: an episode's recorded calls become training rows, without re-tokenizing.

The rule. Call k+1 *extends* call k when its prompt ids begin with call k's prompt + sampled ids.
- Every call extends the one before (and the whole response fits `max_response_tokens`): ONE row,
  as the tool loop writes it (`trajectory.Trajectory`): the first call's prompt, then each call's
  sampled ids (response_mask 1, their log-probs and versions) with the tokens between them — what
  the next prompt added after the previous response: tool results, user turns, template text —
  as observations (mask 0).
- Otherwise (the agent rewrote its history, the template re-tokenized a sampled turn differently,
  n > 1, a side conversation, or the merged row would exceed the budget): ONE ROW PER CALL, each
  its own prompt and sampled ids, all sharing the episode's reward.
`episode_trajectories` says which (`merged`), and why not (`split_reason`), and lists each call
(`calls`: its token counts, weight version, finish reason, the row it became and, when it did not
extend the call before, the first token where its prompt departs from it) for the trace.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from stratarl.agent.gateway.capture import CallRecord, EpisodeCapture
from stratarl.agent.trajectory import Trajectory, Turn

ROW_FIELDS_NOT_CARRIED = ("prompt_ids", "messages")


@dataclass(frozen=True)
class EpisodeRows:
    trajectories: list[Trajectory]
    merged: bool  # one row for the whole episode
    split_reason: str | None  # "not_a_prefix" or "over_budget" when one row per call; None otherwise
    calls: list[dict[str, Any]]  # one JSON-ready entry per call, in order (`call_table`)


def extends(previous: CallRecord, call: CallRecord) -> bool:
    """Does `call`'s prompt begin with `previous`'s prompt + response, id for id?"""
    sequence = previous.sequence
    return len(call.prompt_ids) >= len(sequence) and call.prompt_ids[: len(sequence)] == sequence


def episode_trajectories(capture: EpisodeCapture, *, max_response_tokens: int) -> EpisodeRows:
    """The rows of a finished episode with at least one call; each carries the episode's reward."""
    calls = capture.calls
    if not calls:
        raise ValueError(f"episode {capture.episode_id} made no model call: nothing to train on")
    chained = all(extends(a, b) for a, b in itertools.pairwise(calls))
    span = len(calls[-1].sequence) - len(calls[0].prompt_ids)  # response + observations, merged
    if chained and span <= max_response_tokens:
        rows, reason = [_merged(capture)], None
    else:
        rows = [_single(capture, k, call) for k, call in enumerate(calls)]
        reason = "not_a_prefix" if not chained else "over_budget"
    for row in rows:
        row.reward, row.reward_extras = capture.reward, dict(capture.reward_extras)
    merged = len(rows) == 1 and reason is None
    return EpisodeRows(rows, merged, reason, call_table(calls, [r.request_id for r in rows], reason))


def divergence(previous: CallRecord, call: CallRecord) -> int:
    """The first position where `call`'s prompt departs from `previous`'s prompt + response (its
    length when it is a prefix of them but shorter)."""
    sequence = previous.sequence
    return next(
        (i for i, (a, b) in enumerate(zip(sequence, call.prompt_ids, strict=False)) if a != b),
        min(len(sequence), len(call.prompt_ids)),
    )


def call_table(calls: list[CallRecord], row_ids: list[str], split_reason: str | None) -> list[dict[str, Any]]:
    """Each call of an episode as the trace lists it: index, prompt and sampled token counts, weight
    version, finish reason, the row it became (`row_ids`: one for a merged episode, else one per
    call), and whether it extends the call before; when not, `diverges_at`, the first prompt token
    that differs from the previous call's prompt + response, with the ids found there."""
    table = []
    for k, call in enumerate(calls):
        entry: dict[str, Any] = {
            "call": k,
            "prompt_tokens": len(call.prompt_ids),
            "sampled_tokens": len(call.response_ids),
            "weight_version": call.weight_version,
            "finish_reason": call.finish_reason,
            "row": row_ids[0] if len(row_ids) == 1 else row_ids[k],
            "merged": split_reason is None,
            "split_reason": split_reason,
        }
        if k:
            previous = calls[k - 1]
            entry["extends_previous"] = extends(previous, call)
            if not entry["extends_previous"]:
                at = divergence(previous, call)
                entry["diverges_at"] = at
                entry["expected_ids"] = list(previous.sequence[at : at + 4])  # what extending needed
                entry["found_ids"] = list(call.prompt_ids[at : at + 4])  # what the prompt had
        table.append(entry)
    return table


def row_id(capture: EpisodeCapture) -> str:
    """The request id of the episode's rows: its dataset row's (`<uid>/<sample index>` in training,
    what the trace joins phases on), else the episode's; a split episode's rows add `/call<k>`."""
    return str(capture.row["request_id"]) if "request_id" in capture.row else capture.episode_id


def _new(capture: EpisodeCapture, request_id: str, prompt_ids: tuple[int, ...]) -> Trajectory:
    sample = {k: v for k, v in capture.row.items() if k not in ROW_FIELDS_NOT_CARRIED}
    return Trajectory(
        request_id=request_id,
        prompt_ids=list(prompt_ids),
        messages=[dict(m) for m in capture.last_messages],
        sample=sample,
        stop_reason="agent_returned",
    )


def _append_call(trajectory: Trajectory, call: CallRecord) -> None:
    start, end = trajectory.append(
        list(call.response_ids),
        sampled=True,
        log_probs=list(call.log_probs),
        versions=list(call.token_versions),
    )
    trajectory.turns.append(
        Turn("assistant", start, end, call.text, call.finish_reason, call.weight_version, call.replica_id)
    )
    trajectory.num_assistant_turns += 1


def _merged(capture: EpisodeCapture) -> Trajectory:
    calls = capture.calls
    trajectory = _new(capture, row_id(capture), calls[0].prompt_ids)
    _append_call(trajectory, calls[0])
    for previous, call in itertools.pairwise(calls):
        observation = list(call.prompt_ids[len(previous.sequence) :])
        if observation:
            start, end = trajectory.append(observation, sampled=False)
            trajectory.turns.append(Turn("observation", start, end, ""))
            trajectory.num_user_turns += 1
        _append_call(trajectory, call)
    return trajectory


def _single(capture: EpisodeCapture, index: int, call: CallRecord) -> Trajectory:
    trajectory = _new(capture, f"{row_id(capture)}/call{index}", call.prompt_ids)
    _append_call(trajectory, call)
    return trajectory


def episode_failures(episodes: list[EpisodeCapture]) -> dict[str, float]:
    """`agent/failures/episode_<status>` for the episodes that timed out, raised or lost their
    worker (only those that occurred), as the run summary and the doctor read tool failures."""
    counts = {s: sum(e.status == s for e in episodes) for s in ("timeout", "error", "crash")}
    return {f"agent/failures/episode_{s}": float(n) for s, n in counts.items() if n}


def rows_metrics(results: list[EpisodeRows], episodes: list[EpisodeCapture]) -> dict[str, Any]:
    """`agent/gateway_*`: how episodes ended and how their calls became rows."""
    n = max(len(episodes), 1)
    status = {s: sum(e.status == s for e in episodes) for s in ("done", "timeout", "error", "crash")}
    calls = [len(e.calls) for e in episodes]
    return {
        "agent/gateway_episodes": float(len(episodes)),
        "agent/gateway_episode_timeouts": float(status["timeout"]),
        "agent/gateway_episode_errors": float(status["error"]),
        "agent/gateway_episode_crashes": float(status["crash"]),  # its agent worker process ended
        "agent/gateway_episodes_without_calls": float(sum(c == 0 for c in calls)),
        "agent/gateway_calls/mean": sum(calls) / n,
        "agent/gateway_calls/max": float(max(calls, default=0)),
        "agent/gateway_tool_calls/total": float(sum(e.num_tool_calls for e in episodes)),
        # chat prompts whose re-tokenized ids would have differed from an earlier call's sampled ones
        "agent/gateway_prompts_kept_sampled_ids": float(sum(e.prompts_kept_sampled_ids for e in episodes)),
        "agent/gateway_calls/total": float(sum(calls)),
        "agent/gateway_rows": float(sum(len(r.trajectories) for r in results)),
        "agent/gateway_rows_merged": float(sum(r.merged for r in results)),
        "agent/gateway_rows_per_call": float(sum(len(r.trajectories) for r in results if not r.merged)),
        "agent/gateway_split/not_a_prefix": float(sum(r.split_reason == "not_a_prefix" for r in results)),
        "agent/gateway_split/over_budget": float(sum(r.split_reason == "over_budget" for r in results)),
    }
