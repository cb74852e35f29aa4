"""Trace fields a user reads when something failed: why each tool call or interaction of an episode
failed, and why the scorer failed on a row, in the row and in its answers."""

import json

import numpy as np
import torch

from stratarl.agent.trajectory import ToolCallRecord, Trajectory, Turn
from stratarl.observe import trace_fields
from stratarl.observe.trace_answers import ten_answers
from stratarl.transport.data_proto import DataProto


def _episode(calls, failures=()):
    trajectory = Trajectory(request_id="1.0-0/0", prompt_ids=[1, 2], messages=[])
    trajectory.turns = [Turn("assistant", 0, 3, "call", tool_calls=list(calls)), Turn("tool", 3, 5, "obs")]
    trajectory.failure_messages = list(failures)
    return trajectory.record()


def test_each_failed_tool_call_and_interaction_is_named_with_its_reason():
    records = [
        _episode(
            [
                ToolCallRecord("calculator", {"expr": "1/0"}, error="ZeroDivisionError: division by zero"),
                ToolCallRecord("search", {"q": "x"}, error="no answer within 5 s", failure="timeout"),
                ToolCallRecord("calculator", {"expr": "1+1"}, result="2"),
            ],
            failures=["tool search: timeout: no answer within 5 s", "interaction 2: SystemExit: exit code 3"],
        ),
        _episode([ToolCallRecord("calculator", {"expr": "2+2"}, result="4")]),
    ]
    batch = DataProto.from_dict(non_tensors={"agent_record": np.array(records, dtype=object)})
    columns = trace_fields.interaction_fields(batch)
    assert columns["tool_errors"] == [2, 0]
    assert [json.loads(f) for f in columns["tool_failures"]] == [
        [
            "calculator: raised: ZeroDivisionError: division by zero",
            "search: timeout: no answer within 5 s",
            "interaction 2: SystemExit: exit code 3",
        ],
        [],
    ]
    row = {name: values[0] for name, values in columns.items()}
    lines = ten_answers(row)[4].lines
    assert ("failure", "search: timeout: no answer within 5 s") in lines
    assert ("failure", "interaction 2: SystemExit: exit code 3") in lines


def test_the_scorer_failure_reason_and_message_are_in_the_row():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    batch = DataProto.from_dict(
        {"token_level_scores": torch.zeros(2, 3), "response_mask": mask},
        non_tensors={
            "ground_truth": np.array(["3", "4"], dtype=object),
            "reward_failure": np.array(["timeout", ""], dtype=object),
        },
    )
    columns = trace_fields.reward_fields(
        batch, sources=["rule", "rule"], failure_messages=["no answer within the batch's 30 s", ""]
    )
    assert columns["reward_failure"] == ["timeout", ""]
    assert columns["reward_failure_message"] == ["no answer within the batch's 30 s", ""]
    failed, scored = ({name: values[i] for name, values in columns.items()} for i in range(2))
    assert dict(ten_answers(failed)[6].lines)["scorer failed"] == "timeout: no answer within the batch's 30 s"
    assert "scorer failed" not in dict(ten_answers(scored)[6].lines)


def test_an_estimator_without_statistics_leaves_them_empty_and_the_view_shows_no_formula():
    columns = trace_fields.estimator_fields(None, 2)
    assert set(columns) == {*trace_fields.ESTIMATOR_COLUMNS, "advantage_std_normalized"}
    assert all(values == [None, None] for values in columns.values())
    row = {"estimator": "rloo", "advantage": 0.5, **{name: values[0] for name, values in columns.items()}}
    assert "computed as" not in dict(ten_answers(row)[7].lines)


def test_without_the_std_division_the_view_shows_the_difference_only():
    statistics = {
        "score": torch.tensor([1.0, 0.0]),
        "mean": torch.tensor([0.5, 0.5]),
        "std": torch.tensor([0.7071, 0.7071]),
        "eps": 1e-6,
        "norm_adv_by_std": False,
    }
    columns = trace_fields.estimator_fields(statistics, 2)
    assert columns["advantage_std"] == [None, None] and columns["advantage_std_normalized"] == [False, False]
    row = {"estimator": "grpo", "advantage": 0.5, **{name: values[0] for name, values in columns.items()}}
    assert dict(ten_answers(row)[7].lines)["computed as"] == "R − μ = 1 − 0.5 = 0.5 (not divided by the std)"
