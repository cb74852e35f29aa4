"""`stratarl train` with agent.gateway: a missing agent file or function is one config message and
exit 2; two steps train an agent program that uses only the openai client, and its trace lists each
call of an episode and the row it became, and the doctor names episodes that split; agents that
exit, block or signal the trainer are counted and the run trains on the others (slow)."""

import json
from pathlib import Path

import pytest

from stratarl.cli import main
from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
from stratarl.data.tiny_models import build_tiny_model
from stratarl.data.tokenizer_factory import corpus_from_parquet
from stratarl.observe.doctor.diagnosis import diagnose
from stratarl.observe.doctor.view import load_run
from stratarl.observe.trace_answers import ten_answers
from stratarl.observe.trace_store import read_step, step_files
from stratarl.reward.worker_isolation import pid_namespace_problem
from tests.test_cli import small_run

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "examples" / "openai_agent" / "calculator_agent.py"


@pytest.fixture(scope="module")
def tiny_task(tmp_path_factory):
    """An arithmetic task and a 1M model (as tests/test_cli.py builds them)."""
    root = tmp_path_factory.mktemp("gateway-task")
    paths = make_arithmetic_dataset(root / "data", n_train=32, n_test=8, digits=1, seed=0)
    corpus = corpus_from_parquet([paths["train"]])
    return {**paths, "model": build_tiny_model(root / "model", size="1m", corpus_texts=corpus, seed=0)}


