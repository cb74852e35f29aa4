"""The off-policy modes on Ray with the split placement: the rollout replica generates the next batch
while the training ranks update (overlap > 0), one_step_off is exactly one version stale after step
1, and async keeps its bound while pushing every k steps — with batches through the controller and
through the TransferQueue, whose end-of-step clear keeps the batches collected ahead — also into a
generate call in flight (partial_rollout=continue)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("ray")

from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer
from tests.trainer.test_ray_trainer import ray_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def train_on_ray(task, run_dir, mode, *extra, queue_units=0):
    os.environ.pop("RAY_ADDRESS", None)
    overrides = [f"trainer.mode={mode}", f"cluster.transfer_queue_units={queue_units}", *extra]
    RLTrainer(ray_config(task, run_dir, "split", total_steps=4, extra=overrides), run_dir).fit()
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]


@pytest.mark.parametrize("queue_units", [0, 2], ids=["dataproto", "transfer_queue"])
def test_one_step_off_overlaps_generation_with_the_update_on_split_ray(task, tmp_path, queue_units):
    train = train_on_ray(task, tmp_path / "run", "one_step_off", queue_units=queue_units)
    assert [r["async/staleness_max"] for r in train] == [0.0, 1.0, 1.0, 1.0]
    assert [r["async/staleness_min"] for r in train] == [0.0, 1.0, 1.0, 1.0]
    assert [r["rollout/weight_version"] for r in train] == [1.0, 2.0, 3.0, 4.0]  # pushed to the replica
    # steps 1-3 start the next batch on the replica before their own update: both sides were busy
    assert all(r["async/overlap_s"] > 0 for r in train[:3]), [r["async/overlap_s"] for r in train]
    assert train[-1]["async/rollout_busy_s"] == 0.0  # the last step collects nothing ahead
    if queue_units:  # after each clear the queue holds the next batch's 8 × 2 rows, and nothing more
        assert [r["controller/queue_rows_held"] for r in train] == [16.0, 16.0, 16.0, 0.0]


def test_async_on_split_ray_keeps_its_bound_through_the_transfer_queue(task, tmp_path):
    extra = ["async_training.max_staleness=1", "async_training.weight_sync_interval=2"]
    train = train_on_ray(task, tmp_path / "run", "async", *extra, queue_units=2)
    assert all(r["async/staleness_max"] <= 1 for r in train)
    held = [r["controller/queue_rows_held"] for r in train]
    assert all(h % 16 == 0 and h <= 3 * 16 for h in held), held  # whole batches: 2 buffered, 1 in flight
    assert [r["step"] for r in train if "rollout/weight_version" in r] == [2, 4]  # and save_freq=2's


def test_async_continue_on_split_ray_pushes_into_the_generate_call_in_flight(task, tmp_path):
    """partial_rollout=continue: the replica takes the push on another thread while its generate call
    runs (a one-call-at-a-time replica would finish the batch first: no partial rows)."""
    # When the push arrives the replica must be inside a generate call. With max_staleness=1 it rarely
    # is: the staleness bound holds the producer until the push, so calls start after one (an EPYC,
    # 2026-12-04: 0 partial rows in 6 steps, CI red). With buffer_batches=1 and
    # max_staleness=2 the producer is held by the full buffer instead, starts the next batch when the
    # trainer takes one, and is still generating it (8 calls × 96 tokens, 0.8 s) when the update
    # (0.45 s) pushes: partial rows on 4 of 6 steps there.
    extra = [
        "async_training.partial_rollout=continue",
        "async_training.max_staleness=2",
        "async_training.buffer_batches=1",
        "rollout.max_response_tokens=96",
        "rollout.ignore_eos=true",
        "rollout.trajectories_per_generate_batch=2",
        "trainer.total_steps=6",
    ]
    train = train_on_ray(task, tmp_path / "run", "async", *extra)
    assert all(r["async/staleness_max"] <= 2 for r in train)
    assert all(r["async/token_staleness_max"] <= r["async/staleness_max"] for r in train)
    assert sum(r["async/partial_rows"] for r in train) > 0, [r["async/partial_rows"] for r in train]
