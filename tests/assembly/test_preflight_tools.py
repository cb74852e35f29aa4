"""Five kinds of broken tool config are refused before the model loads, as one ConfigError naming
agent.tool_config_path, the file and the tool (was: raw tracebacks, the last naming ToolCallHandler)."""

import sys
import textwrap

import pytest

from stratarl.apps.quickstart import RECIPE
from stratarl.assembly import preflight
from stratarl.config import ConfigError, load_config

SCHEMA = "tool_schema: {type: function, function: {name: broken, description: d, parameters: {type: object}}}"
TOOL_MODULE = """
import threading
from stratarl.agent.tools.calculator import CalculatorTool

class RaisingTool(CalculatorTool):
    def __init__(self, config, tool_schema):
        raise RuntimeError("needs an API key")

class UnpicklableTool(CalculatorTool):
    def __init__(self, config, tool_schema):
        super().__init__(config, tool_schema)
        self.lock = threading.Lock()
"""


@pytest.fixture
def tool_module(tmp_path, monkeypatch):
    (tmp_path / "my_tools.py").write_text(TOOL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_tools", None)


def refusal(tmp_path, text, *extra):
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent(text))
    cfg = load_config(RECIPE, [f"agent.tool_config_path={path}", *extra])
    with pytest.raises(ConfigError) as info:
        preflight.tools(cfg)
    message = " ".join(str(info.value).split())
    assert "agent.tool_config_path" in message and str(path) in message
    assert "ToolCallHandler" not in message
    return message


@pytest.mark.parametrize(
    ("class_name", "expected"),
    [
        ("stratarl.agent.tools.calculator.NoSuchTool",
         "tools[0]: module 'stratarl.agent.tools.calculator' has no class 'NoSuchTool'"),
        ("no_such_package.tools.Tool", "tools[0]: cannot import module 'no_such_package.tools'"),
        ("my_tools.RaisingTool",
         "tools[0]: building my_tools.RaisingTool raised RuntimeError: needs an API key"),
        ("my_tools.UnpicklableTool", "tool 'broken' (my_tools.UnpicklableTool) cannot be sent to the tool "
         "worker processes"),
    ],
)  # fmt: skip
def test_a_tool_that_cannot_be_built_or_sent_is_refused_naming_the_file_and_the_tool(
    tmp_path, tool_module, class_name, expected
):
    message = refusal(tmp_path, f"tools:\n  - class_name: {class_name}\n    {SCHEMA}\n")
    assert expected in message


def test_a_tool_config_that_is_not_yaml_is_refused_naming_the_file(tmp_path):
    assert "cannot read" in refusal(tmp_path, "tools: [class_name: x\n")


def test_an_unpicklable_tool_runs_in_process(tmp_path, tool_module):
    path = tmp_path / "tools.yaml"
    path.write_text(f"tools:\n  - class_name: my_tools.UnpicklableTool\n    {SCHEMA}\n")
    cfg = load_config(RECIPE, [f"agent.tool_config_path={path}", "agent.tools_in_process=true"])
    assert list(preflight.tools(cfg)) == ["broken"]
