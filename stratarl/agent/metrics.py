"""Layer 5, agent loops: metrics of a batch of episodes — turns, tool calls, errors, stop reasons.

verl's names where verl has one (`num_turns/{mean,max,min}`, `tool_call_counts/{mean,max,min}`),
`agent/*` for the rest. `agent/tool_call_success_rate` is the fraction of executed calls that
returned without an error (0 calls: not reported).
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
    for reason, count in sorted(Counter(str(t.stop_reason) for t in trajectories).items()):
        out[f"agent/stop_reason/{reason}"] = count / n
    return out
