"""TransferQueue with in-process storage units: put∘get, sharding, status, clear, and controller bytes."""

from __future__ import annotations

import pickle

import pytest
import torch

from stratarl.transport.data_proto import DataProto
from stratarl.transport.kv_meta import KVBatchMeta
from stratarl.transport.transfer_queue import TransferQueue, unit_of


def rollout_batch(n_rows: int, width: int = 6) -> DataProto:
    generator = torch.Generator().manual_seed(n_rows * 1000 + width)
    return DataProto.from_columns(
        {
            "responses": torch.randint(0, 100, (n_rows, width), generator=generator),
            "response_mask": (torch.rand(n_rows, width, generator=generator) > 0.3).long(),
            "rollout_log_probs": -torch.rand(n_rows, width, generator=generator).to(torch.bfloat16),
            "weight_version": torch.full((n_rows,), 7),
            "uid": [f"prompt-{i // 4}" for i in range(n_rows)],
            "reward_model": [{"ground_truth": str(i)} for i in range(n_rows)],
        },
        meta_info={"temperature": 0.9},
    )


def assert_same(got: DataProto, expected: DataProto) -> None:
    assert sorted(got.columns) == sorted(expected.columns)
    for name in expected.tensor_keys:
        assert got[name].dtype == expected[name].dtype and torch.equal(got[name], expected[name]), name
    for name in expected.non_tensor_keys:
        assert list(got[name]) == list(expected[name]), name


def test_put_get_round_trip_with_rows_sharded_over_three_units():
    queue = TransferQueue.in_process(3)
    batch = rollout_batch(30)
    keys = [f"s{i}" for i in range(30)]
    meta = queue.put(batch, "train/step-0", keys=keys)
    assert meta.keys == tuple(keys) and meta.extra_info == {"temperature": 0.9}
    assert meta.fields["rollout_log_probs"].dtype == "bfloat16" and meta.fields["responses"].row_shape == (6,)
    held = [sum(unit_of(k, 3) == u for k in keys) for u in range(3)]
    assert all(count > 0 for count in held), f"crc32 routing should spread 30 keys: {held}"
    assert_same(queue.get(meta), batch)
    perm = [29, 0, 15, 3, 4, 28]
    assert_same(queue.get(meta.select_rows(perm)), batch.take(perm))


def test_get_returns_memory_the_reader_owns():
    queue = TransferQueue.in_process(2)
    batch = rollout_batch(4)
    meta = queue.put(batch, "p")
    first = queue.get(meta, ["responses"])
    first["responses"][:] = -1
    batch["responses"][:] = -2
    assert torch.equal(queue.get(meta, ["responses"])["responses"], rollout_batch(4)["responses"])


def test_put_with_meta_adds_fields_to_the_same_rows():
    queue = TransferQueue.in_process(2)
    meta = queue.put(rollout_batch(8), "train/step-1")
    old = -torch.arange(48, dtype=torch.float32).reshape(8, 6)
    second_half = meta.chunk(2)[1]
    written = queue.put({"old_log_probs": old[4:]}, meta=second_half)
    assert written.field_names[-1] == "old_log_probs" and written.keys == second_half.keys
    assert torch.equal(queue.get(written, ["old_log_probs"])["old_log_probs"], old[4:])
    with pytest.raises(KeyError, match="'old_log_probs' not produced yet"):
        queue.get(meta.select_fields([]), ["old_log_probs"])


def test_put_argument_errors():
    queue = TransferQueue.in_process(2)
    meta = queue.put(rollout_batch(4), "p")
    with pytest.raises(ValueError, match="exactly one"):
        queue.put(rollout_batch(4), "p", meta=meta)
    with pytest.raises(ValueError, match="exactly one"):
        queue.put(rollout_batch(4))
    with pytest.raises(ValueError, match="5 rows with 4 keys"):
        queue.put(rollout_batch(5), meta=meta)
    with pytest.raises(ValueError, match="do not pass `keys`"):
        queue.put(rollout_batch(4), meta=meta, keys=list("abcd"))
    with pytest.raises(ValueError, match="unique"):
        queue.put(rollout_batch(4), "q", keys=["a", "b", "a", "c"])
    assert queue.status("q") == {}, "a refused put stores nothing"


