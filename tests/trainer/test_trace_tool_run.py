"""A multi-turn tool run's trace answers the ten questions, each answer checked against the batch the
phases produced; a tool-call parser that always fails is named by the doctor."""

import json

import pytest
import torch

from stratarl.agent import tool_parsers
from stratarl.agent.tool_parsers import ParseResult
from stratarl.observe.doctor.diagnosis import diagnose
from stratarl.observe.doctor.view import load_run
from stratarl.observe.trace_answers import mask_spans, ten_answers
from stratarl.observe.trace_store import read_step
from stratarl.trainer import phases
from stratarl.trainer.rl_trainer import RLTrainer
from tests.trainer.test_agent_rollout import task, tool_config  # noqa: F401  (the SFT'd tool model)


def masked_mean(values, mask):
    return float((values * mask).sum() / mask.sum())


@pytest.fixture(scope="module")
def traced_run(task, tmp_path_factory):  # noqa: F811
    """Two GRPO steps with the calculator (two mini-batches per update); the batch each actor update
    received, as the phases produced it."""
    run_dir = tmp_path_factory.mktemp("tool_trace") / "run"
    config = tool_config(
        task, "actor.prompts_per_mini_batch=2", "actor.trajectories_per_micro_batch=8", "trainer.test_freq=0"
    )
    trainer = RLTrainer(config, run_dir)
    updates, original = [], phases.update_actor

    def spy(worker, batch, *args, **kwargs):
        updates.append((batch, worker.weight_version))
        return original(worker, batch, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(phases, "update_actor", spy)
        trainer.fit()
    return run_dir, updates, trainer


def test_the_trace_of_a_tool_trajectory_answers_the_ten_questions(traced_run):
    run_dir, updates, trainer = traced_run
    batch, trained_version = updates[-1]
    rows = read_step(run_dir, 2)
    assert len(rows) == len(batch) == 16
    row = next(r for r in rows if r["tool_calls"] > 0)  # a trajectory that called the calculator
    i = next(
        k
        for k in range(len(batch))
        if f"{batch['uid'][k]}/{int(batch['sample_index'][k])}" == row["trajectory_id"]
    )
    record, mask = batch["agent_record"][i], batch["response_mask"][i].float()
    # 1 source
    assert (row["source_split"], row["source_row"]) == (batch["source_split"][i], int(batch["source_row"][i]))
    assert row["data_source"] == batch["data_source"][i] == "tool_arithmetic"
    # 2 prompt: messages, the templated text, its token ids
    assert json.loads(row["messages"]) == list(batch["raw_prompt"][i])
    assert row["prompt_ids"] == list(batch["raw_prompt_ids"][i])
    assert row["prompt_text"] == trainer.tokenizer.decode(row["prompt_ids"])
    # 3 expansion
    assert row["uid"] == batch["uid"][i] and row["sample_index"] == int(batch["sample_index"][i])
    assert row["samples_per_prompt"] == 4 and row["group_size"] == 4
    # 4 generation: replica, sampling, seed, weight version, finish reason
    assert (
        row["replica"] == 0 and json.loads(row["sampling"])["temperature"] == trainer.cfg.rollout.temperature
    )
    assert isinstance(row["seed"], int)
    assert (
        row["weight_version"] == int(batch["weight_version"][i])
        and row["finish_reason"] == batch["finish_reason"][i]
    )
    length = int(batch["attention_mask"][i, -batch["responses"].shape[1] :].sum())
    assert row["response_ids"] == batch["responses"][i, :length].tolist()
    # 5 interaction: every turn and tool call as the agent loop recorded it
    turns = json.loads(row["turns"])
    assert turns == json.loads(json.dumps(record["turns"]))
    call = next(c for t in turns for c in t["tool_calls"])
    assert call["name"] == "calculator" and {"arguments", "result", "duration_s", "error"} <= call.keys()
    assert row["num_turns"] == record["num_turns"] >= 3
    failed_calls = [c for t in turns for c in t["tool_calls"] if c["error"] is not None]
    assert len(json.loads(row["tool_failures"])) >= len(failed_calls) == row["tool_errors"]
    # 6 masks: the spans rebuild response_mask; observations are the tool turns
    spans = mask_spans(row)
    rebuilt = torch.zeros_like(batch["response_mask"][i])
    for kind, a, b in spans:
        rebuilt[a:b] = 1 if kind == "action" else 0
    assert torch.equal(rebuilt, batch["response_mask"][i])
    tool_spans = [tuple(t["span"]) for t in turns if t["role"] == "tool"]
    assert tool_spans and all(
        any(k == "observation" and a <= s < e <= b for k, a, b in spans) for s, e in tool_spans
    )
    # 7 reward: value, on the last action token, its source and extras
    scores = batch["token_level_scores"][i]
    assert row["reward"] == pytest.approx(float(scores.sum()))
    assert row["reward_token"] == int(torch.nonzero(batch["response_mask"][i]).max())
    assert "tool_arithmetic" in row["reward_source"] and "acc" in json.loads(row["reward_extras"])
    # 8 advantage: the estimator's value and the group statistics behind it
    first = int(torch.nonzero(batch["response_mask"][i]).min())
    assert row["estimator"] == "grpo" and row["advantage"] == pytest.approx(
        float(batch["advantages"][i, first])
    )
    group = [k for k in range(len(batch)) if batch["uid"][k] == batch["uid"][i]]
    group_scores = torch.stack([batch["token_level_scores"][k].sum() for k in group])
    assert row["group_reward_mean"] == pytest.approx(float(group_scores.mean()))
    assert row["group_reward_std"] == pytest.approx(float(group_scores.std()), abs=1e-6)  # unbiased, as GRPO
    assert row["advantage"] == pytest.approx(
        (row["advantage_score"] - row["advantage_baseline"]) / (row["advantage_std"] + row["advantage_eps"]),
        rel=1e-5,
        abs=1e-6,
    )
    # 9 optimization: old / rollout log-probs from the batch, new / ratio / clip from the update itself
    assert row["old_log_prob_mean"] == pytest.approx(masked_mean(batch["old_log_probs"][i], mask), rel=1e-5)
    assert row["rollout_log_prob_mean"] == pytest.approx(
        masked_mean(batch["rollout_log_probs"][i], mask), rel=1e-5
    )
    assert row["update_tokens"] == int(mask.sum())
    assert row["new_log_prob_mean"] - row["old_log_prob_mean"] == pytest.approx(
        row["log_ratio_mean"], abs=1e-5
    )
    assert 0 <= row["clipped_share"] <= 1 and row["ratio_min"] <= row["ratio_mean"] <= row["ratio_max"]
    moved = [r for r in rows if abs(r["ratio_max"] - 1) > 1e-5 or abs(r["ratio_min"] - 1) > 1e-5]
    assert moved, "the second mini-batch's rows must see the policy the first one moved"
    # 10 loop closure
    assert row["trained"] and row["trained_version"] == trained_version == row["weight_version"]
    assert row["staleness"] == 0
    # and the answers a user reads say so
    answers = {a.question: dict(a.lines) for a in ten_answers(row)}
    assert len(answers) == 10 and "calculator(" in " ".join(v for k, v in ten_answers(row)[4].lines)
    assert answers["loop closure"]["staleness"].startswith("0 version(s)")


def test_a_parser_that_always_fails_is_named_by_the_doctor(task, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setitem(
        tool_parsers.PARSERS, "hermes", lambda text: ParseResult(text, [], ["planted: unparsable"])
    )
    RLTrainer(
        tool_config(task, "trainer.test_freq=0", "agent.on_parse_error=feedback"), tmp_path / "run"
    ).fit()
    (problem,) = [f for f in diagnose(load_run(tmp_path / "run")) if f.key == "parse_failures"]
    assert problem.severity == "problem" and problem.layer == "compute & environment"
    assert "100%" in problem.title and "agent.tool_format" in problem.next_step
