"""The tool-use arithmetic task: rows, splits, SFT demonstrations and their agreement with the scorer."""

import pytest
import yaml

from stratarl.agent.tools.calculator import evaluate_expression
from stratarl.agent.tools.registry import load_tools
from stratarl.data.schema import check_row, read_rows
from stratarl.data.tasks.tool_arithmetic import chatml_continuation, draw_problems, main, make_tool_dataset
from stratarl.reward.tool_arithmetic import compute_score


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return make_tool_dataset(
        tmp_path_factory.mktemp("tool"), n_train=50, n_test=10, digits=(3, 4), tool_fraction=0.4, seed=1
    )


def test_rows_follow_the_verl_schema_and_splits_are_disjoint(paths):
    train, test = read_rows(paths["train"]), read_rows(paths["test"])
    assert (len(train), len(test)) == (50, 10)
    for row in train + test:
        checked = check_row(row)
        a, b = checked.extra_info["expression"].split("*")
        assert 100 <= int(a) <= 9999 and 100 <= int(b) <= 9999
        assert checked.ground_truth == str(int(a) * int(b))
        assert row["agent_name"] == "tool_agent" and checked.data_source == "tool_arithmetic"
        assert [m["role"] for m in checked.messages] == ["system", "user"]
    expressions = lambda rows: {r["extra_info"]["expression"] for r in rows}  # noqa: E731
    assert not expressions(train) & expressions(test)
    assert sum(r["extra_info"]["uses_tool"] for r in train) == 20  # 40% of 50
    assert all(r["extra_info"]["uses_tool"] for r in test)


def test_demonstrations_are_correct_and_earn_full_reward(paths):
    for row in read_rows(paths["train"]):
        info, truth = row["extra_info"], row["reward_model"]["ground_truth"]
        messages = info["answer_messages"]
        assert info["answer"] == chatml_continuation(messages)
        if info["uses_tool"]:
            assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
            assert messages[1]["content"] == truth  # what the calculator returns for the demonstrated call
            assert str(evaluate_expression(info["expression"])) == truth
        else:
            assert [m["role"] for m in messages] == ["assistant"]
        action_text = "".join(m["content"] for m in messages if m["role"] == "assistant")
        assert compute_score("tool_arithmetic", action_text, truth)["score"] == 1.0


def test_tools_yaml_builds_the_calculator(paths):
    tools = load_tools(paths["tools"])
    assert list(tools) == ["calculator"]
    assert (
        yaml.safe_load(paths["tools"].read_text())["tools"][0]["tool_schema"]["function"]["name"]
        == "calculator"
    )


def test_deterministic_and_validated(tmp_path):
    assert draw_problems(5, digits=(3, 3), seed=0) == draw_problems(5, digits=(3, 3), seed=0)
    with pytest.raises(ValueError):
        draw_problems(5, digits=(0, 3), seed=0)
    with pytest.raises(ValueError):
        make_tool_dataset(tmp_path, n_train=2, n_test=1, tool_fraction=1.5)
    assert main(["--out", str(tmp_path / "cli"), "--n-train", "4", "--n-test", "2", "--digits", "3"]) == 0
    assert len(read_rows(tmp_path / "cli" / "train.parquet")) == 4


def test_without_instruction_the_prompt_is_the_question(tmp_path):
    paths = make_tool_dataset(tmp_path, n_train=3, n_test=1, with_instruction=False)
    row = read_rows(paths["train"])[0]
    assert [m["role"] for m in row["prompt"]] == ["user"]
    assert row["prompt"][0]["content"] == f"What is {row['extra_info']['expression']}?"
