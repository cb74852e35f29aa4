"""Layer 2, control flow: the generate phase (and validation) as the user's agent program
(`agent.gateway.enable`), served through the OpenAI-compatible gateway on the worker's engine.

For N rows: start a `Gateway` over `worker.rollout` (127.0.0.1, a free port, the run's key), run the
agent function once per row (`agent.gateway.max_concurrent_episodes` at a time, each under
`agent.gateway.episode_timeout_s`) in the run's agent worker processes (`AgentPool`, started once
with the run; `agent.gateway.in_process`: in this event loop instead). Episodes that returned None are
scored on their last assistant message by the run's reward. Every finished episode with at least
one call becomes one row or one row per call (`stratarl.agent.gateway.episode_rows`), carrying the
prompt row's columns (`uid` included, so a group is all rows of a prompt's episodes), the captured
ids, log-probs and versions, and `token_level_scores` (the trainer's reward phase is skipped); each
row's `agent_record` lists the episode's calls (`gateway_calls`: what became of each).
Episodes that timed out, raised or lost their worker are counted (`agent/gateway_*`) and not
trained on.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from stratarl.agent.batch_edge import trajectories_to_batch
from stratarl.agent.gateway.agent_pool import AgentPool
from stratarl.agent.gateway.agent_program import AgentProgramError, load_agent_function
from stratarl.agent.gateway.capture import EpisodeCapture
from stratarl.agent.gateway.episode_rows import episode_failures, episode_trajectories, rows_metrics
from stratarl.agent.gateway.episodes import EpisodeRunner, InProcessAgent, run_episodes
from stratarl.agent.gateway.server import Gateway, new_api_key
from stratarl.agent.metrics import agent_metrics
from stratarl.agent.rendering import ChatRenderer
from stratarl.cluster.handles import PolicyHandle
from stratarl.config import ConfigError, ConfigProblem, RunConfig
from stratarl.reward.batch_scorer import RewardResult
from stratarl.reward.manager import RewardInputs, RewardManager, as_reward_manager
from stratarl.rollout.interface import SamplingParams
from stratarl.trainer.agent_rollout import episode_rows
from stratarl.trainer.phases import ROLLOUT_FIELDS
from stratarl.trainer.validation import ValidationTally, validation_batches, validation_record
from stratarl.transport.data_proto import DataProto
from stratarl.transport.field_checks import validate


@dataclass
class GatewayRollout:
    """The agent program and how its episodes run; built once by `build_gateway_rollout`."""

    agent: EpisodeRunner  # an AgentPool, or InProcessAgent (agent.gateway.in_process)
    renderer: ChatRenderer
    tool_format: str
    max_concurrent: int
    max_prompt_tokens: int
    keep_sampled_ids: bool
    api_key: str = field(default_factory=new_api_key)  # one per run

    def run(
        self, worker: PolicyHandle, rows: Sequence[dict[str, Any]], sampling: SamplingParams, seed: int | None
    ) -> tuple[list[EpisodeCapture], dict[str, float]]:
        """Every row's episode to its end (captures in row order), and the gateway's own counts."""

        async def serve_and_run() -> tuple[list[EpisodeCapture], dict[str, float]]:
            gateway = Gateway(
                worker.rollout,
                self.renderer,
                sampling=sampling,
                seed=seed,
                api_key=self.api_key,
                max_prompt_tokens=self.max_prompt_tokens,
                tool_format=self.tool_format,
                keep_sampled_ids=self.keep_sampled_ids,
            )
            async with gateway:
                captures = await run_episodes(gateway, self.agent, rows, max_concurrent=self.max_concurrent)
                # In process: clients the agents dropped without closing close themselves when
                # collected, on this loop: collect them while it still runs (not after asyncio.run).
                gc.collect()
                await asyncio.sleep(0)
                return captures, self.counts(gateway)

        return asyncio.run(serve_and_run())

    def counts(self, gateway: Gateway) -> dict[str, float]:
        counts = {
            "agent/gateway_server_errors": float(gateway.server_errors),
            "agent/gateway_requests_dropped": float(gateway.requests_dropped),
        }
        if isinstance(self.agent, AgentPool):  # replaced workers, over the run so far
            counts["agent/gateway_worker_restarts"] = float(self.agent.restarts)
        return counts

    def generate(
        self,
        worker: PolicyHandle,
        batch: DataProto,
        sampling: SamplingParams,
        *,
        seed: int | None,
        rewards: RewardManager | None = None,
    ) -> tuple[DataProto, dict[str, float]]:
        """The rollout phase: (the rows of N episodes, scored; agent and gateway metrics)."""
        if rewards is None:
            raise ValueError("the gateway rollout needs the run's reward for episodes that return None")
        captures, counts = self.run(worker, episode_rows(batch), sampling, seed)
        scored = score_unrewarded(captures, rewards)
        kept = [(i, c) for i, c in enumerate(captures) if c.status == "done" and c.calls]
        if not kept:
            raise RuntimeError(f"no episode of {len(captures)} finished with a model call: {_why(captures)}")
        results = [episode_trajectories(c, max_response_tokens=sampling.max_tokens) for _, c in kept]
        source_rows = [i for (i, _), r in zip(kept, results, strict=True) for _ in r.trajectories]
        trajectories = [t for r in results for t in r.trajectories]
        tensors, records = trajectories_to_batch(
            trajectories,
            pad_token_id=self.renderer.tokenizer.pad_token_id,
            max_response_len=sampling.max_tokens,
        )
        for record, calls in zip(records, [r.calls for r in results for _ in r.trajectories], strict=True):
            record["gateway_calls"] = calls  # the trace's interaction answer lists them
        non_tensors = {
            "finish_reason": _objects([t.turns[-1].finish_reason or "length" for t in trajectories]),
            "agent_record": _objects(records),
            "reward_failure": _objects([""] * len(trajectories)),
        }
        rows = batch.take(source_rows).union(DataProto.from_dict(tensors, non_tensors))
        validate(
            rows,
            writes=[*ROLLOUT_FIELDS, "rollout_log_probs", "weight_version", "token_level_scores"],
            phase="rollout",
        )
        metrics = agent_metrics(trajectories) | rows_metrics(results, captures) | counts
        failures = episode_failures(captures)  # beside the tool failures, in the run summary
        metrics |= failures
        metrics["agent/failures/total"] = metrics.get("agent/failures/total", 0.0) + sum(failures.values())
        if scored is not None:
            metrics |= scored.metrics()
        return rows, metrics

    def close(self) -> None:
        """Stop the agent workers (each phase's gateway closes with its phase)."""
        if isinstance(self.agent, AgentPool):
            self.agent.close()


def score_unrewarded(captures: Sequence[EpisodeCapture], rewards: RewardManager) -> RewardResult | None:
    """Score, with the run's reward, the last assistant message of each finished episode whose agent
    returned None; the rewards are written into the captures. None when there was none to score."""
    todo = [c for c in captures if c.status == "done" and c.reward is None and c.calls]
    if not todo:
        return None
    texts = [c.final_text for c in todo]
    inputs = RewardInputs(
        data_sources=[str(c.row.get("data_source", "")) for c in todo],
        texts=texts,
        ground_truths=[c.row.get("ground_truth") for c in todo],
        extra_infos=[dict(c.row.get("extra_info") or {}, num_turns=len(c.calls)) for c in todo],
        conversations=[
            [*c.last_messages, {"role": "assistant", "content": t}] for c, t in zip(todo, texts, strict=True)
        ],
        response_lengths=torch.tensor([len(c.calls[-1].response_ids) for c in todo], dtype=torch.int64),
    )
    result = rewards.score(inputs)
    for i, (capture, score) in enumerate(zip(todo, result.scores.tolist(), strict=True)):
        capture.reward = float(score)
        capture.reward_extras = {k: v[i] for k, v in result.extra.items()}
    return result


def build_gateway_rollout(cfg: RunConfig, tokenizer: Any) -> GatewayRollout | None:
    """The gateway rollout of `cfg.agent.gateway`, or None when it is off; the agent file is loaded
    here (ConfigError naming the key when it cannot be)."""
    g = cfg.agent.gateway
    if not g.enable:
        return None
    try:
        if g.in_process:
            function = load_agent_function(g.agent_function_path, g.agent_function_name)
            agent: EpisodeRunner = InProcessAgent(function, timeout_s=g.episode_timeout_s)
        else:  # the workers load the file; the trainer never imports it
            agent = AgentPool(
                g.agent_function_path,
                g.agent_function_name,
                num_workers=g.num_workers,
                timeout_s=g.episode_timeout_s,
            )
    except AgentProgramError as err:
        key, _, message = str(err).partition(": ")
        raise ConfigError([ConfigProblem((key,), message)]) from err
    return GatewayRollout(
        agent,
        ChatRenderer(tokenizer),
        tool_format=cfg.agent.tool_format,
        max_concurrent=g.max_concurrent_episodes,
        max_prompt_tokens=g.max_prompt_tokens,
        keep_sampled_ids=g.keep_sampled_ids,
    )


def run_gateway_validation(
    gateway: GatewayRollout,
    worker: PolicyHandle,
    dataset: Any,
    *,
    tokenizer: Any,
    compute_score: Any,
    sampling: SamplingParams,
    n: int,
    step: int,
    seed: int,
    prompts_per_batch: int = 256,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Validation with the agent program: one reward per episode (a timed-out or failed episode
    scores 0 and is counted), verl's `val-core/<data_source>/...` metrics, one record per episode."""
    rewards, tally = as_reward_manager(compute_score), ValidationTally()
    records, everything = [], []
    for start, batch in validation_batches(
        dataset, tokenizer, n=n, step=step, prompts_per_batch=prompts_per_batch
    ):
        captures, _ = gateway.run(worker, episode_rows(batch), sampling, seed + start * n)
        score_unrewarded(captures, rewards)
        scores = torch.tensor(
            [c.reward if c.reward is not None else 0.0 for c in captures], dtype=torch.float32
        )
        extra = {"acc": [c.reward_extras.get("acc") for c in captures]}
        got, accs = tally.add(
            batch, RewardResult(scores, extra if any(a is not None for a in extra["acc"]) else {}), start
        )
        for i, capture in enumerate(captures):
            record = validation_record(
                batch, i, tokenizer, step=step, response=capture.final_text, reward=got[i], acc=accs[i]
            )
            records.append(
                record | {"status": capture.status, "calls": len(capture.calls), "error": capture.error}
            )
        everything += captures
    metrics = tally.metrics(n)
    rows = [episode_trajectories(c, max_response_tokens=sampling.max_tokens) for c in everything if c.calls]
    metrics |= {f"val-aux/{k}": v for k, v in rows_metrics(rows, everything).items()}
    return metrics, records


def _why(captures: Sequence[EpisodeCapture]) -> str:
    errors = [c.error for c in captures if c.error]
    counts = {s: sum(c.status == s for c in captures) for s in ("timeout", "error", "crash")}
    no_calls = sum(c.status == "done" and not c.calls for c in captures)
    first = f"; first: {errors[0]}" if errors else ""
    return (
        f"{counts['timeout']} timed out, {counts['error']} raised, {counts['crash']} lost their worker, "
        f"{no_calls} made no call{first}"
    )


def _objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out
