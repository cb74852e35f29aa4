"""Trajectories to the trainer's batch edge: padding sides, masks, log-probs, reward on the last action."""

import json

import torch

from stratarl.agent.batch_edge import trajectories_to_batch
from stratarl.agent.metrics import agent_metrics
from stratarl.agent.runner import AgentLoopRunner
from stratarl.agent.tool_loop import LoopLimits
from stratarl.agent.tools.calculator import CalculatorTool
from stratarl.agent.trajectory import Trajectory, Turn
from stratarl.rollout.interface import SamplingParams
from tests.agent.conftest import prompt_row
from tests.agent.scripted_engine import ScriptedEngine

PAD = 3
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*12"}}</tool_call>'


def episodes(renderer, tokenizer):
    replies = {"a": [CALL, CALL, "Answer: 144"], "b": ["Answer: 5"], "c": ["<tool_call>{x</tool_call>"]}
    rows = [
        prompt_row(renderer, q, request_id=r) for q, r in (("What is 12*12?", "a"), ("2+3?", "b"), ("?", "c"))
    ]
    engine = ScriptedEngine(tokenizer, replies, weight_version=4)
    runner = AgentLoopRunner(
        engine, renderer, LoopLimits(response_budget=300), tools={"calculator": CalculatorTool()}
    )
    return runner.run_sync(rows, SamplingParams(max_tokens=100))


def test_layout_matches_a_plain_loop(renderer, tokenizer):
    trajectories = episodes(renderer, tokenizer)
    batch, records = trajectories_to_batch(trajectories, pad_token_id=PAD)
    N, P = batch["prompts"].shape
    T = batch["responses"].shape[1]
    assert N == 3
    assert max(len(t.prompt_ids) for t in trajectories) == P
    assert max(len(t.response_ids) for t in trajectories) == T
    for i, t in enumerate(trajectories):
        p, r = len(t.prompt_ids), len(t.response_ids)
        assert batch["prompts"][i].tolist() == [PAD] * (P - p) + t.prompt_ids
        assert batch["responses"][i].tolist() == t.response_ids + [PAD] * (T - r)
        assert batch["response_mask"][i].tolist() == t.response_mask + [0] * (T - r)
        attention = [0] * (P - p) + [1] * (p + r) + [0] * (T - r)
        assert batch["attention_mask"][i].tolist() == attention
        positions, seen = [], 0
        for a in attention:
            positions.append(max(seen - 1 + a, 0) if a else max(seen - 1, 0))
            seen += a
        assert batch["position_ids"][i].tolist() == positions
        expected_lp = [lp if m else 0.0 for lp, m in zip(t.response_log_probs, t.response_mask, strict=True)]
        assert batch["rollout_log_probs"][i].tolist() == torch.tensor(expected_lp + [0.0] * (T - r)).tolist()
    assert torch.equal(batch["input_ids"], torch.cat([batch["prompts"], batch["responses"]], dim=1))
    assert batch["num_turns"].tolist() == [6, 2, 2] and batch["weight_version"].tolist() == [4, 4, 4]
    assert (batch["rollout_log_probs"][batch["response_mask"] == 0] == 0).all()
    mask = batch["response_mask"].bool()  # each sampled token's version, -1 on observations and padding
    assert torch.equal(batch["token_weight_version"], torch.where(mask, 4, -1))
    assert "token_level_scores" not in batch  # not scored yet
    json.dumps(records)  # JSON-ready
    assert [r["stop_reason"] for r in records] == ["eos", "eos", "parse_error"]
    assert records[0]["turns"][0]["tool_calls"][0] == {
        "name": "calculator",
        "arguments": {"expression": "12*12"},
        "result": "144",
        "duration_s": records[0]["turns"][0]["tool_calls"][0]["duration_s"],
        "error": None,
        "failure": None,
        "reward": None,
    }


def test_reward_sits_on_the_last_action_token_not_on_a_trailing_observation():
    t = Trajectory("x", [5, 6], [])
    t.append([10, 11], sampled=True, log_probs=[-0.1, -0.2], versions=[1, 1])
    t.append([12, 13, 14], sampled=False)
    t.append([15], sampled=True, log_probs=[-0.3], versions=[2])
    t.append([16, 17], sampled=False)  # e.g. a closing user turn, masked out
    t.turns = [Turn("assistant", 0, 2, "", weight_version=1), Turn("assistant", 5, 6, "", weight_version=2)]
    t.reward = 0.75
    u = Trajectory("y", [7], [], reward=-1.0)
    u.append([20], sampled=True, log_probs=[-0.5])
    batch, _ = trajectories_to_batch([t, u], pad_token_id=PAD, max_response_len=9)
    scores = batch["token_level_scores"]
    assert scores.shape == (2, 9)
    assert scores[0].tolist() == [0, 0, 0, 0, 0, 0.75, 0, 0, 0]  # index 5 = token 15, the last action
    assert scores[1].tolist() == [-1.0] + [0.0] * 8
    # the oldest version that sampled a token: staleness is measured from it
    assert batch["weight_version"].tolist() == [1, 0]
    assert batch["token_weight_version"].tolist() == [[1, 1, -1, -1, -1, 2, -1, -1, -1], [0] + [-1] * 8]


def test_too_long_raises_naming_the_request():
    t = Trajectory("long-one", [1, 2, 3], [])
    t.append([4, 5], sampled=True, log_probs=[0.0, 0.0])
    for kwargs, what in (({"max_prompt_len": 2}, "prompt"), ({"max_response_len": 1}, "response")):
        try:
            trajectories_to_batch([t], pad_token_id=PAD, **kwargs)
        except ValueError as err:
            assert what in str(err) and "long-one" in str(err)
        else:
            raise AssertionError("expected ValueError")


def test_metrics(renderer, tokenizer):
    m = agent_metrics(episodes(renderer, tokenizer))
    assert m["num_turns/mean"] == (6 + 2 + 2) / 3 and m["num_turns/max"] == 6
    assert m["tool_call_counts/mean"] == 2 / 3 and m["agent/tool_calls/total"] == 2
    assert m["agent/tool_errors/total"] == 0 and m["agent/tool_call_success_rate"] == 1.0
    assert m["agent/parse_failures/total"] == 1
    assert m["agent/stop_reason/eos"] == 2 / 3 and m["agent/stop_reason/parse_error"] == 1 / 3
    assert m["agent/used_tool/fraction"] == 1 / 3
