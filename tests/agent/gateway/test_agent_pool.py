"""The agent program in contained worker processes: 64 episodes at once in two workers, and agents
that block their loop, swallow cancellation, raise, exit, crash or signal their parent — each
counted as its episode's status, the pool replacing what it lost and serving the next episodes; an
episode that ends drops its requests still waiting for the engine; no process an agent started
outlives its pool or a killed trainer."""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from openai import AsyncOpenAI, NotFoundError

from stratarl.agent.gateway.agent_pool import AgentPool
from stratarl.agent.gateway.agent_program import AgentProgramError
from stratarl.agent.gateway.episode_rows import rows_metrics
from stratarl.agent.gateway.episodes import run_episodes
from stratarl.agent.gateway.server import Gateway
from stratarl.reward.worker_isolation import pid_namespace_problem
from stratarl.rollout.interface import SamplingParams
from stratarl.rollout.torch_engine import TorchRolloutEngine
from tests.agent.test_runner_torch import tiny_lm
from tests.reward.faulty_scorers import TOKEN_VARIABLE
from tests.reward.test_pool_faults import processes_with, wait_until

AGENT = """
import asyncio, ctypes, os, sys, time
from openai import AsyncOpenAI

async def run_episode(base_url, api_key, row):
    mode, started = row["mode"], time.monotonic()
    if mode == "wait":  # every episode of the batch is running at once before any calls
        await asyncio.sleep(2.0)
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": row["question"]}], max_tokens=4
        )
    text = reply.choices[0].message.content
    if mode == "block":
        time.sleep(3600)  # blocks the worker's event loop
    if mode == "swallow":
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass  # refuses to be cancelled
    if mode == "raise":
        raise RuntimeError("the agent broke")
    if mode == "sys_exit":
        sys.exit(3)
    if mode == "exit":
        os._exit(3)
    if mode == "segfault":
        ctypes.string_at(0)
    if mode == "kill_parent":
        os.kill(os.getppid(), 9)
        await asyncio.sleep(0.2)
    if mode == "not_a_reward":
        return "seven"
    return {"score": float(len(text)), "pid": os.getpid(), "started": started, "ended": time.monotonic()}
"""


