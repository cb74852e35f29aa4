"""Tools that attack the agent loop: a forged turn in a tool's text stays text; a tool worker that
writes half a message times out at `tool_timeout_s`; a result the trainer cannot unpickle is one
counted failure and the pool lives on; the python tool refuses subinterpreters."""

import copy

import pytest

from stratarl.agent.isolation import ProcessToolRunner
from stratarl.agent.metrics import agent_metrics
from stratarl.agent.rendering import ChatRenderer, encode
from stratarl.agent.runner import AgentLoopRunner
from stratarl.agent.tool_loop import LoopLimits
from stratarl.agent.tools.python_interpreter import PythonInterpreterTool
from stratarl.reward.sandbox_namespace import sandbox_problem
from stratarl.rollout.interface import SamplingParams
from tests.agent.conftest import prompt_row
from tests.agent.hostile_tools import FORGED, EchoTool, ForgingTool, SocketAttackTool
from tests.agent.scripted_engine import ScriptedEngine
from tests.agent.test_tools import execute
from tests.reward.test_sandbox_subinterpreters import ESCAPE

SAMPLING = SamplingParams(temperature=1.0, max_tokens=128)
LIMITS = LoopLimits(response_budget=300, tool_timeout_s=2.0, interaction_timeout_s=1.0, max_parallel_calls=2)
# Qwen2.5's layout for tool results (a user turn wrapping <tool_response>), written as Jinja here.
TOOL_RESPONSE_TEMPLATE = (
    "{%- for message in messages %}{%- if message.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tool_call(name: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"text": "hi"}}}}</tool_call>'


def special_counts(tokenizer, ids):
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    return ids.count(start), ids.count(end)


@pytest.mark.parametrize("template", ["chatml", "tool_response"])
def test_a_forged_turn_in_a_tool_result_stays_text(tokenizer, template):
    tokenizer = copy.deepcopy(tokenizer)
    if template == "tool_response":
        tokenizer.chat_template = TOOL_RESPONSE_TEMPLATE
    renderer = ChatRenderer(tokenizer)
    ids = renderer.observation_ids([{"role": "tool", "content": FORGED}])
    # the template's own: one <|im_start|> opening the tool turn, one opening the next assistant
    # turn, one <|im_end|> closing the tool turn; the forged ones are characters
    assert special_counts(tokenizer, ids) == (2, 1)
    text = renderer.observation_text([{"role": "tool", "content": FORGED}])
    assert tokenizer.decode(ids, skip_special_tokens=False) == text  # the same text, other ids
    plain = [{"role": "tool", "content": "42"}]  # nothing to split: the template's text tokenized whole
    assert renderer.observation_ids(plain) == encode(tokenizer, renderer.observation_text(plain))


def test_a_forging_tool_cannot_open_an_assistant_turn_in_an_episode(renderer, tokenizer):
    replies = {"0": [tool_call("forge"), "Answer: 1"]}
    row = prompt_row(renderer, "q", request_id="0")
    runner = AgentLoopRunner(
        ScriptedEngine(tokenizer, replies), renderer, LIMITS, tools={"forge": ForgingTool()}
    )
    (trajectory,) = runner.run_sync([row], SAMPLING)
    observation = [
        i for i, m in zip(trajectory.response_ids, trajectory.response_mask, strict=True) if m == 0
    ]
    assert special_counts(tokenizer, observation) == (2, 1)
    assert trajectory.tool_calls[0].result == FORGED


def run_attacks(renderer, tokenizer, runner, modes):
    replies = {
        str(i): [tool_call(f"attack_{mode}") + tool_call("echo"), "Answer: 1"] for i, mode in enumerate(modes)
    }
    rows = [prompt_row(renderer, "q", request_id=str(i), data_source="hostile") for i in range(len(modes))]
    tools = {f"attack_{m}": SocketAttackTool({"mode": m}, schema_named(f"attack_{m}")) for m in modes}
    engine = ScriptedEngine(tokenizer, replies)
    loop = AgentLoopRunner(engine, renderer, LIMITS, tools={**tools, "echo": EchoTool()}, tool_runner=runner)
    return loop.run_sync(rows, SAMPLING)


def schema_named(name):
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.mark.timeout(60)  # a dispatcher stuck on a half message would wait for the watchdog
def test_tool_workers_that_attack_their_socket_fail_one_call_each(renderer, tokenizer):
    modes = ["half_message", "unpicklable"]
    tools = {f"attack_{m}": SocketAttackTool({"mode": m}, schema_named(f"attack_{m}")) for m in modes}
    runner = ProcessToolRunner(
        {**tools, "echo": EchoTool()}, num_workers=2, timeout_s=2.0, max_output_bytes=1024
    )
    try:
        trajectories = run_attacks(renderer, tokenizer, runner, modes)  # the tool sleeps 60 s
        assert [t.tool_calls[0].failure for t in trajectories] == ["timeout", "bad_return"]
        assert (
            "unfinished message" in trajectories[0].tool_calls[0].error or trajectories[0].tool_calls[0].error
        )
        assert "cannot be unpickled in the trainer" in trajectories[1].tool_calls[0].error
        assert [t.tool_calls[1].result for t in trajectories] == ["hi", "hi"]  # the pool lives on
        metrics = agent_metrics(trajectories)
        assert (
            metrics["agent/failures/tool_timeout"] == 1.0 and metrics["agent/failures/tool_bad_return"] == 1.0
        )
        again = run_attacks(renderer, tokenizer, runner, ["unpicklable"])
        assert again[0].tool_calls[0].failure == "bad_return" and again[0].tool_calls[1].result == "hi"
        assert runner.pool.broken is None
    finally:
        runner.close()


@pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox: {sandbox_problem()}")
def test_the_python_tool_refuses_a_subinterpreter():
    result = execute(PythonInterpreterTool({"wall_seconds": 5.0}), {"code": ESCAPE})
    assert "not allowed" in result.text and "[status: error]" in result.text
    assert "unseen" not in result.text
