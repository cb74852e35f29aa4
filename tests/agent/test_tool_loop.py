"""The tool loop's state machine, token for token: spans, masks, log-probs, stop reasons, tool calls."""

import asyncio
import json
import time
from typing import ClassVar

import pytest

from stratarl.agent.interactions.answer_check import AnswerCheckInteraction
from stratarl.agent.rendering import encode
from stratarl.agent.runner import AgentLoopRunner
from stratarl.agent.tool_loop import LoopLimits
from stratarl.agent.tools.base import Tool, ToolResult
from stratarl.agent.tools.calculator import CalculatorTool
from stratarl.rollout.interface import SamplingParams
from tests.agent.conftest import prompt_row
from tests.agent.scripted_engine import NoEos, ScriptedEngine

SAMPLING = SamplingParams(temperature=1.0, max_tokens=128)


def call(expression: str, name: str = "calculator") -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': {'expression': expression}})}</tool_call>"


class SleepyTool(Tool):
    """Sleeps `arguments["seconds"]` and returns "slept"; records when each call started."""

    starts: ClassVar[list[float]] = []

    def __init__(self, config=None, schema=None):
        schema = {"type": "function", "function": {"name": "sleepy", "parameters": {"type": "object"}}}
        super().__init__(config, schema)

    async def execute(self, instance_id, arguments, **context):
        SleepyTool.starts.append(time.perf_counter())
        await asyncio.sleep(float(arguments["seconds"]))
        return ToolResult("slept", reward=0.5)


def run(renderer, tokenizer, replies, limits=None, rows=None, tools=None, **kwargs):
    engine = ScriptedEngine(tokenizer, replies)
    runner = AgentLoopRunner(
        engine,
        renderer,
        limits or LoopLimits(response_budget=200),
        tools=tools or {"calculator": CalculatorTool()},
    )
    rows = rows or [prompt_row(renderer, "What is 123*456?")]
    return runner.run_sync(rows, SAMPLING, **kwargs), engine


def sampled(tokenizer, text):
    return [*encode(tokenizer, text), tokenizer.eos_token_id]


def test_two_tool_calls_then_answer_is_token_exact(renderer, tokenizer):
    replies = {"0": [call("123*456"), call("56088+1"), "Answer: 56089"]}
    (t,), engine = run(renderer, tokenizer, replies)
    a1, a2, a3 = (sampled(tokenizer, r) for r in replies["0"])
    o1 = renderer.observation_ids([{"role": "tool", "content": "56088"}])
    o2 = renderer.observation_ids([{"role": "tool", "content": "56089"}])
    assert t.response_ids == a1 + o1 + a2 + o2 + a3
    assert t.response_mask == [1] * len(a1) + [0] * len(o1) + [1] * len(a2) + [0] * len(o2) + [1] * len(a3)
    expected_lp = [
        *(-(j + 1) / 100 for j in range(len(a1))),
        *[0.0] * len(o1),
        *(-(j + 1) / 100 for j in range(len(a2))),
        *[0.0] * len(o2),
        *(-(j + 1) / 100 for j in range(len(a3))),
    ]
    assert t.response_log_probs == pytest.approx(expected_lp, abs=0)
    assert (t.stop_reason, t.num_assistant_turns, t.num_user_turns, t.num_turns) == ("eos", 3, 2, 6)
    # token-in/token-out: each turn's prompt is the prompt plus everything so far, nothing re-tokenized
    prompts = [call[0].prompt_ids for call in engine.calls]
    assert prompts == [
        tuple(t.prompt_ids),
        tuple(t.prompt_ids + a1 + o1),
        tuple(t.prompt_ids + a1 + o1 + a2 + o2),
    ]
    calls = t.tool_calls
    assert [(c.name, c.arguments, c.result, c.error) for c in calls] == [
        ("calculator", {"expression": "123*456"}, "56088", None),
        ("calculator", {"expression": "56088+1"}, "56089", None),
    ]
    assert all(c.duration_s >= 0 for c in calls)
    assert [(turn.role, turn.start, turn.end) for turn in t.turns] == [
        ("assistant", 0, len(a1)),
        ("tool", len(a1), len(a1 + o1)),
        ("assistant", len(a1 + o1), len(a1 + o1 + a2)),
        ("tool", len(a1 + o1 + a2), len(a1 + o1 + a2 + o2)),
        ("assistant", len(a1 + o1 + a2 + o2), len(t.response_ids)),
    ]
    assert t.last_action_index == len(t.response_ids) - 1


def test_turn_limits(renderer, tokenizer):
    replies = {"0": [call("1+1"), call("2+2"), "Answer: 4"]}
    (t,), _ = run(renderer, tokenizer, replies, LoopLimits(response_budget=200, max_assistant_turns=2))
    # the second turn's call is never run: the turn limit is checked first (as verl)
    assert (t.stop_reason, t.num_assistant_turns, len(t.tool_calls)) == ("max_assistant_turns", 2, 1)
    assert t.response_mask[-1] == 1
    (t,), _ = run(renderer, tokenizer, replies, LoopLimits(response_budget=200, max_user_turns=1))
    assert (t.stop_reason, t.num_assistant_turns, t.num_user_turns) == ("max_user_turns", 2, 1)


def test_response_budget_caps_turns_and_refuses_an_overflowing_observation(renderer, tokenizer):
    replies = {"0": [call("123*456"), "Answer: 56088"]}
    a1 = sampled(tokenizer, replies["0"][0])
    o1 = renderer.observation_ids([{"role": "tool", "content": "56088"}])
    # room for the call and the observation but not one more action token: stop, observation not appended
    (t,), _ = run(renderer, tokenizer, replies, LoopLimits(response_budget=len(a1) + len(o1)))
    assert (t.stop_reason, t.response_ids) == ("response_budget", a1)
    # the budget caps max_tokens of the second turn: it is cut exactly at the budget
    budget = len(a1) + len(o1) + 3
    (t,), engine = run(renderer, tokenizer, replies, LoopLimits(response_budget=budget))
    assert engine.calls[1][0].sampling.max_tokens == 3
    assert (t.stop_reason, len(t.response_ids)) == ("response_budget", budget)