def gateway_run(task, root, *extra):
    return small_run(
        task, root, "agent.gateway.enable=true", f"agent.gateway.agent_function_path={AGENT}", *extra
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["agent.gateway.agent_function_path=/nowhere/agent.py"],
            "agent.gateway.agent_function_path: file not found",
        ),
        (["agent.gateway.agent_function_name=missing"], "agent.gateway.agent_function_name: "),
        (["agent.gateway.agent_function_name=calculate"], "must be an `async def`"),
        (["agent.enable=true"], "choose one: the built-in tool loop"),
        (["algorithm.filter_groups.enable=true"], "dynamic sampling is not built for gateway rows"),
        (["agent.gateway.episode_timeout_s=0"], "agent.gateway.episode_timeout_s: must be > 0"),
    ],
)
def test_a_bad_agent_program_is_refused_naming_the_key(tiny_task, tmp_path, capsys, overrides, message):
    assert main(["train", *gateway_run(tiny_task, tmp_path, *overrides)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # refused before anything started or was written


TWO_CALL_AGENT = """
from openai import AsyncOpenAI


async def run_episode(base_url, api_key, row):
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    messages = list(row["messages"])
    for follow_up in ("Check it and answer again.", None):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
        text = reply.choices[0].message.content
        messages.append({"role": "assistant", "content": text})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    return float(any(c.isdigit() for c in text))  # some episodes 1, some 0: a learning signal
"""


@pytest.fixture(scope="module")
def two_call_run(tiny_task, tmp_path_factory):
    """Two traced steps (every trajectory) of TWO_CALL_AGENT; the output root."""
    root = tmp_path_factory.mktemp("two-call")
    agent = root / "two_call_agent.py"
    agent.write_text(TWO_CALL_AGENT)
    run = small_run(
        tiny_task,
        root / "out",
        "agent.gateway.enable=true",
        f"agent.gateway.agent_function_path={agent}",
        "trainer.total_steps=2",
        "trainer.test_freq=2",
        "rollout.max_response_tokens=24",
        "trainer.save_trajectories=true",
        "trace.enable=true",
        "trace.fraction=1.0",
        "agent.gateway.keep_sampled_ids=false",  # the re-tokenized prompts: episodes split
    )
    assert main(["train", *run]) == 0
    return root


@pytest.mark.slow
def test_two_steps_train_an_openai_client_agent_on_its_captured_tokens(two_call_run):
    tmp_path = two_call_run
    (metrics_file,) = (tmp_path / "out").rglob("metrics.jsonl")
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    train = [r for r in records if r.get("phase") == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for record in train:
        assert record["agent/gateway_episodes"] == 8.0  # 4 prompts × n=2
        assert record["agent/gateway_calls/mean"] == 2.0
        assert record["agent/gateway_episode_timeouts"] == 0 and record["agent/gateway_episode_errors"] == 0
        merged, per_call = record["agent/gateway_rows_merged"], record["agent/gateway_rows_per_call"]
        assert record["agent/gateway_rows"] == merged + per_call == merged + 2 * (8 - merged)
    # the agent's rewards reached the update: a group with different rewards, a gradient from it
    assert any(r["critic/advantages/max"] > 0 and r["actor/grad_norm"] > 0 for r in train)
    (val,) = [r for r in records if r.get("phase") == "val"]
    assert val["val-aux/agent/gateway_episodes"] == 8.0
    (trajectories_file,) = (tmp_path / "out").rglob("trajectories.jsonl")
    lines = [json.loads(line) for line in trajectories_file.read_text().splitlines()]
    assert lines and all(line["stop_reason"] == "agent_returned" for line in lines)


@pytest.mark.slow
def test_the_trace_lists_each_call_of_an_episode_and_the_row_it_became(two_call_run):
    (run_dir,) = {p.parent for p in (two_call_run / "out").rglob("metrics.jsonl")}
    assert sorted(step_files(run_dir)) == [1, 2]
    traces = {step: read_step(run_dir, step) for step in (1, 2)}
    for step, rows in traces.items():
        assert rows, f"step {step} traced nothing"
        for row in rows:
            calls = json.loads(row["gateway_calls"])
            assert [c["call"] for c in calls] == [0, 1]  # the agent always calls twice
            for call in calls:
                assert call["prompt_tokens"] > 0 and 1 <= call["sampled_tokens"] <= 8  # max_tokens=8
                assert call["weight_version"] == step - 1  # sync: served by the weights before the update
                assert call["finish_reason"] in ("stop", "length")
            # the row this trace row is, is the row its episode's calls name
            if calls[0]["merged"]:
                assert calls[1]["extends_previous"] and {c["row"] for c in calls} == {row["trajectory_id"]}
            else:
                assert row["trajectory_id"] in (calls[0]["row"], calls[1]["row"])
                assert calls[0]["row"] != calls[1]["row"]
            second = calls[1]
            if second["split_reason"] == "not_a_prefix":
                assert second["extends_previous"] is False
                assert second["found_ids"] != second["expected_ids"]  # the ids really part there
                assert 0 <= second["diverges_at"] < second["prompt_tokens"]
            lines = dict(ten_answers(row)[4].lines)  # the interaction answer a user reads
            assert (
                f"sampled {calls[1]['sampled_tokens']}, weight version {step - 1}" in lines["gateway call 1"]
            )
            assert f"→ row {calls[1]['row']}" in lines["gateway call 1"]


@pytest.mark.slow
def test_the_doctor_names_episodes_that_split_into_one_row_per_call(two_call_run):
    (run_dir,) = {p.parent for p in (two_call_run / "out").rglob("metrics.jsonl")}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("phase") == "train"]
    split = sum(r["agent/gateway_split/not_a_prefix"] for r in train)
    episodes = sum(r["agent/gateway_episodes"] for r in train)
    assert split > episodes / 2, "the untrained model's second prompts re-tokenize its first answers"
    (finding,) = [f for f in diagnose(load_run(run_dir)) if f.key == "gateway_splits"]
    assert finding.severity == "warning" and f"{int(split)} of {int(episodes)}" in finding.evidence[0]
    assert "departs from call 0's prompt + response at token" in finding.evidence[1]
    assert "send each assistant message back unchanged" in finding.next_step


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "extra"),
    [("one_step_off", []), ("async", ["async_training.max_staleness=1", "async_training.buffer_batches=1"])],
)
def test_the_off_policy_modes_train_the_agent_program_with_each_calls_weight_version(
    tiny_task, tmp_path, mode, extra
):
    agent = tmp_path / "two_call_agent.py"
    agent.write_text(TWO_CALL_AGENT)
    run = small_run(
        tiny_task,
        tmp_path / "out",
        "agent.gateway.enable=true",
        f"agent.gateway.agent_function_path={agent}",
        f"trainer.mode={mode}",
        "trainer.total_steps=2",
        "rollout.max_response_tokens=64",  # both answers and the user turn between them fit one row
        "trainer.save_trajectories=true",
        "trace.enable=true",
        "trace.fraction=1.0",
        *extra,
    )
    assert main(["train", *run]) == 0
    (run_dir,) = {p.parent for p in (tmp_path / "out").rglob("metrics.jsonl")}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("phase") == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["agent/gateway_episodes"] == 8.0 and r["agent/gateway_calls/mean"] == 2.0 for r in train)
    # agent.gateway.keep_sampled_ids (on): second prompts keep the first answer's ids, nothing drifts
    assert all(r["agent/gateway_split/not_a_prefix"] == 0 for r in train)
    assert sum(r["agent/gateway_prompts_kept_sampled_ids"] for r in train) > 0
    assert sum(r["agent/gateway_rows_merged"] for r in train) > 0
    if mode == "one_step_off":  # step 2 trains version 1 on rows version 0 generated
        assert [r["async/staleness_max"] for r in train] == [0.0, 1.0]
    else:
        assert all(0.0 <= r["async/staleness_max"] <= 1.0 for r in train)
    for step in (1, 2):
        for row in read_step(run_dir, step):
            calls = json.loads(row["gateway_calls"])
            versions = {c["weight_version"] for c in calls}
            # the row's version is its oldest sampled token's; every call was served by a pushed version
            assert (
                row["weight_version"] == min(versions)
                if calls[0]["merged"]
                else row["weight_version"] in versions
            )
            assert row["staleness"] == row["trained_version"] - row["weight_version"] >= 0
            assert all(0 <= v <= step - 1 for v in versions)
    lines = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    assert {line["step"] for line in lines} == {1, 2}
    for line in lines:  # each assistant turn carries the version of the call that sampled it
        turns = [t for t in line["turns"] if t["role"] == "assistant"]
        assert turns and all(t["weight_version"] == line["weight_version"] for t in turns)
    # per-token versions, as the other async rows: token staleness = row staleness (no partial rows)
    assert [r["async/token_staleness_max"] for r in train] == [r["async/staleness_max"] for r in train]
    assert all(r["async/partial_rows"] == 0 for r in train)


