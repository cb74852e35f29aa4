"""The TransferQueue data path in one process: shards read what the direct dispatch sends, outputs land
under the right keys, only what the controller changed is written again."""

import numpy as np
import pytest
import torch

from stratarl.cluster.dispatch import gather_from_ranks, split_for_ranks, split_for_update
from stratarl.cluster.queue_rows import KEY, QueueRows
from stratarl.cluster.queue_shard import WIRE_DTYPES, narrow_integers, run_on_queue, widen_integers
from stratarl.cluster.ranks import InProcessRanks
from stratarl.transport.data_proto import DataProto
from stratarl.transport.kv_meta import QUEUED_FIELDS, KVBatchMeta
from stratarl.transport.transfer_queue import TransferQueue
from tests.cluster.test_dispatch import batch


def stored_rows(rows: QueueRows, batch: DataProto) -> None:
    """Put every tensor column of `batch` as if workers had produced it, keyed like a rollout."""
    keys = rows.new_keys(len(batch))
    meta = rows.queue.put(batch.select(batch.tensor_keys, meta_keys=[]), rows.partition, keys=keys)
    rows.remember(keys, batch)
    batch.non_tensor_batch[KEY] = np.array(keys, dtype=object)
    assert len(meta) == len(batch)


def assert_same(a: DataProto, b: DataProto, columns) -> None:
    for name in columns:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize(("n", "ranks"), [(8, 2), (7, 2), (7, 3), (1, 2)])
def test_scoring_shards_read_exactly_what_the_direct_split_sends(n, ranks):
    rows, rows_batch = QueueRows(TransferQueue.in_process(3)), batch(n)
    stored_rows(rows, rows_batch)
    meta = rows.sync(rows_batch, ["attention_mask", "row"])
    shards, _ = rows.scoring_shards(meta, rows_batch["attention_mask"], ranks)
    direct = split_for_ranks(rows_batch, ranks)
    for shard, expected in zip(shards, direct.shards, strict=True):
        assert_same(shard.read(), expected, ["attention_mask", "row"])
    assert sum(len(s.pad) for s in shards) == direct.pad  # pad rows are marked, not stored twice


@pytest.mark.parametrize(("n", "ranks", "mini"), [(8, 2, 4), (6, 4, 3), (6, 2, 6)])
def test_update_shards_read_exactly_what_the_direct_split_sends_with_zero_weight_pads(n, ranks, mini):
    rows, rows_batch = QueueRows(TransferQueue.in_process(2)), batch(n)
    stored_rows(rows, rows_batch)
    columns = ["attention_mask", "response_mask", "row"]
    meta = rows.sync(rows_batch, columns)
    shards, split = rows.update_shards(meta, rows_batch["attention_mask"], ranks, mini)
    direct = split_for_update(rows_batch.select(columns), ranks, mini)
    assert split.local_mini_batch_size == direct.local_mini_batch_size
    for shard, expected in zip(shards, direct.shards, strict=True):
        assert_same(shard.read(), expected, columns)  # incl. the zeroed response_mask of pad rows
    assert split.pad_rows == direct.pad_rows


class Rank:
    """A rank whose 'model' writes 10 × tokens + row id (real computation, deterministic)."""

    def compute(self, shard_batch: DataProto) -> DataProto:
        return DataProto.from_dict({"out": shard_batch["attention_mask"].sum(-1) * 10 + shard_batch["row"]})


def test_ranks_write_their_outputs_under_the_rows_keys_and_the_gather_matches():
    rows, rows_batch = QueueRows(TransferQueue.in_process(2)), batch(7)
    stored_rows(rows, rows_batch)
    meta = rows.sync(rows_batch, ["attention_mask", "row"])
    shards, split = rows.scoring_shards(meta, rows_batch["attention_mask"], 3)  # 7 rows -> 2 pad rows
    gathered = gather_from_ranks([run_on_queue(Rank(), s, Rank.compute) for s in shards], split)
    expected = rows_batch["attention_mask"].sum(-1) * 10 + torch.arange(7)
    assert torch.equal(gathered["out"], expected)
    stored = rows.queue.get(meta.select_fields([]).with_fields({}), fields=["out"])
    assert torch.equal(stored["out"], expected)  # every real row written once, by its own shard


def test_sync_writes_only_columns_the_controller_changed():
    queue = TransferQueue.in_process(2)
    rows, rows_batch = QueueRows(queue), batch(6)
    stored_rows(rows, rows_batch)
    before = queue.stored_bytes()
    rows.sync(rows_batch, ["attention_mask", "response_mask", "row"])
    assert queue.stored_bytes() == before  # all known to be stored: nothing written
    mask = rows_batch["response_mask"].clone()
    mask[2, 0] = 0  # e.g. a rejection step edits one row's mask on the controller
    edited = rows_batch.select([c for c in rows_batch.columns if c != "response_mask"]).union(
        DataProto.from_dict({"response_mask": mask})
    )
    meta = rows.sync(edited, ["response_mask"])
    assert torch.equal(queue.get(meta)["response_mask"], mask)  # the rank will read the edit
    advantages = torch.randn(6, 4)  # a column recomputed on the controller: every row rewritten
    others = [c for c in edited.columns if c != "advantages"]
    with_adv = edited.select(others).union(DataProto.from_dict({"advantages": advantages}))
    meta = rows.sync(with_adv, ["advantages"])
    assert torch.equal(queue.get(meta)["advantages"], advantages)


