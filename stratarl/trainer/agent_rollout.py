"""Layer 2, control flow: the generate phase as multi-turn agent episodes (`agent.enable`).

Instead of one generation per row, `AgentRollout.generate` runs `stratarl.agent.AgentLoopRunner`
on the worker's rollout engine (generate → parse tool calls → run tools → append observations →
generate …) and lays the finished trajectories out as the same batch edge the single-turn phase
writes — `prompts`, `responses` (assistant AND observation tokens), `input_ids`, `attention_mask`,
`position_ids`, `response_mask` (1 on sampled tokens only), `rollout_log_probs` (0 under mask 0),
`weight_version`, `finish_reason` — plus `num_turns` and `agent_record`, one JSON record per row
(turns, tool calls with name/arguments/result/duration/error/failure, stop reason: questions 5
and 6 of docs/design.md#the-ten-questions-of-a-trajectory).
Tool calls run in worker processes under `agent.tool_timeout_s` (`agent.isolation`) unless
`agent.tools_in_process`. With `agent.streaming_reward` each episode's rule score is computed as it
finishes, the other reward sources are added when all are done, and `token_level_scores` is written
too (the trainer then skips its reward phase).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stratarl.agent.batch_edge import trajectories_to_batch
from stratarl.agent.interactions.base import Interaction, load_interactions
from stratarl.agent.isolation import InteractionRunner, ProcessToolRunner, ThreadToolRunner
from stratarl.agent.metrics import agent_metrics
from stratarl.agent.rendering import ChatRenderer
from stratarl.agent.runner import AGENT_LOOPS, AgentLoopRunner
from stratarl.agent.scoring import StreamingScorer, solution_text
from stratarl.agent.tool_loop import LoopLimits
from stratarl.agent.tools.base import Tool
from stratarl.agent.trajectory import Trajectory
from stratarl.assembly import preflight
from stratarl.cluster.handles import PolicyHandle
from stratarl.config import ConfigError, RunConfig
from stratarl.config.schema_agent import agent_problems
from stratarl.data.prompt_dataset import PromptDataset
from stratarl.reward.batch_scorer import RewardResult
from stratarl.reward.manager import RewardManager
from stratarl.reward.token_scores import place_on_last_token
from stratarl.rollout.interface import SamplingParams
from stratarl.trainer.phases import ROLLOUT_FIELDS, reward_inputs, with_reward_columns
from stratarl.transport.data_proto import DataProto
from stratarl.transport.field_checks import validate

# The fields of an agent record that join the trainer's per-trajectory record in trajectories.jsonl.
RECORD_FIELDS = (
    "stop_reason",
    "num_turns",
    "num_assistant_turns",
    "num_user_turns",
    "action_tokens",
    "turns",
)


@dataclass
class AgentRollout:
    """What every episode of the run shares; built once by `build_agent_rollout`."""

    renderer: ChatRenderer
    limits: LoopLimits
    tools: dict[str, Tool] = field(default_factory=dict)
    interactions: dict[str, Interaction] = field(default_factory=dict)
    default_agent: str = "tool_agent"
    streaming_reward: bool = False  # score each episode while the others still generate
    tool_runner: ProcessToolRunner | ThreadToolRunner | None = None
    interaction_runner: InteractionRunner | None = None

    def runner(self, worker: PolicyHandle) -> AgentLoopRunner:
        """A runner on the worker's rollout engine (it serves the weights of the last sync)."""
        return AgentLoopRunner(
            worker.rollout,
            self.renderer,
            self.limits,
            self.tools,
            self.interactions,
            self.default_agent,
            tool_runner=self.tool_runner,
            interaction_runner=self.interaction_runner,
        )

    def run(
        self,
        worker: PolicyHandle,
        batch: DataProto,
        sampling: SamplingParams,
        seed: int | None,
        rewards: RewardManager | None = None,
    ) -> tuple[list[Trajectory], RewardResult | None]:
        """One finished trajectory per row, and their rule scores when scored while generating."""
        rows = episode_rows(batch)
        if not (self.streaming_reward and rewards is not None and rewards.streams_rule):
            return self.runner(worker).run_sync(rows, sampling, seed=seed), None
        scorer = StreamingScorer(rewards, self.renderer.tokenizer)
        trajectories = self.runner(worker).run_sync(rows, sampling, seed=seed, on_finished=scorer)
        return trajectories, scorer.result()

    def generate(
        self,
        worker: PolicyHandle,
        batch: DataProto,
        sampling: SamplingParams,
        *,
        seed: int | None,
        rewards: RewardManager | None = None,
    ) -> tuple[DataProto, dict[str, float]]:
        """The rollout phase for N rows: (batch with the rollout fields, agent and reward metrics).
        With `streaming_reward` and `rewards`, the rows come back scored (`token_level_scores`)."""
        trajectories, scored = self.run(worker, batch, sampling, seed, rewards)
        tensors, records = trajectories_to_batch(
            trajectories,
            pad_token_id=self.renderer.tokenizer.pad_token_id,
            max_response_len=sampling.max_tokens,  # T: every batch of the run has the same width
        )
        non_tensors = {
            "finish_reason": _objects([_finish_reason(t) for t in trajectories]),
            "agent_record": _objects(records),
        }
        batch = batch.union(
            DataProto.from_dict({k: v for k, v in tensors.items() if k != "token_level_scores"}, non_tensors)
        )
        writes = [*ROLLOUT_FIELDS, "rollout_log_probs", "weight_version"]
        metrics = agent_metrics(trajectories)
        if scored is not None and rewards is not None:
            texts = [solution_text(self.renderer.tokenizer, t) for t in trajectories]
            result = rewards.combine(scored, reward_inputs(batch, texts))
            scores = place_on_last_token(result.scores, batch["response_mask"])  # [N, T]
            batch = with_reward_columns(
                batch.union(DataProto.from_dict({"token_level_scores": scores})), result
            )
            writes.append("token_level_scores")
            metrics |= result.metrics()
        validate(batch, writes=writes, phase="rollout")
        return batch, metrics

    def close(self) -> None:
        """Stop the tool workers and the interactions' loop."""
        for runner in (self.tool_runner, self.interaction_runner):
            if runner is not None:
                runner.close()