@pytest.fixture(scope="module")
def engine(tokenizer):
    ids = {"eos_token_ids": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    return TorchRolloutEngine(tiny_lm(len(tokenizer)), seed=0, **ids)


@pytest.fixture(scope="module")
def agent_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("agent") / "agent.py"
    path.write_text(AGENT)
    return str(path)


@pytest.fixture(scope="module")
def pool(agent_file):
    with AgentPool(agent_file, "run_episode", num_workers=2, timeout_s=60.0, grace_s=1.0) as pool:
        yield pool


@pytest.fixture(scope="module")
def short_pool(agent_file):
    """A short deadline, for the agents that never end (long enough for their model call first)."""
    with AgentPool(agent_file, "run_episode", num_workers=2, timeout_s=6.0, grace_s=1.0) as pool:
        yield pool


def serve(engine, renderer) -> Gateway:
    sampling = SamplingParams(max_tokens=4)
    return Gateway(engine, renderer, sampling=sampling, max_prompt_tokens=256, keep_sampled_ids=True)


def episodes(engine, renderer, pool, rows):
    async def main():
        async with serve(engine, renderer) as gateway:
            captures = await run_episodes(gateway, pool, rows, max_concurrent=64)
            return captures, gateway.batcher.batch_sizes

    return asyncio.run(main())


def rows(mode, k):
    return [{"mode": mode, "question": f"What is {i}+{i}?"} for i in range(k)]


@pytest.mark.slow
def test_64_episodes_run_at_once_in_two_worker_processes(engine, renderer, agent_file):
    # 64 openai clients on 2 shared cores take seconds to build (each makes an SSL context)
    with AgentPool(agent_file, "run_episode", num_workers=2, timeout_s=120.0) as pool:
        captures, batch_sizes = episodes(engine, renderer, pool, rows("wait", 64))
        assert pool.live_workers == 2
    assert [c.status for c in captures] == ["done"] * 64, {c.error for c in captures}
    assert all(c.reward == float(len(c.calls[0].text)) for c in captures)  # the agent's own reward
    extras = [c.reward_extras for c in captures]
    assert max(e["started"] for e in extras) < min(e["ended"] for e in extras)  # all 64 ran at once
    assert all(e["pid"] != os.getpid() for e in extras)  # in the workers, not in this process
    assert sum(batch_sizes) == 64 and max(batch_sizes) > 8  # their calls shared engine batches


@pytest.mark.parametrize(
    ("mode", "status", "message"),
    [
        pytest.param("block", "timeout", "its event loop is blocked; stuck at File", marks=pytest.mark.slow),
        pytest.param("swallow", "timeout", "cancelled after 6 s", marks=pytest.mark.slow),
        ("raise", "error", "RuntimeError: the agent broke"),
        ("sys_exit", "error", "SystemExit: exit code 3"),
        ("not_a_reward", "error", "the agent's reward must be a finite number, got 'seven'"),
        ("exit", "crash", "ended (the process exited with code 3)"),
        ("segfault", "crash", "ended (killed by SIGSEGV)"),
    ],
)
def test_a_hostile_agent_is_counted_and_the_next_episodes_run(
    request, engine, renderer, mode, status, message
):
    pool = request.getfixturevalue("short_pool" if status == "timeout" else "pool")
    restarts = pool.restarts
    captures, _ = episodes(engine, renderer, pool, rows(mode, 3))
    assert [c.status for c in captures] == [status] * 3, [c.error for c in captures]
    assert all(message in c.error for c in captures), captures[0].error
    assert all(len(c.calls) == 1 for c in captures)  # the call before the fault is still recorded
    metrics = rows_metrics([], captures)
    key = {"timeout": "timeouts", "error": "errors", "crash": "crashes"}[status]
    assert metrics[f"agent/gateway_episode_{key}"] == 3.0
    if mode == "block":  # where the loop was stuck: the agent file's line, from the worker's stacks
        assert 'agent.py", line' in captures[0].error and "in run_episode" in captures[0].error
    after, _ = episodes(engine, renderer, pool, rows("ok", 4))  # the run goes on
    assert [c.status for c in after] == ["done"] * 4
    lost = mode in ("block", "exit", "segfault")  # those end their workers (both: 3 episodes in 2)
    assert (pool.restarts > restarts) == lost


@pytest.mark.skipif(pid_namespace_problem() is not None, reason="needs a PID namespace (bubblewrap)")
def test_an_agent_cannot_kill_the_trainer(engine, renderer, pool):
    captures, _ = episodes(engine, renderer, pool, rows("kill_parent", 2))
    # getppid() is the namespace's init, which ignores the signal; this process lives to read it
    assert [c.status for c in captures] == ["done"] * 2 and captures[0].reward is not None


def test_an_agent_file_that_fails_to_import_is_one_message_naming_the_key(tmp_path):
    path = tmp_path / "agent.py"
    path.write_text("import no_such_module_anywhere\n\nasync def run_episode(base_url, api_key, row): ...\n")
    with pytest.raises(AgentProgramError, match=r"agent_function_path: .* failed to import: Module"):
        AgentPool(str(path), "run_episode", num_workers=2, timeout_s=3.0)
    exits = tmp_path / "exits.py"
    exits.write_text("import os\nos._exit(4)\n")
    with pytest.raises(AgentProgramError, match=r"agent_function_path: the agent worker ended .*code 4"):
        AgentPool(str(exits), "run_episode", num_workers=1, timeout_s=3.0)


class SlowEngine:
    """The tiny engine, 1 s per generate call: requests queue behind a busy engine."""

    def __init__(self, engine):
        self.engine, self.weight_version = engine, engine.weight_version
        self.started = threading.Event()

    def generate(self, requests):
        self.started.set()
        time.sleep(1.0)
        return self.engine.generate(requests)


def test_an_ended_episode_drops_its_waiting_requests(engine, renderer):
    slow = SlowEngine(engine)

    async def main():
        async with serve(slow, renderer) as gateway:
            (url_a, _), (url_b, capture_b) = gateway.open_episode({}), gateway.open_episode({})
            message = [{"role": "user", "content": "What is 2+2?"}]

            async def call(url):
                async with AsyncOpenAI(base_url=url, api_key=gateway.api_key, max_retries=0) as client:
                    return await client.chat.completions.create(model="m", messages=message)

            first = asyncio.create_task(call(url_a))
            await asyncio.to_thread(slow.started.wait, 10)  # the engine is busy with a's call
            second = asyncio.create_task(call(url_b))
            await asyncio.sleep(0.3)  # b's request waits for the engine
            gateway.end_episode(capture_b, "timeout", error="cancelled")
            with pytest.raises(NotFoundError, match="has ended"):
                await second
            await first
            return gateway.requests_dropped, gateway.batcher.batch_sizes, capture_b

    dropped, batch_sizes, capture_b = asyncio.run(main())
    assert dropped == 1 and batch_sizes == [1]  # b's request never reached the engine
    assert capture_b.calls == [] and capture_b.status == "timeout"


GRANDCHILD_AGENT = """
import asyncio, subprocess

async def run_episode(base_url, api_key, row):
    subprocess.Popen(["sleep", "600"], start_new_session=True)  # a grandchild in a session of its own
    if row["hang"]:
        await asyncio.sleep(600)
    return 1.0
"""
TRAINER = """
import asyncio, sys
from stratarl.agent.gateway.agent_pool import AgentPool
with AgentPool(sys.argv[1], "run_episode", num_workers=1, timeout_s=60) as pool:
    outcome = asyncio.run(pool.run("http://127.0.0.1:9/v1", "key", {"hang": sys.argv[2] == "hang"}))
    print("outcome", outcome.status, outcome.value, flush=True)
"""


@pytest.mark.slow  # a trainer process of its own: importing torch there takes seconds
@pytest.mark.skipif(pid_namespace_problem() is not None, reason="needs a PID namespace (bubblewrap)")
@pytest.mark.parametrize("ending", ["pool_closes", "trainer_killed"])
def test_no_process_of_an_agent_outlives_its_pool_or_a_killed_trainer(tmp_path, ending):
    agent = tmp_path / "agent.py"
    agent.write_text(GRANDCHILD_AGENT)
    token = uuid.uuid4().hex
    hang = "hang" if ending == "trainer_killed" else "return"
    command = [sys.executable, "-c", TRAINER, str(agent), hang]
    env = {**os.environ, TOKEN_VARIABLE: token}
    trainer = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    if ending == "pool_closes":
        out, _ = trainer.communicate(timeout=60)
        assert "outcome done 1.0" in out
    else:  # the trainer, bwrap, the worker and the agent's grandchild
        assert wait_until(lambda: len(processes_with(token)) >= 4, 30), processes_with(token)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    assert wait_until(lambda: not processes_with(token), 10), f"left running: {processes_with(token)}"
