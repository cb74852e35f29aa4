"""The trainer with `agent.enable`: multi-turn episodes with a calculator in the generate phase,
tool tokens out of the loss, agent records and metrics in the run directory, agent validation."""

import itertools
import json

import pytest
import torch

from stratarl.apps.tool_quickstart import RECIPE
from stratarl.assembly import algorithm, datasets, roles, scoring
from stratarl.config import ConfigError, load_config, validate_config
from stratarl.data.schema import read_rows, write_rows
from stratarl.observe.run_log import read_metrics
from stratarl.trainer import phases
from stratarl.trainer.agent_rollout import build_agent_rollout, check_agent_names
from stratarl.trainer.agent_validation import TOOL_SUCCESS_KEY, run_agent_validation, tool_call_success_rate
from stratarl.trainer.rl_trainer import RLTrainer

SMALL = [
    "data.prompts_per_step=4",
    "rollout.n=4",
    "actor.prompts_per_mini_batch=4",
    "actor.trajectories_per_micro_batch=16",
    "trainer.total_steps=2",
    "trainer.test_freq=2",
    "sft.trajectories_per_step=16",
    "sft.trajectories_per_micro_batch=16",
]


def tool_config(task, *extra):
    return load_config(
        RECIPE,
        [
            f"data.train_files=['{task['train']}']",
            f"data.val_files=['{task['test']}']",
            f"agent.tool_config_path={task['tools']}",
            f"model.path={task['model']}",
            *SMALL,
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def task(sft_tool_task):
    return sft_tool_task


@pytest.fixture
def built_agent():
    """build_agent_rollout, with the tool workers of every agent it made stopped afterwards."""
    made = []

    def build(cfg, tokenizer):
        made.append(build_agent_rollout(cfg, tokenizer))
        return made[-1]

    yield build
    for agent in made:
        agent.close()


def test_two_grpo_steps_run_episodes_with_tool_calls_and_record_them(task, tmp_path):
    trainer = RLTrainer(tool_config(task), tmp_path / "run")
    assert trainer.agent is not None and "calculator" in trainer.agent.tools
    before = {k: v.clone() for k, v in trainer.worker.local_worker().actor.model.state_dict().items()}
    last_val = trainer.fit()
    after = trainer.worker.local_worker().actor.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight changed"

    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for name in ("num_turns/mean", "tool_call_counts/mean", "agent/tool_calls/total",
                 "agent/parse_failures/total", "agent/tool_errors/total", "critic/score/mean"):  # fmt: skip
        assert all(name in r for r in train), name
    assert sum(r["agent/tool_calls/total"] for r in train) > 0
    assert "val-core/tool_arithmetic/acc/mean@1" in last_val
    assert "val-aux/num_turns/mean" in last_val

    records = [
        json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert len(records) == 2 * 16  # steps × B·n
    assert {"stop_reason", "num_turns", "turns", "reward", "uid", "response"} <= records[0].keys()
    calls = [c for r in records for t in r["turns"] for c in t["tool_calls"]]
    assert calls, "no trajectory called the tool"
    assert {"name", "arguments", "result", "duration_s", "error"} <= calls[0].keys()
    for record in records:  # the observation turn follows its call, spans tile the response
        spans = [t["span"] for t in record["turns"] if t["span"][1] > t["span"][0]]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    validations = list((tmp_path / "run" / "val_generations").glob("*.jsonl"))
    assert validations and "turns" in json.loads(validations[0].read_text().splitlines()[0])


def test_tool_tokens_have_mask_zero_and_no_log_prob(built_agent, task):
    cfg = tool_config(task, "rollout.n=8")
    tokenizer = datasets.load_tokenizer(cfg)
    dataset = datasets.load_prompts(cfg.data.train_files, tokenizer, max_prompt_tokens=64, limit=None)
    agent = built_agent(cfg, tokenizer)
    worker = roles.build_policy_worker(cfg, tokenizer, total_steps=1)
    prompts = phases.expand_prompts(
        datasets.prompts_batch(dataset, [0, 1, 2, 3], tokenizer.pad_token_id), 8, "t"
    )
    batch, metrics = agent.generate(worker, prompts, algorithm.train_sampling(cfg), seed=3)
    assert batch["num_turns"].shape == (32,) and metrics["num_turns/max"] >= 3
    mask, log_probs = batch["response_mask"], batch["rollout_log_probs"]
    observed = 0
    for i, record in enumerate(batch["agent_record"]):
        for turn in record["turns"]:
            start, end = turn["span"]
            expected = 1 if turn["role"] == "assistant" else 0
            assert (mask[i, start:end] == expected).all(), (turn["role"], turn["text"])
            if turn["role"] == "tool":
                observed += end - start
                assert (log_probs[i, start:end] == 0).all()
                assert turn["text"].startswith("\n<|im_start|>tool\n")  # the result, rendered once
        length = record["response_tokens"]
        assert mask[i, length:].sum() == 0 and int(mask[i].sum()) == record["action_tokens"]
    assert observed > 0
    # the logged rollout log-probs are those of the sampled tokens: a teacher-forced forward agrees
    with torch.no_grad():
        logits = (
            worker.local_worker()
            .rollout.model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"],
            )
            .logits.float()
        )
    P, T = batch["prompts"].shape[1], batch["responses"].shape[1]
    log_softmax = torch.log_softmax(logits[:, P - 1 : P + T - 1], -1)  # [N, T, V]
    forward = log_softmax.gather(-1, batch["responses"][..., None])[..., 0]
    torch.testing.assert_close(forward * mask, log_probs, atol=2e-4, rtol=0)


def test_agent_validation_reports_accuracy_and_tool_success(built_agent, task):
    cfg = tool_config(task)
    tokenizer = datasets.load_tokenizer(cfg)
    val_set = datasets.load_prompts(cfg.data.val_files, tokenizer, max_prompt_tokens=64, limit=None)
    agent = built_agent(cfg, tokenizer)
    worker = roles.build_policy_worker(cfg, tokenizer, total_steps=1)
    metrics, records = run_agent_validation(
        agent, worker, val_set, tokenizer=tokenizer, compute_score=scoring.build_compute_score(cfg),
        sampling=algorithm.val_sampling(cfg), n=1, step=0, seed=0,
    )  # fmt: skip
    assert len(records) == len(val_set)
    accuracy = metrics["val-core/tool_arithmetic/acc/mean@1"]
    assert accuracy == pytest.approx(sum(r["acc"] for r in records) / len(records))
    calls = [c for r in records for t in r["turns"] for c in t["tool_calls"]]
    failures = sum(1 for r in records for t in r["turns"] if t["parse_errors"])
    if calls or failures:
        ok = sum(c["error"] is None for c in calls)
        assert metrics[TOOL_SUCCESS_KEY] == pytest.approx(ok / (len(calls) + failures))
    assert metrics["val-aux/agent/tool_calls/total"] == len(calls)


def test_tool_call_success_rate_counts_malformed_calls_as_failed_attempts():
    from stratarl.agent.trajectory import ToolCallRecord, Trajectory, Turn

    def episode(errors, parse_failures):
        t = Trajectory("r", [1], [])
        t.turns = [
            Turn("assistant", 0, 1, "x", tool_calls=[ToolCallRecord("c", {}, error=e) for e in errors])
        ]
        t.turns += [Turn("assistant", 1, 2, "y", parse_errors=["bad json"]) for _ in range(parse_failures)]
        return t

    # 3 executed calls, 1 of them an error, plus 1 malformed call: 2 successes of 4 attempts
    assert tool_call_success_rate([episode([None, "boom"], 0), episode([None], 1)]) == 0.5
    assert tool_call_success_rate([episode([], 0)]) is None  # nothing attempted: no rate


def test_agent_settings_are_validated_naming_the_key(task):
    with pytest.raises(ConfigError, match=r"agent\.truncate_side"):
        validate_config(tool_config(task, "agent.truncate_side=left"))
    tokenizer = datasets.load_tokenizer(tool_config(task))
    with pytest.raises(ConfigError, match=r"agent\.max_parallel_calls"):
        build_agent_rollout(tool_config(task, "agent.max_parallel_calls=0"), tokenizer)
    with pytest.raises(ConfigError, match=r"agent\.tool_config_path.*not found"):
        build_agent_rollout(tool_config(task, "agent.tool_config_path=/nonexistent.yaml"), tokenizer)
    with pytest.raises(ConfigError, match="remax"):
        build_agent_rollout(tool_config(task, "algorithm.adv_estimator=remax"), tokenizer)
    with pytest.raises(ConfigError, match=r"agent\.enable"):
        load_config(RECIPE, ["rollout.multi_turn.enable=true"])  # verl's key: the message gives ours
    assert build_agent_rollout(tool_config(task, "agent.enable=false"), tokenizer) is None


def test_streaming_reward_scores_as_the_reward_phase_would(task):
    cfg = tool_config(task, "agent.streaming_reward=true", "reward.num_workers=1")
    tokenizer = datasets.load_tokenizer(cfg)
    dataset = datasets.load_prompts(cfg.data.train_files, tokenizer, max_prompt_tokens=64, limit=None)
    compute_score = scoring.build_compute_score(cfg)
    agent = build_agent_rollout(cfg, tokenizer)
    rewards = scoring.build_reward(cfg)
    worker = roles.build_policy_worker(cfg, tokenizer, total_steps=1)
    prompts = phases.expand_prompts(datasets.prompts_batch(dataset, [0, 1], tokenizer.pad_token_id), 4, "s")
    try:
        streamed, metrics = agent.generate(
            worker, prompts, algorithm.train_sampling(cfg), seed=5, rewards=rewards
        )
    finally:
        agent.close()
        rewards.close()
    assert metrics["reward/failures/total"] == 0 and "reward/acc/mean" in metrics
    scorer_columns = ("token_level_scores", "acc", "format_ok", "used_tool", "reward_failure")
    unscored = streamed.select([c for c in streamed.columns if c not in scorer_columns])
    rescored, _, _ = phases.reward(unscored, tokenizer, compute_score)
    torch.testing.assert_close(streamed["token_level_scores"], rescored["token_level_scores"])
    assert torch.equal(streamed["acc"], rescored["acc"])


def test_each_row_runs_the_agent_loop_its_dataset_row_names(built_agent, task, tmp_path):
    rows = read_rows(task["test"])
    for i, row in enumerate(rows):  # even rows: the single-turn loop; odd rows: no name, the default
        row["agent_name"] = "single_turn_agent" if i % 2 == 0 else None
    path = write_rows(tmp_path / "named.parquet", rows)
    cfg = tool_config(task, f"data.val_files=['{path}']")
    tokenizer = datasets.load_tokenizer(cfg)
    val_set = datasets.load_prompts(cfg.data.val_files, tokenizer, max_prompt_tokens=64, limit=None)
    assert [item.agent_name for item in val_set.items] == [r["agent_name"] for r in rows]
    agent = built_agent(cfg, tokenizer)
    worker = roles.build_policy_worker(cfg, tokenizer, total_steps=1)
    _, records = run_agent_validation(
        agent, worker, val_set, tokenizer=tokenizer, compute_score=scoring.build_compute_score(cfg),
        sampling=algorithm.val_sampling(cfg), n=1, step=0, seed=0,
    )  # fmt: skip
    single = [r for r in records if r["source_row"] % 2 == 0]
    assert all(len(r["turns"]) == 1 and not r["turns"][0]["tool_calls"] for r in single)
    assert any(c for r in records if r["source_row"] % 2 for t in r["turns"] for c in t["tool_calls"])
    rows[1]["agent_name"] = "react_agent"
    write_rows(tmp_path / "unknown.parquet", rows)
    unknown = datasets.load_prompts(
        [str(tmp_path / "unknown.parquet")], tokenizer, max_prompt_tokens=64, limit=None
    )
    with pytest.raises(ValueError, match=r"unknown\.parquet row 1: 'react_agent'"):
        check_agent_names(val_set, unknown)