def build_agent_rollout(cfg: RunConfig, tokenizer: Any) -> AgentRollout | None:
    """The agent rollout of `cfg.agent`, or None when `agent.enable` is false (single-turn). Its tool
    calls run in `agent.tool_workers` processes (started here) unless `agent.tools_in_process`."""
    a = cfg.agent
    problems = agent_problems(a, adv_estimator=cfg.algorithm.adv_estimator)
    if problems:
        raise ConfigError(problems)
    if not a.enable:
        return None
    limits = LoopLimits(
        response_budget=cfg.rollout.max_response_tokens,
        max_assistant_turns=a.max_assistant_turns,
        max_user_turns=a.max_user_turns,
        max_parallel_calls=a.max_parallel_calls,
        tool_timeout_s=a.tool_timeout_s,
        interaction_timeout_s=a.interaction_timeout_s,
        max_tool_response_chars=a.max_tool_response_chars,
        truncate_side=a.truncate_side,
        on_parse_error=a.on_parse_error,
        tool_format=a.tool_format,
    )
    tools = preflight.tools(cfg) if a.tool_config_path else {}  # errors name the file and the tool
    if a.tools_in_process or not tools:
        tool_runner = ThreadToolRunner(timeout_s=a.tool_timeout_s)
    else:
        tool_runner = ProcessToolRunner(
            tools,
            num_workers=a.tool_workers,
            timeout_s=a.tool_timeout_s,
            max_output_bytes=a.max_tool_output_bytes,
        )
    return AgentRollout(
        renderer=ChatRenderer(tokenizer),
        limits=limits,
        tools=tools,
        interactions=load_interactions(a.interaction_config_path) if a.interaction_config_path else {},
        default_agent=a.default_agent,
        streaming_reward=a.streaming_reward,
        tool_runner=tool_runner,
        interaction_runner=InteractionRunner(timeout_s=a.interaction_timeout_s),
    )


def check_agent_names(*datasets: PromptDataset | None) -> None:
    """Raise before any worker starts when dataset rows name an agent loop that does not exist
    (`agent_name`), listing the first files and rows; rows naming none use agent.default_agent."""
    bad = [
        f"{item.source_file} row {item.source_row}: {item.agent_name!r}"
        for dataset in datasets
        if dataset is not None
        for item in dataset.items
        if item.agent_name is not None and item.agent_name not in AGENT_LOOPS
    ]
    if bad:
        valid = ", ".join(sorted(AGENT_LOOPS))
        raise ValueError(
            f"{len(bad)} dataset row(s) name an unknown agent loop (valid: {valid}): " + "; ".join(bad[:5])
        )


def episode_rows(batch: DataProto) -> list[dict[str, Any]]:
    """The runner's input rows from N expanded prompts (`uid`, `sample_index` and the columns of
    `collate_prompts`); request ids read `<uid>/<sample index>`."""
    return [
        {
            "request_id": f"{batch['uid'][i]}/{int(batch['sample_index'][i])}",
            "prompt_ids": list(batch["raw_prompt_ids"][i]),
            "messages": list(batch["raw_prompt"][i]),
            "data_source": batch["data_source"][i],
            "ground_truth": batch["ground_truth"][i],
            "extra_info": dict(batch["extra_info"][i] or {}),
            # the row's agent loop when the dataset names one (the runner falls back to default_agent)
            "agent_name": batch["agent_name"][i] if "agent_name" in batch else None,
        }
        for i in range(len(batch))
    ]


def with_agent_records(records: Sequence[dict[str, Any]], batch: DataProto) -> list[dict[str, Any]]:
    """The trainer's per-trajectory records plus each row's turns, tool calls and stop reason (agent
    runs); the records unchanged otherwise."""
    if "agent_record" not in batch:
        return list(records)
    agent = batch["agent_record"]
    return [record | {k: agent[i][k] for k in RECORD_FIELDS} for i, record in enumerate(records)]


def _finish_reason(trajectory: Trajectory) -> str:
    """The engine's finish reason of the last assistant turn ("stop" / "length")."""
    reasons = [t.finish_reason for t in trajectory.turns if t.role == "assistant" and t.finish_reason]
    return reasons[-1] if reasons else "length"


def _objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out