STATUSES = ("timeout", "error", "crash")
HOSTILE_AGENT = """
import asyncio, os, time
from openai import AsyncOpenAI


async def run_episode(base_url, api_key, row):
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        reply = await client.chat.completions.create(model="policy", messages=row["messages"], max_tokens=4)
    if row["request_id"].endswith("/0"):  # the first sample of each prompt: a well-behaved episode
        return float(any(c.isdigit() for c in reply.choices[0].message.content))
    await asyncio.sleep(1.0)  # the well-behaved episodes in this worker have returned by now
    fault = row["extra_info"]["index"] % 3
    if fault == 0:
        os._exit(3)
    if fault == 1:
        os.kill(os.getppid(), 9)  # the trainer, were it not in its own PID namespace
        return 0.5
    time.sleep(3600)  # blocks its worker's event loop
"""


@pytest.mark.slow
@pytest.mark.skipif(pid_namespace_problem() is not None, reason="needs a PID namespace (bubblewrap)")
def test_agents_that_exit_block_or_signal_the_trainer_are_counted_and_the_run_trains(tiny_task, tmp_path):
    agent = tmp_path / "hostile_agent.py"
    agent.write_text(HOSTILE_AGENT)
    run = small_run(
        tiny_task,
        tmp_path / "out",
        "agent.gateway.enable=true",
        f"agent.gateway.agent_function_path={agent}",
        "agent.gateway.episode_timeout_s=3",
        "trainer.total_steps=2",
    )
    assert main(["train", *run]) == 0  # and this process, the trainer, is alive to see it
    (metrics_file,) = (tmp_path / "out").rglob("metrics.jsonl")
    train = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    train = [r for r in train if r.get("phase") == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        ended = ["timeouts", "errors", "crashes"]
        counts = {k: r[f"agent/gateway_episode_{k}"] for k in ended}
        print(f"step {r['step']}: {counts}, rows {r['agent/gateway_rows']:g}")
        failed = sum(r[f"agent/gateway_episode_{k}"] for k in ended)
        assert r["agent/gateway_episodes"] == 8 and failed <= 4, r  # the 4 "/1" episodes at most
        assert r["agent/gateway_rows"] >= 4  # every well-behaved episode trained
    assert sum(r["agent/gateway_episode_crashes"] + r["agent/gateway_episode_timeouts"] for r in train) > 0
    for r in train:  # the same counts as failures of user code, as the run summary lists them
        assert r["agent/failures/total"] == sum(r.get(f"agent/failures/episode_{s}", 0) for s in STATUSES)
        assert r.get("agent/failures/episode_crash", 0) == r["agent/gateway_episode_crashes"]
    assert train[-1]["agent/gateway_worker_restarts"] > 0


def test_an_agent_file_that_fails_to_import_in_its_worker_is_one_message(tiny_task, tmp_path, capsys):
    agent = tmp_path / "broken_agent.py"
    agent.write_text("import no_such_module_anywhere\n\nasync def run_episode(base_url, api_key, row): ...\n")
    run = small_run(
        tiny_task, tmp_path / "out", "agent.gateway.enable=true", f"agent.gateway.agent_function_path={agent}"
    )
    assert main(["train", *run]) == 2
    err = capsys.readouterr().err
    assert "agent.gateway.agent_function_path:" in err and "No module named 'no_such_module_anywhere'" in err
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("in_process", ["true", "false"])
def test_one_step_trains_the_example_agent_in_workers_or_in_process(tiny_task, tmp_path, in_process):
    run = gateway_run(tiny_task, tmp_path, f"agent.gateway.in_process={in_process}")
    assert main(["train", *run]) == 0
    (metrics_file,) = tmp_path.rglob("metrics.jsonl")
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    (record,) = [r for r in records if r.get("phase") == "train"]
    assert record["agent/gateway_episodes"] == 8.0 and record["agent/gateway_calls/total"] >= 8
    assert ("agent/gateway_worker_restarts" in record) == (in_process == "false")
