"""Cross-cutting: `stratarl trace RUN --field NAME` — one field followed through the phases (the
learning map's four questions: who creates it, its shape, its mask, who consumes it), with the
code path that produces it and its statistics at every traced step.

The contract comes from `transport.fields` (the same declarations `validate` enforces); the
shape is filled in with the run's sizes (N trajectories, P prompt tokens, T response tokens); the
statistics are the trace's per-trajectory summaries of the field (a masked mean over the action
tokens for [N, T] fields), aggregated over a step's traced trajectories.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stratarl.transport.fields import FIELDS, field_spec

# Where each phase's output is computed: trainer phase → worker method → compute.
PRODUCER_PATHS = {
    "dataloader": "data.prompt_dataset.load_prompt_dataset → data.collate.collate_prompts",
    "expand": "trainer.phases.expand_prompts (B prompts → N = B·n rows)",
    "rollout": "trainer.phases.generate → PolicyWorker.generate → rollout engine → "
    "rollout.batch_layout.results_to_batch (agent.enable: trainer.agent_rollout.AgentRollout.generate → "
    "agent.batch_edge.trajectories_to_batch)",
    "reward": "trainer.phases.reward → reward.batch_scorer.score_batch → "
    "reward.token_scores.place_on_last_token",
    "actor.log_prob": "trainer.phases.old_log_prob → PolicyWorker.compute_log_prob → "
    "engine.actor.Actor.score_responses (one on-policy step a batch: the update's own forward, "
    "trainer.pi_old)",
    "reference.log_prob": "trainer.phases.ref_log_prob → PolicyWorker.compute_ref_log_prob → "
    "engine.actor.Reference",
    "teacher.log_prob": "trainer.phases.teacher_log_prob → PolicyWorker.compute_teacher_log_prob → "
    "engine.actor.Reference (the teacher's model)",
    "critic.value": "trainer.phases.values → CriticWorker.compute_values → engine.critic",
    "advantage": "trainer.phases.advantage → algo.advantages (the configured estimator), algo.kl_control",
    "actor.update": "trainer.phases.update_actor → PolicyWorker.update_actor → "
    "engine.training.TrainingEngine.update (loss: objective.actor_loss.ActorLoss)",
    "critic.update": "trainer.phases.update_critic → CriticWorker.update_critic → "
    "engine.training.TrainingEngine.update (loss: objective.critic_loss.ValueLoss)",
    "trace": "trainer.tracing.StepTracer",
}

# field -> (trace column that summarises it per trajectory, what the summary is)
SUMMARIES = {
    "old_log_probs": ("old_log_prob_mean", "mean over action tokens"),
    "ref_log_prob": ("ref_log_prob_mean", "mean over action tokens"),
    "teacher_log_prob": ("teacher_log_prob_mean", "mean over action tokens"),
    "rollout_log_probs": ("rollout_log_prob_mean", "mean over action tokens"),
    "entropys": ("entropy_mean", "mean over action tokens"),
    "advantages": ("advantage_mean", "mean over action tokens"),
    "returns": ("return_mean", "mean over action tokens"),
    "values": ("value_mean", "mean over action tokens"),
    "rollout_is_weights": ("is_weight_mean", "mean over action tokens"),
    "token_level_scores": ("reward", "sum over the response (the reward on its last action token)"),
    "token_level_rewards": ("reward_shaped", "sum over the response"),
    "response_mask": ("action_tokens", "action tokens per trajectory"),
    "responses": ("response_tokens", "real tokens per response (actions + observations)"),
    "attention_mask": ("response_tokens", "real response tokens per trajectory"),
    "weight_version": ("weight_version", "the value"),
    "sample_index": ("sample_index", "the value"),
    "prompts": ("prompt_tokens", "prompt tokens per trajectory"),
    "input_ids": ("prompt_tokens", "prompt tokens per trajectory (the response part: see responses)"),
    "row_id": ("update_tokens", "action tokens the update's statistics cover"),
}


@dataclass(frozen=True)
class StepStatistics:
    step: int
    rows: int
    mean: float
    std: float
    low: float
    high: float
    trained_share: float


def _values(rows: Sequence[dict[str, Any]], column: str) -> list[float]:
    out = []
    for row in rows:
        value = len(row.get("prompt_ids") or []) if column == "prompt_tokens" else row.get(column)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out.append(float(value))
    return out


def step_statistics(traces: dict[int, list[dict[str, Any]]], column: str) -> list[StepStatistics]:
    """Per traced step, the statistics of `column` over the step's trajectories (steps without it skipped)."""
    stats = []
    for step, rows in sorted(traces.items()):
        values = _values(rows, column)
        if not values:
            continue
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
        trained = sum(1 for r in rows if r.get("trained")) / len(rows)
        stats.append(StepStatistics(step, len(values), mean, std, min(values), max(values), trained))
    return stats