def test_ready_and_status_track_production_and_consumption():
    queue = TransferQueue.in_process(2)
    meta = queue.put(rollout_batch(6), "train/step-2", keys=[f"r{i}" for i in range(6)])
    assert len(queue.ready("train/step-2", ["old_log_probs"])) == 0
    queue.put({"old_log_probs": torch.zeros(3, 6)}, meta=meta.select_rows([1, 3, 5]))
    ready = queue.ready("train/step-2", ["old_log_probs", "responses"], consumer="actor.update")
    assert ready.keys == ("r1", "r3", "r5"), "ready rows come oldest first"
    assert ready.field_names == ["old_log_probs", "responses"]
    queue.get(ready.select_rows([0]), consumer="actor.update")
    assert queue.ready("train/step-2", ["old_log_probs"], consumer="actor.update").keys == ("r3", "r5")
    assert queue.ready("train/step-2", ["old_log_probs"], consumer="actor.update", limit=1).keys == ("r3",)
    status = queue.status("train/step-2")
    assert list(status) == [f"r{i}" for i in range(6)]
    assert "old_log_probs" in status["r1"].fields and "old_log_probs" not in status["r0"].fields
    assert status["r1"].consumed_by == {"actor.update"} and status["r3"].consumed_by == frozenset()


def test_clear_by_meta_or_partition():
    queue = TransferQueue.in_process(3)
    meta = queue.put(rollout_batch(10), "a")
    queue.put(rollout_batch(2), "b")
    assert queue.clear(meta.select_rows([0, 1, 2])) == 3
    assert len(queue.status("a")) == 7
    assert queue.clear("a") == 7 and queue.clear("b") == 2 and queue.stored_bytes() == 0


def test_get_of_an_empty_meta_gives_empty_columns():
    queue = TransferQueue.in_process(2)
    meta = queue.put(rollout_batch(4), "p").select_rows([])
    empty = queue.get(meta)
    assert len(empty) == 0 and empty["responses"].shape == (0, 6) and empty["uid"].shape == (0,)
    assert empty["rollout_log_probs"].dtype == torch.bfloat16


def test_keys_default_to_unique_ones_across_puts():
    queue = TransferQueue.in_process(2)
    first, second = queue.put(rollout_batch(3), "p"), queue.put(rollout_batch(3), "p")
    assert len(set(first.keys) | set(second.keys)) == 6
    assert_same(queue.get(KVBatchMeta.concat([first, second])), DataProto.concat([rollout_batch(3)] * 2))


def test_the_controller_handles_o_rows_bytes_independent_of_the_response_length():
    """Writer puts, hands the meta to the controller, which hands it to the reader: what crosses the
    controller is the pickled meta, compared here with the pickled DataProto it replaces."""

    def controller_bytes(n_rows: int, width: int) -> tuple[int, int]:
        queue = TransferQueue.in_process(2)
        batch = DataProto.from_columns({"old_log_probs": torch.randn(n_rows, width)})
        meta = queue.put(batch, "train/step-3", keys=[f"step-3/{i}" for i in range(n_rows)])
        meta_bytes = len(pickle.dumps(meta))
        got = queue.get(pickle.loads(pickle.dumps(meta)))
        assert torch.equal(got["old_log_probs"], batch["old_log_probs"])
        return meta_bytes, len(pickle.dumps(batch))

    meta_long, data_long = controller_bytes(256, 1024)
    meta_short, _ = controller_bytes(256, 16)
    meta_half, _ = controller_bytes(128, 1024)
    assert data_long > 256 * 1024 * 4, "the batch itself is at least its float32 payload"
    assert meta_long < 256 * 24 + 512 and meta_long < data_long / 100
    assert abs(meta_long - meta_short) < 8
    assert 1.7 < meta_long / meta_half < 2.2
