"""`stratarl train` with agent.gateway: a missing agent file or function is one config message and
exit 2; two steps train an agent program that uses only the openai client (slow)."""

import json
from pathlib import Path

import pytest

from stratarl.cli import main
from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
from stratarl.data.tiny_models import build_tiny_model
from stratarl.data.tokenizer_factory import corpus_from_parquet
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
        (["trainer.mode=one_step_off"], "the gateway runs in trainer.mode=sync only"),
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


@pytest.mark.slow
def test_two_steps_train_an_openai_client_agent_on_its_captured_tokens(tiny_task, tmp_path):
    agent = tmp_path / "two_call_agent.py"
    agent.write_text(TWO_CALL_AGENT)
    run = small_run(
        tiny_task,
        tmp_path / "out",
        "agent.gateway.enable=true",
        f"agent.gateway.agent_function_path={agent}",
        "trainer.total_steps=2",
        "trainer.test_freq=2",
        "rollout.max_response_tokens=24",
        "trainer.save_trajectories=true",
    )
    assert main(["train", *run]) == 0
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