def trace_columns_for(name: str) -> list[str]:
    """The trace columns `follow_field` reads for field `name`."""
    column = SUMMARIES.get(name, (None, ""))[0]
    return ["prompt_ids", "trained", *([] if column in (None, "prompt_tokens") else [column])]


def follow_field(
    name: str,
    traces: dict[int, list[dict[str, Any]]],
    *,
    rows_per_step: int | None,
    response_tokens: int | None,
) -> str:
    """The report `--field NAME` prints (KeyError naming the declared fields for an unknown one)."""
    spec = field_spec(name)
    sizes = _sizes(traces, rows_per_step, response_tokens)
    filled = ", ".join(sizes.get(letter, letter) for letter in spec.shape)
    shape = spec.shape_text + (f" = [{filled}]" if sizes else "")
    lines = [
        f"{spec.name}: {spec.meaning}",
        f"  producer   {spec.producer}: {PRODUCER_PATHS.get(spec.producer, spec.producer)}",
        f"  dtype      {spec.dtype}",
        f"  shape      {shape}",
        f"  mask       {_mask_text(spec.mask)}",
        f"  consumers  {', '.join(spec.consumers)}",
    ]
    for consumer in spec.consumers:
        if consumer in PRODUCER_PATHS:
            lines.append(f"             {consumer}: {PRODUCER_PATHS[consumer]}")
    column, summary = SUMMARIES.get(name, (None, ""))
    if column is None:
        lines.append("  per step   the trace keeps no per-trajectory summary of this field")
        return "\n".join(lines)
    stats = step_statistics(traces, column)
    lines.append(f"  per step   {summary} ({column}), over the step's traced trajectories:")
    lines.append(
        f"    {'step':>6} {'rows':>5} {'mean':>11} {'std':>10} {'min':>11} {'max':>11} {'trained':>8}"
    )
    for s in stats:
        numbers = f"{s.mean:>11.5g} {s.std:>10.4g} {s.low:>11.5g} {s.high:>11.5g}"
        lines.append(f"    {s.step:>6} {s.rows:>5} {numbers} {s.trained_share:>8.0%}")
    if not stats:
        lines.append(
            "    (no traced step has it: the phase that produces it did not run, or tracing was off)"
        )
    return "\n".join(lines)


def _sizes(
    traces: dict[int, list[dict[str, Any]]], rows_per_step: int | None, response_tokens: int | None
) -> dict[str, str]:
    if not traces:
        return {}
    last = traces[max(traces)]
    prompt = max((len(r.get("prompt_ids") or []) for r in last), default=0)
    sizes = {"P": str(prompt)}
    if rows_per_step is not None:
        sizes["N"] = str(rows_per_step)
    if response_tokens is not None:
        sizes["T"] = str(response_tokens)
        sizes["P+T"] = str(prompt + response_tokens)
    return sizes


def _mask_text(mask: str | None) -> str:
    if mask is None:
        return "none (every entry is meaningful)"
    if mask == "response_mask":
        return "response_mask: 1 on action tokens; observations and padding are 0 there"
    return f"{mask}: 1 on real tokens, 0 on padding"


def known_fields() -> list[str]:
    return sorted(FIELDS)
