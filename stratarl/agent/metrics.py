"""Layer 5, agent loops: metrics of a batch of episodes — turns, tool calls, errors, stop reasons.

verl's names where verl has one (`num_turns/{mean,max,min}`, `tool_call_counts/{mean,max,min}`),
`agent/*` for the rest. `agent/tool_call_success_rate` is the fraction of executed calls that
returned without an error (0 calls: not reported). `agent/failures/<reason>` counts the tool and
interaction calls that timed out, exited or crashed (`tool_timeout`, `tool_SystemExit`,
`tool_process_exit`, `interaction_timeout`, ...), also per data source
(`agent/failures/<data_source>/<reason>`), with `agent/failures/total`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from stratarl.agent.trajectory import Trajectory


def _summary(name: str, values: Sequence[float]) -> dict[str, float]:
    return {f"{name}/mean": sum(values) / len(values), f"{name}/max": max(values), f"{name}/min": min(values)}


def agent_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    if not trajectories:
        return {}
    n = len(trajectories)
    calls = [t.tool_calls for t in trajectories]
    num_calls = sum(len(c) for c in calls)
    num_errors = sum(call.is_error for c in calls for call in c)
    out = {
        **_summary("num_turns", [float(t.num_turns) for t in trajectories]),
        **_summary("tool_call_counts", [float(len(c)) for c in calls]),
        "agent/tool_calls/total": float(num_calls),
        "agent/tool_errors/total": float(num_errors),
        "agent/parse_failures/total": float(sum(t.num_parse_failures for t in trajectories)),
        "agent/used_tool/fraction": sum(bool(c) for c in calls) / n,
        "agent/observation_tokens/mean": sum(
            len(t.response_mask) - sum(t.response_mask) for t in trajectories
        )
        / n,
    }
    if num_calls:
        out["agent/tool_call_success_rate"] = (num_calls - num_errors) / num_calls
    out |= failure_metrics(trajectories)
    for reason, count in sorted(Counter(str(t.stop_reason) for t in trajectories).items()):
        out[f"agent/stop_reason/{reason}"] = count / n
    return out


def failure_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """`agent/failures/<reason>`, `agent/failures/<data_source>/<reason>` and `agent/failures/total`."""
    by_reason: Counter[str] = Counter()
    by_source: Counter[tuple[str, str]] = Counter()
    for t in trajectories:
        source = str(t.sample.get("data_source", ""))
        for reason in t.failures:
            by_reason[reason] += 1
            by_source[(source, reason)] += 1
    out = {f"agent/failures/{reason}": float(count) for reason, count in sorted(by_reason.items())}
    out |= {f"agent/failures/{s}/{r}": float(c) for (s, r), c in sorted(by_source.items())}
    out["agent/failures/total"] = float(sum(by_reason.values()))
    return out
