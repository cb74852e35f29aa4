"""The watchdog: deadlines from settings and measured runs, a stuck main thread interrupted with every
thread's stack dumped, and a hard exit when the thread cannot be interrupted."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from stratarl.observe.watchdog import INTERRUPT_SIGNAL, DeadlinePolicy, Watchdog, WatchdogTimeout


def test_deadlines_fixed_initial_then_scaled_with_a_floor():
    policy = DeadlinePolicy(fixed={"reward": 5}, initial_s=100, warmup_runs=2, scale=10, floor_s=30)
    assert policy.deadline("reward")[0] == 5
    assert policy.deadline("gen")[0] == 100
    policy.record("gen", 1.0)
    assert policy.deadline("gen")[0] == 100  # one measured run of two
    policy.record("gen", 7.0)
    policy.record("gen", 99.0)  # after the warm-up: not measured any more
    assert policy.deadline("gen") == (70.0, pytest.approx(policy.deadline("gen")[1]))
    policy.record("adv", 0.1)
    policy.record("adv", 0.2)
    assert policy.deadline("adv")[0] == 30  # the floor


def sleeper():
    time.sleep(30)


def test_a_sleeping_phase_is_interrupted_with_every_stack_dumped(tmp_path):
    dog = Watchdog(tmp_path, DeadlinePolicy(fixed={"reward": 0.5}), poll_s=0.05, exit_process=pytest.fail)
    dog.add_dumper("ranks", lambda folder, header: ["actor rank 0 (last call x, no answer yet): pid 1"])
    dog.start()
    start = time.monotonic()
    try:
        expected = r"phase 'reward' \(role controller, step 3\)"
        step, reward = dog.phase("step", step=3), dog.phase("reward", step=3, rows=8)
        with pytest.raises(WatchdogTimeout, match=expected) as error, step, reward:
            sleeper()
    finally:
        dog.stop()
    assert time.monotonic() - start < 10  # not the 30 s sleep
    assert "waiting on actor rank 0" in str(error.value)
    (folder,) = (tmp_path / "hang").iterdir()
    report = json.loads((folder / "report.json").read_text())
    assert report["expired"]["phase"] == "reward" and report["expired"]["rows"] == 8
    assert [p["phase"] for p in report["active_phases"]] == ["step", "reward"]
    stacks = next(folder.glob("stacks-controller-*.txt")).read_text()
    assert "in sleeper" in stacks and "test_watchdog.py" in stacks
    assert signal.getsignal(INTERRUPT_SIGNAL) is not dog._raise_timeout  # handler restored


def test_a_phase_within_its_deadline_is_measured_not_interrupted(tmp_path):
    dog = Watchdog(tmp_path, DeadlinePolicy(initial_s=5, warmup_runs=1), poll_s=0.01)
    dog.start()
    with dog.phase("gen"):
        time.sleep(0.05)
    dog.stop()
    assert dog.fired is None and dog.policy.measured["gen"][0] >= 0.05
    assert not (tmp_path / "hang").exists()


def test_a_thread_that_cannot_be_interrupted_ends_the_process(tmp_path):
    # The main thread blocks the interrupt signal (as a C call that never returns to Python would):
    # after grace_s the watchdog exits the process itself, with its message.
    script = textwrap.dedent(f"""
        import signal, time
        from stratarl.observe.watchdog import DeadlinePolicy, Watchdog, INTERRUPT_SIGNAL
        dog = Watchdog({str(tmp_path)!r}, DeadlinePolicy(fixed={{"gen": 0.3}}), grace_s=0.5, poll_s=0.05)
        dog.start()
        signal.pthread_sigmask(signal.SIG_BLOCK, [INTERRUPT_SIGNAL])
        with dog.phase("gen", step=1):
            time.sleep(20)
        print("not reached")
    """)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})  # fmt: skip
    assert done.returncode == 70, done.stderr
    assert time.monotonic() - start < 15
    assert "did not stop within 0.5 s" in done.stderr and "not reached" not in done.stdout
    assert list((tmp_path / "hang").glob("*/stacks-controller-*.txt"))
