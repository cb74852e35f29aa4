"""Scoring during rollout: each episode is submitted to the pool when it ends, before others finish."""

import json
import time

import pytest

from stratarl.agent.batch_edge import trajectories_to_batch
from stratarl.agent.runner import AgentLoopRunner
from stratarl.agent.scoring import StreamingScorer, solution_text
from stratarl.agent.sft_target import sft_target_ids
from stratarl.agent.tool_loop import LoopLimits
from stratarl.agent.tools.calculator import CalculatorTool
from stratarl.reward.process_pool import ScoringPool
from stratarl.rollout.interface import SamplingParams
from tests.agent.conftest import prompt_row
from tests.agent.scripted_engine import ScriptedEngine


def calc(expression):
    body = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>{body}</tool_call>"


class TimedEngine(ScriptedEngine):
    def generate(self, requests):
        self.call_times = [*getattr(self, "call_times", []), time.monotonic()]
        return super().generate(requests)


def test_finished_episodes_are_scored_while_others_generate(renderer, tokenizer):
    replies = {"quick": ["Answer: 56088"], "slow": [calc("123*456"), calc("56088*1"), "Answer: 56088"]}
    rows = [
        prompt_row(
            renderer, "What is 123*456?", request_id=r, data_source="tool_arithmetic", ground_truth="56088"
        )
        for r in ("quick", "slow")
    ]
    engine = TimedEngine(tokenizer, replies)
    runner = AgentLoopRunner(
        engine, renderer, LoopLimits(response_budget=300), {"calculator": CalculatorTool()}
    )
    with ScoringPool(num_workers=1, timeout_s=10) as pool:
        scorer = StreamingScorer(pool, tokenizer)
        trajectories = runner.run_sync(rows, SamplingParams(max_tokens=100), on_finished=scorer)
        assert scorer.submitted_at[0] < engine.call_times[1] < engine.call_times[2] < scorer.submitted_at[1]
        result = scorer.result()
    assert result.scores.tolist() == [1.0, 1.0] and result.extra["used_tool"] == [0.0, 1.0]
    assert [t.reward for t in trajectories] == [1.0, 1.0]
    batch, records = trajectories_to_batch(trajectories, pad_token_id=tokenizer.pad_token_id)
    last = [t.last_action_index for t in trajectories]
    assert batch["token_level_scores"].sum(-1).tolist() == [1.0, 1.0]
    assert [batch["token_level_scores"][i, last[i]].item() for i in range(2)] == [1.0, 1.0]
    assert records[1]["reward"] == 1.0 and records[1]["reward_on_token"] == last[1]


def test_solution_text_is_the_action_tokens(renderer, tokenizer):
    replies = {"0": [calc("2*3"), "Answer: 6"]}
    runner = AgentLoopRunner(
        ScriptedEngine(tokenizer, replies), renderer, LoopLimits(), {"calculator": CalculatorTool()}
    )
    (t,) = runner.run_sync([prompt_row(renderer, "q")], SamplingParams(max_tokens=100))
    assert solution_text(tokenizer, t) == calc("2*3") + "Answer: 6"
    assert (
        solution_text(tokenizer, t, include_observations=True)
        == calc("2*3") + "\ntool\n6\nassistant\nAnswer: 6"
    )


def test_sft_target_has_the_rollout_layout(renderer, tokenizer):
    messages = [
        {"role": "assistant", "content": calc("2*3")},
        {"role": "tool", "content": "6"},
        {"role": "assistant", "content": "Answer: 6"},
    ]
    ids, mask = sft_target_ids(renderer, messages)
    replies = {"0": [calc("2*3"), "Answer: 6"]}
    runner = AgentLoopRunner(
        ScriptedEngine(tokenizer, replies), renderer, LoopLimits(), {"calculator": CalculatorTool()}
    )
    (t,) = runner.run_sync([prompt_row(renderer, "q")], SamplingParams(max_tokens=100))
    assert (ids, mask) == (t.response_ids, t.response_mask)
    with pytest.raises(ValueError, match="assistant"):
        sft_target_ids(renderer, messages[1:])


def test_run_and_score_in_process_and_in_a_pool(renderer, tokenizer):
    from stratarl.agent.evaluation import run_and_score

    replies = {"a": [calc("123*456"), "Answer: 56088"], "b": ["Answer: 5"]}
    rows = [
        prompt_row(renderer, "q", request_id=r, data_source="tool_arithmetic", ground_truth="56088")
        for r in ("a", "b")
    ]
    for pool in (None, ScoringPool(num_workers=1, timeout_s=10)):
        runner = AgentLoopRunner(
            ScriptedEngine(tokenizer, replies), renderer, LoopLimits(), {"calculator": CalculatorTool()}
        )
        trajectories, result, metrics = run_and_score(
            runner, rows, SamplingParams(max_tokens=100), tokenizer, pool=pool
        )
        if pool is not None:
            pool.close()
        assert [t.reward for t in trajectories] == [1.0, 0.0] and result.scores.tolist() == [1.0, 0.0]
        assert metrics["val/score/mean"] == 0.5 and metrics["reward/used_tool/mean"] == 0.5
        assert (
            metrics["agent/tool_call_success_rate"] == 1.0
            and trajectories[0].reward_extras["used_tool"] == 1.0
        )