def test_bulk_columns_are_referenced_not_held_and_unknown_fields_are_named():
    rows, rows_batch = QueueRows(TransferQueue.in_process(2)), batch(4)
    stored_rows(rows, rows_batch)
    light = rows_batch.select([c for c in rows_batch.columns if c != "input_ids"])
    light.meta_info[QUEUED_FIELDS] = {"input_ids": rows.sync(rows_batch, ["input_ids"]).fields["input_ids"]}
    meta = rows.sync(light, ["input_ids", "attention_mask"])
    assert torch.equal(rows.queue.get(meta)["input_ids"], rows_batch["input_ids"])
    with pytest.raises(KeyError, match="'values' is neither in the batch nor in the TransferQueue"):
        rows.sync(light, ["values"])
    full = rows.materialize(light)  # what a checkpoint saves: every column again, detached from the queue
    assert torch.equal(full["input_ids"], rows_batch["input_ids"]) and QUEUED_FIELDS not in full.meta_info
    assert KEY not in full  # a resumed run's new queue gives the rows new keys


def test_clear_drops_the_partition_and_forgets_the_digests():
    rows, rows_batch = QueueRows(TransferQueue.in_process(2)), batch(5)
    stored_rows(rows, rows_batch)
    assert rows.clear() == 5
    assert rows.queue.stored_bytes() == 0
    meta = rows.sync(rows_batch, ["row"])  # written again: nothing is assumed stored any more
    assert torch.equal(rows.queue.get(meta)["row"], torch.arange(5))


def test_a_step_clears_its_own_collection_and_those_before_it_never_a_batch_collected_ahead():
    # one_step_off/async: the producer writes step 3's rows while step 2 trains; step 1's batch was
    # dropped as stale, and the controller laid out rows of its own (unlabelled) while training
    rows = QueueRows(TransferQueue.in_process(2))
    collected = {}
    for step in (1, 2, 3):
        with rows.collecting(step):
            collected[step] = batch(4)
            stored_rows(rows, collected[step])
    own = batch(2)
    stored_rows(rows, own)  # outside any collection: the step being trained
    assert rows.rows_held == 14
    assert rows.clear(through=2) == 10  # steps 1 and 2 and the unlabelled rows
    assert rows.rows_held == 4
    ahead = rows.sync(collected[3], ["row"])  # step 3's rows are all still there, unchanged
    assert torch.equal(rows.queue.get(ahead)["row"], torch.arange(4))
    gone = KVBatchMeta(rows.partition, rows.keys_of(collected[2]), {})
    with pytest.raises(KeyError, match="not in partition"):  # step 2's are gone
        rows.queue.get(gone, fields=["row"])
    assert rows.clear(through=3) == 4 and rows.rows_held == 0 and rows.queue.stored_bytes() == 0


def test_integer_columns_cross_the_wire_narrowed_and_come_back_exact():
    columns = {
        "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 0]]),
        "responses": torch.tensor([[5, 31_999, 0], [2, 3, 4]]),
        "big": torch.tensor([[2**40], [-(2**40)]]),
        "old_log_probs": torch.tensor([[-0.5], [-1.5]]),
    }
    wire = narrow_integers(DataProto.from_dict(columns))
    assert wire["attention_mask"].dtype == torch.bool and wire["responses"].dtype == torch.int32
    assert wire["big"].dtype == torch.int64  # does not fit int32: sent as it is
    back = widen_integers(wire)
    for name, values in columns.items():
        assert back[name].dtype == values.dtype and torch.equal(back[name], values), name
    assert WIRE_DTYPES not in back.meta_info


def test_a_scoring_phase_through_the_queue_with_in_process_ranks():
    rows, rows_batch = QueueRows(TransferQueue.in_process(2)), batch(5)
    stored_rows(rows, rows_batch)
    ranks = InProcessRanks("actor", [Rank(), Rank()])
    out = rows.score(ranks, "actor.log_prob", Rank.compute, rows_batch, ["attention_mask", "row"])
    assert torch.equal(out["out"], rows_batch["attention_mask"].sum(-1) * 10 + torch.arange(5))
    before = rows.queue.stored_bytes()
    rows.sync(rows_batch.union(out), ["out"])
    assert rows.queue.stored_bytes() == before  # the ranks' outputs are known to be stored already
