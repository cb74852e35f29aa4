"""Tools and interactions that block, swallow cancellation, exit or crash: each call ends at its deadline
as an error and a counted failure, the episode and the run go on — in worker processes and in threads."""

import time

import pytest

from stratarl.agent.isolation import ProcessToolRunner, ThreadToolRunner
from stratarl.agent.metrics import agent_metrics
from stratarl.agent.runner import AgentLoopRunner
from stratarl.agent.tool_loop import LoopLimits
from stratarl.rollout.interface import SamplingParams
from tests.agent.conftest import prompt_row
from tests.agent.hostile_tools import (
    BlockingTool,
    CancelSwallowingTool,
    EchoTool,
    ExitingTool,
    HostileInteraction,
)
from tests.agent.scripted_engine import ScriptedEngine

SAMPLING = SamplingParams(temperature=1.0, max_tokens=128)
LIMITS = LoopLimits(response_budget=300, tool_timeout_s=2.0, interaction_timeout_s=1.0, max_parallel_calls=2)


def tool_call(name: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"text": "hi"}}}}</tool_call>'


def tools() -> dict:
    return {
        "blocking": BlockingTool({"seconds": 8}),
        "stubborn": CancelSwallowingTool(),
        "exiting": ExitingTool(),
        "hard_exit": ExitingTool({"hard": True}, {"type": "function", "function": {"name": "hard_exit"}}),
        "echo": EchoTool(),
    }


def run_episodes(renderer, tokenizer, tool_runner):
    names = ["blocking", "stubborn", "exiting", "hard_exit"]
    replies = {str(i): [tool_call(name) + tool_call("echo"), "Answer: 1"] for i, name in enumerate(names)}
    rows = [prompt_row(renderer, "q", request_id=str(i), data_source="hostile") for i in range(len(names))]
    runner = AgentLoopRunner(
        ScriptedEngine(tokenizer, replies), renderer, LIMITS, tools=tools(), tool_runner=tool_runner
    )
    started = time.monotonic()
    trajectories = runner.run_sync(rows, SAMPLING)
    return trajectories, time.monotonic() - started


def test_hostile_tools_in_worker_processes_fail_at_the_deadline(renderer, tokenizer):
    runner = ProcessToolRunner(tools(), num_workers=4, timeout_s=2.0, max_output_bytes=1024)
    try:
        trajectories, elapsed = run_episodes(renderer, tokenizer, runner)
        # one round of tools: the two hung calls ran concurrently, each cut at 2 s (not 8 s, not forever)
        assert elapsed < 6.0
        failures = [t.tool_calls[0].failure for t in trajectories]
        assert failures == ["timeout", "timeout", "SystemExit", "process_exit"]
        assert trajectories[0].tool_calls[0].error == "timed out after 2 s"
        assert [t.tool_calls[1].result for t in trajectories] == ["hi"] * 4  # the good call beside it
        assert all(t.stop_reason == "eos" for t in trajectories)  # every episode finished its turns
        metrics = agent_metrics(trajectories)
        assert metrics["agent/failures/tool_timeout"] == 2.0
        assert metrics["agent/failures/hostile/tool_SystemExit"] == 1.0
        assert metrics["agent/failures/tool_process_exit"] == 1.0 and metrics["agent/failures/total"] == 4.0
        assert "SystemExit" in trajectories[2].record()["failures"][0]
        assert runner.pool.restarts >= 3  # the hung and the exited workers were replaced
    finally:
        runner.close()


def test_hostile_tools_in_threads_fail_at_the_deadline_but_for_os_exit(renderer, tokenizer):
    all_tools = tools()
    del all_tools["hard_exit"]  # os._exit in a thread would end this process: that is what workers are for
    names = ["blocking", "stubborn", "exiting"]
    replies = {str(i): [tool_call(name), "Answer: 1"] for i, name in enumerate(names)}
    rows = [prompt_row(renderer, "q", request_id=str(i)) for i in range(3)]
    from tests.agent.scripted_engine import ScriptedEngine as Engine

    runner = AgentLoopRunner(
        Engine(tokenizer, replies),
        renderer,
        LIMITS,
        tools=all_tools,
        tool_runner=ThreadToolRunner(timeout_s=2.0),
    )
    started = time.monotonic()
    trajectories = runner.run_sync(rows, SAMPLING)
    assert time.monotonic() - started < 5.0
    assert [t.tool_calls[0].failure for t in trajectories] == ["timeout", "timeout", "SystemExit"]
    assert trajectories[2].tool_calls[0].error == "exit code 3"


@pytest.mark.parametrize(
    ("mode", "reason"), [("block", "timeout"), ("raise", "error"), ("exit", "SystemExit")]
)
def test_a_hostile_interaction_ends_its_episode_not_the_run(renderer, tokenizer, mode, reason):
    interaction = HostileInteraction({"mode": mode}, name="hostile")
    kwargs = {"interaction_kwargs": {"name": "hostile"}}
    rows = [prompt_row(renderer, "q", request_id="0", extra_info=kwargs)]
    engine = ScriptedEngine(tokenizer, {"0": ["Answer: 6"]})
    runner = AgentLoopRunner(engine, renderer, LIMITS, interactions={"hostile": interaction})
    started = time.monotonic()
    (t,) = runner.run_sync(rows, SAMPLING)
    assert time.monotonic() - started < 3.0
    assert t.stop_reason == "interaction_error" and t.failures == [f"interaction_{reason}"]
    assert agent_metrics([t])[f"agent/failures/interaction_{reason}"] == 1.0
