"""Tool-call parsers: hermes and llama3_json on good, bad and random text; they never raise."""

import random
import string

import pytest

from stratarl.agent.tool_parsers import PARSERS, ToolCall, get_parser, parse_hermes, parse_llama3_json


def test_hermes_finds_every_call_and_reports_bad_ones():
    text = (
        'I will compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
        '<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}\n</tool_call>'
        "<tool_call>{oops}</tool_call><tool_call>[1, 2]</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "f", "arguments": 3}</tool_call>'
    )
    result = parse_hermes(text)
    assert result.calls == [ToolCall("calculator", {"expression": "2*3"}), ToolCall("search", {"query": "x"})]
    assert len(result.errors) == 4 and result.is_failure
    assert "not valid JSON" in result.errors[0] and "JSON object" in result.errors[1]
    assert "name" in result.errors[2] and "arguments of 'f'" in result.errors[3]
    assert result.content == "I will compute. "


def test_hermes_plain_text_and_unclosed_tag():
    assert parse_hermes("Answer: 4") == parse_hermes("Answer: 4")
    assert parse_hermes("Answer: 4").calls == [] and not parse_hermes("Answer: 4").is_failure
    assert parse_hermes('<tool_call>{"name": "a"').errors == ["unclosed <tool_call> tag"]


def test_llama3_json():
    text = '<|python_tag|>{"name": "a", "parameters": {"s": "x;y}"}}; {"name": "b", "arguments": {}}'
    assert parse_llama3_json(text).calls == [ToolCall("a", {"s": "x;y}"}), ToolCall("b", {})]
    assert parse_llama3_json("The answer is 4.").calls == []
    assert parse_llama3_json("The answer is 4.").content == "The answer is 4."
    assert parse_llama3_json('{"name": 1}').errors == ["a tool call needs a non-empty string 'name'"]
    assert parse_llama3_json('{"name": "a", "parameters": [1]}').is_failure


def test_registry():
    assert set(PARSERS) == {"hermes", "llama3_json"}
    with pytest.raises(ValueError, match="hermes"):
        get_parser("mistral")


FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    ";",
    ":",
    ",",
    '"name"',
    '"arguments"',
    '"parameters"',
    "null",
    "1e999",
    "-",
    "\n",
    "\x00",
    "é",
    "🙂",
]


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_random_garbage_never_raises(name):
    parse = PARSERS[name]
    rng = random.Random(0)
    alphabet = [*FRAGMENTS, *string.printable]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        result = parse(text)
        assert all(isinstance(c.name, str) and isinstance(c.arguments, dict) for c in result.calls)


def test_hypothesis_fuzz_never_raises():
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=30).map("".join)

    @hypothesis.settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @hypothesis.given(texts)
    def check(text):
        for parse in PARSERS.values():
            result = parse(text)
            assert all(isinstance(c.arguments, dict) for c in result.calls)
            assert all(isinstance(e, str) for e in result.errors)

    check()
