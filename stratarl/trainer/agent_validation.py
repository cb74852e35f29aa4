"""Layer 2, control flow: validation of agent runs — held-out episodes with tools, scored, summarised.

The episodes run and are scored by `stratarl.agent.evaluation.run_and_score`. Metric names are
those of `validation.run_validation` (`val-core/<data_source>/acc/mean@n`, ...), plus the agent
metrics of all episodes under `val-aux/` (`val-aux/num_turns/mean`, `val-aux/agent/tool_errors/total`,
...) and the tool-call success rate, `val-core/agent/tool_call_success_rate`: the share of
ATTEMPTED tool calls that ran without error, a malformed call (a parse failure) counting as a
failed attempt. (`agent/tool_call_success_rate` of `agent_metrics` counts executed calls only, so
a model whose calls do not even parse would score 100 % there.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stratarl.agent.evaluation import run_and_score
from stratarl.agent.metrics import agent_metrics
from stratarl.agent.scoring import solution_text
from stratarl.agent.trajectory import Trajectory
from stratarl.cluster.handles import PolicyHandle
from stratarl.data.prompt_dataset import PromptDataset
from stratarl.rollout.interface import SamplingParams
from stratarl.trainer.agent_rollout import RECORD_FIELDS, AgentRollout, episode_rows
from stratarl.trainer.validation import ValidationTally, validation_batches, validation_record

TOOL_SUCCESS_KEY = "val-core/agent/tool_call_success_rate"


def tool_call_success_rate(trajectories: Sequence[Trajectory]) -> float | None:
    """Calls that ran without error / (executed calls + malformed calls); None when nothing was tried."""
    calls = [call for t in trajectories for call in t.tool_calls]
    attempts = len(calls) + sum(t.num_parse_failures for t in trajectories)
    return sum(not call.is_error for call in calls) / attempts if attempts else None


def run_agent_validation(
    agent: AgentRollout,
    worker: PolicyHandle,
    dataset: PromptDataset,
    *,
    tokenizer: Any,
    compute_score: Callable[..., Any],
    sampling: SamplingParams,
    n: int,
    step: int,
    seed: int,
    prompts_per_batch: int = 256,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(metrics, one record per episode) over the whole validation set; as `run_validation`."""
    runner, tally = agent.runner(worker), ValidationTally()
    episodes: list[Trajectory] = []
    records: list[dict[str, Any]] = []
    for start, batch in validation_batches(
        dataset, tokenizer, n=n, step=step, prompts_per_batch=prompts_per_batch
    ):
        trajectories, result, _ = run_and_score(
            runner,
            episode_rows(batch),
            sampling,
            tokenizer,
            compute_score=compute_score,
            seed=seed + start * n,
        )
        scores, accs = tally.add(batch, result, start)
        episodes += trajectories
        for i, t in enumerate(trajectories):
            response = solution_text(tokenizer, t, include_observations=True)
            record = validation_record(
                batch, i, tokenizer, step=step, response=response, reward=scores[i], acc=accs[i]
            )
            episode = t.record()
            records.append(record | {k: episode[k] for k in RECORD_FIELDS})
    metrics = tally.metrics(n)
    metrics |= {f"val-aux/{name}": value for name, value in agent_metrics(episodes).items()}
    success = tool_call_success_rate(episodes)
    if success is not None:
        metrics[TOOL_SUCCESS_KEY] = success
    return metrics, records