def test_a_turn_without_eos_ends_the_episode(renderer, tokenizer):
    (t,), _ = run(renderer, tokenizer, {"0": [NoEos(call("1+1"))]})
    assert (t.stop_reason, t.tool_calls) == ("max_tokens", [])


def test_parse_failure_terminates_or_is_fed_back(renderer, tokenizer):
    replies = {"0": ["<tool_call>{not json</tool_call>", "Answer: 3"]}
    (t,), _ = run(renderer, tokenizer, replies)
    assert (t.stop_reason, t.num_parse_failures, t.num_assistant_turns) == ("parse_error", 1, 1)
    limits = LoopLimits(response_budget=200, on_parse_error="feedback")
    (t,), _ = run(renderer, tokenizer, replies, limits)
    assert (t.stop_reason, t.num_parse_failures, t.num_assistant_turns) == ("eos", 1, 2)
    assert t.turns[1].role == "tool" and "could not parse tool call" in t.messages[-2]["content"]


def test_unknown_tool_and_bad_arguments_become_error_observations(renderer, tokenizer):
    replies = {"0": [call("1+1", name="abacus"), call("import os"), "Answer: 2"]}
    (t,), _ = run(renderer, tokenizer, replies)
    first, second = t.tool_calls
    assert first.error.startswith("LookupError: unknown tool 'abacus'") and "calculator" in first.error
    assert second.error.startswith("ValueError") and second.result.startswith("Error when executing tool:")
    assert t.stop_reason == "eos" and t.num_user_turns == 2


def test_tool_timeout_and_concurrency(renderer, tokenizer):
    sleepy = '<tool_call>{"name": "sleepy", "arguments": {"seconds": {s}}}</tool_call>'
    two_calls = sleepy.replace("{s}", "0.3") * 2
    replies = {
        "0": [two_calls, "Answer: 1"],
        "1": [sleepy.replace("{s}", "0.3"), "Answer: 1"],
        "2": [sleepy.replace("{s}", "5"), "Answer: 1"],
    }
    rows = [prompt_row(renderer, "q", request_id=str(i)) for i in range(3)]
    limits = LoopLimits(response_budget=200, max_parallel_calls=2, tool_timeout_s=0.5)
    SleepyTool.starts = []
    started = time.perf_counter()
    trajectories, engine = run(
        renderer, tokenizer, replies, limits, rows=rows, tools={"sleepy": SleepyTool()}
    )
    elapsed = time.perf_counter() - started
    # 4 calls over 3 episodes ran concurrently: the 5 s call was cut at 0.5 s, the rest took 0.3 s each
    assert elapsed < 2.0
    assert max(SleepyTool.starts) - min(SleepyTool.starts) < 0.2
    assert [len(t.tool_calls) for t in trajectories] == [2, 1, 1]
    assert trajectories[2].tool_calls[0].error == "timed out after 0.5 s"
    assert trajectories[0].tool_rewards == [0.5, 0.5]
    # one engine call per round holds every episode that wants a turn
    assert [len(c) for c in engine.calls] == [3, 3]


def test_results_are_truncated(renderer, tokenizer):
    limits = LoopLimits(response_budget=400, max_tool_response_chars=6, truncate_side="head")
    (t,), _ = run(renderer, tokenizer, {"0": [call("10**40"), "Answer: 1"]}, limits)
    assert t.tool_calls[0].result == "100000...(truncated)"


def test_single_turn_agent_runs_no_tool(renderer, tokenizer):
    row = prompt_row(renderer, "q", agent_name="single_turn_agent")
    (t,), _ = run(renderer, tokenizer, {"0": [call("1+1")]}, rows=[row])
    assert (t.stop_reason, t.tool_calls, set(t.response_mask)) == ("eos", [], {1})


def test_interaction_replies_then_ends_with_a_score(renderer, tokenizer):
    interaction = AnswerCheckInteraction({"max_attempts": 3}, name="answer_check")
    row = prompt_row(
        renderer, "q", extra_info={"interaction_kwargs": {"name": "answer_check", "ground_truth": "7"}}
    )
    engine = ScriptedEngine(tokenizer, {"0": ["Answer: 6", "Answer: 7"]})
    runner = AgentLoopRunner(
        engine, renderer, LoopLimits(response_budget=200), interactions={"answer_check": interaction}
    )
    (t,) = runner.run_sync([row], SAMPLING)
    assert (t.stop_reason, t.turn_scores, t.num_user_turns) == ("interaction_done", [0.0, 1.0], 1)
    user = t.turns[1]
    assert user.role == "user" and set(t.response_mask[user.start : user.end]) == {0}
    assert t.turns[-1].start == t.turns[-1].end == len(t.response_ids)  # closing reply not appended
    assert interaction.instances == {}  # finalized


def test_seeds_differ_across_rows_and_turns(renderer, tokenizer):
    rows = [prompt_row(renderer, "q", request_id=str(i)) for i in range(2)]
    replies = {"0": [call("1+1"), "Answer: 2"], "1": [call("2+2"), "Answer: 4"]}
    _, engine = run(renderer, tokenizer, replies, rows=rows, seed=100)
    seeds = [r.sampling.seed for c in engine.calls for r in c]
    assert seeds == [100, 101, 102, 103]
