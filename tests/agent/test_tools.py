"""Tools: calculator, sandboxed python, BM25 search, truncation, and the YAML registry."""

import asyncio
import math

import pytest
import yaml

from stratarl.agent.tools.base import Tool, check_schema, truncate_text
from stratarl.agent.tools.calculator import CalculatorTool, evaluate_expression, format_number
from stratarl.agent.tools.python_interpreter import PythonInterpreterTool
from stratarl.agent.tools.registry import load_tools, tool_schemas, tools_from_config
from stratarl.agent.tools.text_search import BM25Index, TextSearchTool, read_corpus
from stratarl.data.tasks.tool_arithmetic import TOOL_CONFIG


def execute(tool: Tool, arguments: dict):
    async def once():
        instance = await tool.create()
        try:
            return await tool.execute(instance, arguments)
        finally:
            await tool.release(instance)

    return asyncio.run(once())


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("4821*937", 4821 * 937),
        ("(2+3)*-4", -20),
        ("7/2", 3.5),
        ("7//2", 3),
        ("2**10 % 1000", 24),
        ("1.5*2", 3.0),
    ],
)
def test_calculator_values(expression, value):
    assert evaluate_expression(expression) == value


@pytest.mark.parametrize(
    "expression", ["__import__('os')", "x+1", "9**9**9", "1/0", "2**2000", "", "(1,2)", "a.b"]
)
def test_calculator_refuses(expression):
    with pytest.raises(ValueError):
        evaluate_expression(expression)


def test_calculator_tool_and_number_format():
    assert execute(CalculatorTool(), {"expression": "123456789*987654321"}).text == "121932631112635269"
    assert (format_number(6.0), format_number(1 / 3), format_number(7)) == ("6", "0.333333333333", "7")
    with pytest.raises(ValueError, match="missing required argument"):
        execute(CalculatorTool(), {"expr": "1"})


def test_truncation_sides():
    text = "abcdefghij"
    assert truncate_text(text, 4, "head") == "abcd...(truncated)"
    assert truncate_text(text, 4, "tail") == "(truncated)...ghij"
    assert truncate_text(text, 4, "middle") == "ab...(truncated)...ij"
    assert truncate_text(text, 5, "middle") == "abc...(truncated)...ij"
    assert truncate_text(text, 10, "middle") == text
    with pytest.raises(ValueError):
        truncate_text(text, 3, "left")


def test_python_tool_runs_in_the_sandbox():
    tool = PythonInterpreterTool({"wall_seconds": 2.0})
    assert execute(tool, {"code": "print(sum(range(10)))"}).text == "45\n"
    refused = execute(tool, {"code": "print(open('/etc/passwd').read())"})
    assert "PermissionError" in refused.text and "[status: error]" in refused.text
    assert refused.metrics["status"] == "error"


def test_bm25_by_hand_and_search_tool(tmp_path):
    docs = [("a", "the cat sat"), ("b", "the dog sat on the cat"), ("c", "birds fly")]
    index = BM25Index(docs, k1=1.5, b=0.75)
    # "dog" is in 1 of 3 docs: idf = ln(1 + (3 − 1 + 0.5)/(1 + 0.5)) = ln(8/3)
    assert index.idf("dog") == pytest.approx(math.log(8 / 3))
    # doc b: f = 1, |d| = 6, avgdl = (3 + 6 + 2)/3 = 11/3:
    # score = idf · 2.5 / (1 + 1.5·(0.25 + 0.75·6/(11/3)))
    expected = math.log(8 / 3) * 2.5 / (1 + 1.5 * (0.25 + 0.75 * 6 / (11 / 3)))
    assert index.scores("dog") == pytest.approx([0.0, expected, 0.0])
    assert [doc_id for doc_id, _, _ in index.search("cat sat", 3)] == ["a", "b"]
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(
        '{"id": "p1", "text": "Paris is the capital of France"}\n{"id": "p2", "text": "Rome"}\n'
    )
    assert read_corpus(corpus)[0] == ("p1", "Paris is the capital of France")
    tool = TextSearchTool({"corpus_path": str(corpus)})
    assert execute(tool, {"query": "capital of France?"}).text == "[1] (p1) Paris is the capital of France"
    assert execute(tool, {"query": "zebra"}).text == "no results"


def test_registry_from_yaml(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(TOOL_CONFIG))
    tools = load_tools(path)
    assert list(tools) == ["calculator"] and isinstance(tools["calculator"], CalculatorTool)
    assert tool_schemas(tools)[0]["function"]["name"] == "calculator"
    bad = {
        "tools": [
            {
                "class_name": "stratarl.agent.tools.base.truncate_text",
                "tool_schema": TOOL_CONFIG["tools"][0]["tool_schema"],
            }
        ]
    }
    with pytest.raises(TypeError, match="not a stratarl Tool"):
        tools_from_config(bad)
    with pytest.raises(ValueError, match="native"):
        tools_from_config({"tools": [{**TOOL_CONFIG["tools"][0], "config": {"type": "mcp"}}]})
    with pytest.raises(ValueError, match="duplicate"):
        tools_from_config({"tools": TOOL_CONFIG["tools"] * 2})
    with pytest.raises(ValueError, match="name"):
        check_schema({"type": "function", "function": {}})
