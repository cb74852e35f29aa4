"""Scorers that attack their worker: a half-written message, an unpicklable result, a kill of the
trainer, grandchildren in sessions of their own — each costs one sample (a counted reason), the
pool lives on, and no process of the run is left when it ends or is killed."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from stratarl.reward.process_pool import ScoringPool
from stratarl.reward.worker_isolation import pid_namespace_problem
from tests.reward.faulty_scorers import TOKEN_VARIABLE, hostile

needs_namespace = pytest.mark.skipif(
    pid_namespace_problem() is not None, reason=f"no PID namespace for workers: {pid_namespace_problem()}"
)


def score(pool, solution, deadline_s=20.0):
    """One sample's outcome; a pool whose dispatcher hangs fails here instead of hanging the test.
    The scorers sleep 60 s: an outcome within `deadline_s` comes from the pool's own deadline."""
    return pool.submit("hostile", solution, "ok").result(timeout=deadline_s)


@pytest.fixture
def pool():
    with ScoringPool(hostile, num_workers=2, timeout_s=3.0) as scoring_pool:
        yield scoring_pool


def test_half_a_message_times_out_at_the_deadline_and_others_keep_theirs(pool):
    half, slow = score(pool, "half_message"), pool.submit("hostile", "half_message_then_return", "ok")
    slow = slow.result(timeout=20)
    assert half.reason == "timeout" and "unfinished message" in half.message
    assert slow.reason == "timeout"  # its real result sat behind the false header: not read as a score
    assert score(pool, "ok").score == 1.0  # replaced workers score again
    assert pool.restarts == 2 and pool.broken is None


@pytest.mark.parametrize("attack", ["garbage_header", "close_socket"])
def test_a_worker_that_breaks_its_socket_is_replaced(pool, attack):
    outcome = score(pool, attack)
    assert outcome.reason == "worker_broken" and outcome.score == 0.0
    assert score(pool, "ok").score == 1.0 and pool.broken is None


def test_a_result_the_trainer_cannot_unpickle_fails_that_sample_only(pool):
    outcomes = [score(pool, "return_unpicklable_error") for _ in range(4)]
    assert [o.reason for o in outcomes] == ["bad_return"] * 4
    assert "cannot be unpickled in the trainer" in outcomes[0].message
    raised = score(pool, "raise_unpicklable_error")
    assert (raised.reason, raised.message) == ("NeedsTwoArguments", "1/2")
    assert [score(pool, "ok").score for _ in range(4)] == [1.0] * 4
    assert pool.broken is None and pool.restarts == 0  # the workers themselves were fine


TRAINER = """
import os, sys, time
from stratarl.reward.process_pool import ScoringPool
from tests.reward.faulty_scorers import hostile
with ScoringPool(hostile, num_workers=1, timeout_s={timeout}) as pool:
    outcomes = [pool.submit("hostile", s, "ok").result() for s in sys.argv[1:]]
    print("outcomes", [(o.score, o.reason) for o in outcomes], flush=True)
"""


def start_trainer(token: str, *solutions: str, timeout: float = 30.0) -> subprocess.Popen:
    env = {**os.environ, TOKEN_VARIABLE: token}
    script = textwrap.dedent(TRAINER).format(timeout=timeout)
    command = [sys.executable, "-c", script, *solutions]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True, cwd=os.getcwd())


def processes_with(token: str) -> list[int]:
    """Live (not zombie) processes whose environment holds `token`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if token.encode() not in f.read():
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry))
        except OSError:
            continue
    return found


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@needs_namespace
def test_user_code_cannot_kill_the_trainer():
    trainer = start_trainer(uuid.uuid4().hex, "kill_parent", "ok")
    out, _ = trainer.communicate(timeout=60)
    assert trainer.returncode == 0, f"the trainer ended with {trainer.returncode}"
    assert "outcomes [(0.5, None), (1.0, None)]" in out


@needs_namespace
def test_no_process_outlives_a_trainer_killed_mid_reward():
    token = uuid.uuid4().hex
    trainer = start_trainer(token, "setsid_child_and_hang")
    # the trainer, its worker (bwrap and python) and the scorer's setsid grandchild
    assert wait_until(lambda: len(processes_with(token)) >= 4, 30), processes_with(token)
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    assert wait_until(lambda: not processes_with(token), 10), f"left running: {processes_with(token)}"


@needs_namespace
def test_no_grandchild_outlives_the_pool():
    token = uuid.uuid4().hex
    trainer = start_trainer(token, "setsid_child", "setsid_child")
    out, _ = trainer.communicate(timeout=60)
    assert "outcomes [(0.25, None), (0.25, None)]" in out
    assert wait_until(lambda: not processes_with(token), 10), f"left running: {processes_with(token)}"


def test_workers_die_with_the_trainer_without_a_namespace_too():
    """Where bubblewrap cannot run, the worker's parent-death signal still ends it with the trainer."""
    token = uuid.uuid4().hex
    env = {**os.environ, TOKEN_VARIABLE: token, "PATH": "/nonexistent"}
    script = textwrap.dedent(TRAINER).format(timeout=30)
    command = [sys.executable, "-c", script, "sleep_forever"]
    trainer = subprocess.Popen(command, env=env, stdout=subprocess.PIPE)
    try:
        assert wait_until(lambda: len(processes_with(token)) >= 2, 30), processes_with(token)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    assert wait_until(lambda: not processes_with(token), 10), f"left running: {processes_with(token)}"
