"""The Ray TransferQueue backend on a real local cluster: sharding, cross-worker reads, controller bytes."""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from stratarl.cluster.transfer_queue_ray import RayStorageUnits, ray_transfer_queue  # noqa: E402
from stratarl.transport.data_proto import DataProto  # noqa: E402
from stratarl.transport.kv_meta import KVBatchMeta  # noqa: E402
from stratarl.transport.transfer_queue import TransferQueue  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    os.environ.pop("RAY_ADDRESS", None)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    temp_dir = tempfile.mkdtemp(
        prefix="srl-tq-", dir="/tmp"
    )  # short: Ray's socket paths must stay < 108 chars
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=temp_dir,
        object_store_memory=256 * 1024**2,
        log_to_driver=False,
    )
    yield
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def queue(cluster):
    queue = ray_transfer_queue(num_units=2)
    yield queue
    queue.units.shutdown()


def fake_log_probs(responses: torch.Tensor) -> torch.Tensor:
    """A deterministic stand-in for an actor forward: the reader recomputes it to check the transfer."""
    return -(responses % 97).float() / 97.0


@ray.remote(num_cpus=0)
class Worker:
    """A worker that reads its inputs from and writes its outputs to the queue; returns only metas."""

    def __init__(self, queue: TransferQueue):
        self.queue = queue

    def rollout(self, partition: str, n_rows: int, response_length: int) -> KVBatchMeta:
        responses = torch.arange(n_rows * response_length).reshape(n_rows, response_length)
        batch = DataProto.from_columns(
            {
                "responses": responses,
                "response_mask": torch.ones(n_rows, response_length, dtype=torch.int64),
                "uid": [f"p{i // 4}" for i in range(n_rows)],
            },
            meta_info={"temperature": 1.0},
        )
        return self.queue.put(batch, partition, keys=[f"{partition}/{i}" for i in range(n_rows)])

    def log_prob(self, meta: KVBatchMeta) -> KVBatchMeta:
        batch = self.queue.get(meta, ["responses"])
        return self.queue.put({"old_log_probs": fake_log_probs(batch["responses"])}, meta=meta)

    def check_update_inputs(self, meta: KVBatchMeta) -> tuple[float, list[str]]:
        batch = self.queue.get(meta, ["responses", "old_log_probs", "uid"], consumer="actor.update")
        error = (batch["old_log_probs"] - fake_log_probs(batch["responses"])).abs().max().item()
        return error, list(batch["uid"])


def rows_per_unit(queue: TransferQueue, partition: str) -> list[int]:
    statuses = queue.units.collect(
        [queue.units.submit(u, "status", partition) for u in range(len(queue.units))]
    )
    return [len(rows) for rows in statuses]


def test_put_get_round_trip_over_two_actor_units_in_row_order(queue):
    n_rows, width = 24, 5
    batch = DataProto.from_columns(
        {
            "responses": torch.arange(n_rows * width).reshape(n_rows, width),
            "old_log_probs": torch.linspace(-3, 0, n_rows * width).reshape(n_rows, width).to(torch.bfloat16),
            "extra_info": [{"index": i, "split": "train"} for i in range(n_rows)],
        }
    )
    meta = queue.put(batch, "rt", keys=[f"r{i}" for i in range(n_rows)])
    assert all(count > 0 for count in rows_per_unit(queue, "rt")), "rows should be sharded over both units"
    assert sum(rows_per_unit(queue, "rt")) == n_rows

    reversed_meta = meta.select_rows(list(range(n_rows))[::-1])
    back = queue.get(reversed_meta)
    expected = batch.reorder(list(range(n_rows))[::-1])
    assert torch.equal(back["responses"], expected["responses"])
    assert back["old_log_probs"].dtype == torch.bfloat16
    assert torch.equal(back["old_log_probs"], expected["old_log_probs"])
    assert [x["index"] for x in back["extra_info"]] == list(range(n_rows))[::-1]
    back["responses"][0, 0] = -1  # a writable copy, not a view of Ray's read-only store
    assert queue.clear("rt") == n_rows and sum(rows_per_unit(queue, "rt")) == 0


def test_storage_unit_processes_do_not_import_torch(queue):
    loaded = ray.get(
        queue.units.actors[0].__ray_call__.remote(lambda self: "torch" in __import__("sys").modules)
    )
    assert loaded is False


def test_worker_reads_what_another_wrote_and_controller_sees_only_metadata(queue):
    """Moving old_log_probs of a step-sized batch (256 × 1024) between two workers through the
    queue: the driver sends and receives metas only, O(rows) bytes independent of the length."""
    writer, reader = Worker.remote(queue), Worker.remote(queue)

    def step(partition: str, n_rows: int, width: int) -> tuple[int, float, list[str]]:
        controller_bytes = 0
        meta = ray.get(writer.rollout.remote(partition, n_rows, width))
        controller_bytes += len(pickle.dumps(meta))  # received
        controller_bytes += len(pickle.dumps(meta))  # sent to log_prob
        meta = ray.get(writer.log_prob.remote(meta))
        controller_bytes += 2 * len(pickle.dumps(meta))  # received, then sent to the reader
        error, uids = ray.get(reader.check_update_inputs.remote(meta))  # the test's probe, not counted
        return controller_bytes, error, uids

    big_bytes, error, uids = step("train/step-1", 256, 1024)
    assert error == 0.0
    assert uids == [f"p{i // 4}" for i in range(256)]
    short_bytes, _, _ = step("train/step-2", 256, 16)
    half_bytes, _, _ = step("train/step-3", 128, 1024)

    payload = 256 * 1024 * 4  # the old_log_probs tensor alone: 1 MiB of float32
    assert big_bytes < 4 * (100 * 256 + 2048), "four meta transfers of at most ~100 bytes per row"
    assert big_bytes < payload / 20
    assert abs(big_bytes - short_bytes) < 64, "controller bytes must not grow with the response length"
    assert 1.7 < big_bytes / half_bytes < 2.3, "controller bytes grow linearly with the rows"
    assert queue.ready("train/step-1", ["old_log_probs"], consumer="actor.update").keys == ()
    assert len(queue.ready("train/step-1", ["old_log_probs"])) == 256
    for partition in ("train/step-1", "train/step-2", "train/step-3"):
        queue.clear(partition)
    assert queue.stored_bytes() == 0


def test_ray_units_pickle_as_handles_only(queue):
    assert len(pickle.dumps(queue)) < 4096
    assert isinstance(pickle.loads(pickle.dumps(queue)).units, RayStorageUnits)


def test_same_rows_round_trip_identically_on_both_backends(queue):
    rng = np.random.default_rng(0)
    batch = DataProto.from_columns(
        {
            "values": torch.from_numpy(rng.normal(size=(10, 3)).astype(np.float32)),
            "uid": [str(i) for i in range(10)],
        }
    )
    keys = [f"b{i}" for i in range(10)]
    local = TransferQueue.in_process(3)
    got_local = local.get(local.put(batch, "x", keys=keys).select_rows([3, 1, 4]))
    got_ray = queue.get(queue.put(batch, "x", keys=keys).select_rows([3, 1, 4]))
    assert torch.equal(got_local["values"], got_ray["values"])
    assert list(got_local["uid"]) == list(got_ray["uid"]) == ["3", "1", "4"]
    queue.clear("x")
