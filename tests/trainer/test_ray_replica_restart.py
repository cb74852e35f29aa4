"""A rollout replica SIGKILLed mid-generate on Ray (split placement, two replicas) is started again
(rollout.max_replica_restarts): the run finishes with the metrics of an uninterrupted run of the same
seed, and the restart is counted in the metrics and recorded in run.json with its step and cause."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time

import pytest

pytest.importorskip("ray")

import ray

from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer
from tests.trainer.test_ray_trainer import ray_config

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.long]
# What a step computes from its tokens (timings, bytes, memory and MFU differ between any two runs).
FROM_TOKENS = (
    "actor/",
    "critic/",
    "reward/",
    "response_length/",
    "prompt_length/",
    "response/",
    "rollout_corr/",
    "rollout/weight_version",
    "rollout/staleness",
    "perf/total_num_tokens",
    "batch/",
)


def config(task, run_dir):
    return ray_config(
        task,
        run_dir,
        "split",
        total_steps=3,
        extra=(
            "trainer.save_freq=0",
            "trainer.test_freq=0",
            "rollout.max_response_tokens=16",
            "cluster.rollout_replicas=2",
            "cluster.cpus_per_rollout_replica=0.5",
            "rollout.max_replica_restarts=1",
        ),
    )


def _pid(process) -> int:
    return os.getpid()


def kill_on_generate_call(trainer: RLTrainer, replica: int, nth: int, killed: dict) -> threading.Thread:
    """A thread that SIGKILLs `replica`'s process once its `nth` generate call is in flight."""
    engines = trainer.worker.engines
    pid = ray.get(engines.targets[replica].actor.__ray_call__.remote(_pid))

    def watch() -> None:
        seen: set[float] = set()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            call = dict(engines.last_calls.get(replica) or {})
            if call.get("phase") == "rollout.generate":
                seen.add(call["at"])
                if len(seen) == nth and "answered_after_s" not in call:
                    os.kill(pid, signal.SIGKILL)
                    killed.update(pid=pid, mid_call="answered_after_s" not in engines.last_calls[replica])
                    return
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def train_metrics(run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]


def test_a_replica_killed_mid_generate_is_restarted_and_the_run_gives_the_same_metrics(task, tmp_path):
    os.environ.pop("RAY_ADDRESS", None)
    RLTrainer(config(task, tmp_path / "calm"), tmp_path / "calm").fit()

    run_dir = tmp_path / "killed"
    trainer = RLTrainer(config(task, run_dir), run_dir)
    killed: dict = {}
    watcher = kill_on_generate_call(trainer, replica=1, nth=2, killed=killed)  # step 2's share
    trainer.fit()
    watcher.join(timeout=5)
    assert killed.get("mid_call"), killed  # SIGKILLed while its generate call was in flight

    calm, hit = train_metrics(tmp_path / "calm"), train_metrics(run_dir)
    assert [r["step"] for r in hit] == [1, 2, 3]
    assert [r["rollout/replica_restarts"] for r in hit] == [0.0, 1.0, 0.0]
    assert [r["rollout/replica_restarts_total"] for r in hit] == [0.0, 1.0, 1.0]
    compared = 0
    for before, after in zip(calm, hit, strict=True):
        for key, value in before.items():
            if not key.startswith(FROM_TOKENS) or not isinstance(value, float) or math.isnan(value):
                continue
            # fp32 on both sides, the same kernels: what differs is a prefill the new replica
            # computes afresh where the old one may have reused cached prompt KV
            assert after[key] == pytest.approx(value, rel=1e-4, abs=1e-5), (before["step"], key)
            compared += 1
    assert compared > 120  # 3 steps of rewards, losses, lengths, log-prob gaps, token counts
    for key in ("critic/score/mean", "response_length/mean", "perf/total_num_tokens", "actor/pg_loss"):
        assert key in hit[1]

    (restart,) = json.loads((run_dir / "run.json").read_text())["replica_restarts"]
    assert (restart["step"], restart["replica_id"], restart["cause"], restart["number"]) == (2, 1, "died", 1)
    assert restart["weight_version"] == 1 and restart["why"].startswith("died")
