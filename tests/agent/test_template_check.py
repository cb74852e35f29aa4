"""Our token stream against the chat template's rendering of the same conversation."""

import copy
import json

import pytest

from stratarl.agent.rendering import ChatRenderer, TemplateError, encode
from stratarl.agent.runner import AgentLoopRunner
from stratarl.agent.template_check import compare_with_template
from stratarl.agent.tool_loop import LoopLimits
from stratarl.agent.tools.calculator import CalculatorTool
from stratarl.rollout.interface import SamplingParams
from tests.agent.conftest import prompt_row
from tests.agent.scripted_engine import ScriptedEngine


def calc(expression):
    body = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>{body}</tool_call>"


def three_call_episode(renderer, tokenizer):
    replies = {"0": [calc("123*456"), calc("56088-88"), calc("56000/7"), "Answer: 8000"]}
    runner = AgentLoopRunner(
        ScriptedEngine(tokenizer, replies),
        renderer,
        LoopLimits(response_budget=400),
        {"calculator": CalculatorTool()},
    )
    return runner.run_sync([prompt_row(renderer, "What is 123*456?")], SamplingParams(max_tokens=100))[0]


def test_prefix_preserving_template_agrees_token_for_token(renderer, tokenizer):
    t = three_call_episode(renderer, tokenizer)
    assert len(t.tool_calls) == 3 and t.stop_reason == "eos"
    report = compare_with_template(tokenizer, t)
    assert report.agrees, report.context
    assert report.first_mismatch is None
    assert report.suffix == encode(tokenizer, "\n")  # ChatML's newline after the last <|im_end|>


def test_a_template_that_rewrites_history_is_reported(renderer, tokenizer):
    t = three_call_episode(renderer, tokenizer)
    # like reasoning templates that drop earlier assistant content: only the last assistant turn is kept
    rewriting = copy.deepcopy(tokenizer)
    rewriting.chat_template = tokenizer.chat_template.replace(
        "message['content']",
        "(message['content'] if message['role'] != 'assistant' or loop.last else '')",
    )
    report = compare_with_template(rewriting, t)
    assert not report.agrees
    first_response_token = len(t.prompt_ids)
    assert report.first_mismatch == first_response_token
    assert "ours" in report.context and "template" in report.context


def test_renderer_refuses_a_template_that_is_not_prefix_preserving(tokenizer):
    counting = copy.deepcopy(tokenizer)
    counting.chat_template = "{{ messages | length }}" + tokenizer.chat_template
    with pytest.raises(TemplateError, match="prefix-preserving"):
        ChatRenderer(counting).observation_ids([{"role": "tool", "content": "1"}])


def test_bridge_and_observation_text(renderer):
    assert renderer.bridge_text == "\n" and renderer.closes_with_eos
    text = renderer.observation_text([{"role": "tool", "content": "7"}, {"role": "tool", "content": "8"}])
    assert text == "\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>tool\n8<|im_end|>\n<|im_start|>assistant\n"


def test_prompt_ids_pass_tool_schemas_to_the_template(tokenizer):
    from stratarl.agent.tools.calculator import SCHEMA

    with_tools = copy.deepcopy(tokenizer)
    with_tools.chat_template = (
        "{% if tools %}tools: {{ tools[0].function.name }}\n{% endif %}" + tokenizer.chat_template
    )
    messages = [{"role": "user", "content": "What is 2*3?"}]
    plain = ChatRenderer(with_tools).prompt_ids(messages)
    ids = ChatRenderer(with_tools).prompt_ids(messages, tools=[SCHEMA])
    assert (
        ids[-len(plain) :] == plain
        and tokenizer.decode(ids[: len(ids) - len(plain)]) == "tools: calculator\n"
    )
