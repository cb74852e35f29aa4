"""Dispatch on simulated ranks: split∘gather keeps row order, padding is visible, shares are balanced."""

import dataclasses
import pickle

import pytest
import torch

from stratarl.cluster.dispatch import (
    DirectDispatch,
    gather_from_ranks,
    pad_with_zero_weight_rows,
    split_for_ranks,
    split_for_update,
)
from stratarl.cluster.ranks import InProcessRanks
from stratarl.engine.requests import UpdateRequest
from stratarl.transport.data_proto import DataProto
from tests.engine.tiny_batches import batch_with_lengths


def batch(n: int) -> DataProto:
    """n rows whose total lengths (attention_mask sums) are 3 + (i mod 5) + ..., and a row id."""
    prompts = [2 + (i * 3) % 5 for i in range(n)]
    responses = [1 + (i * 2) % 4 for i in range(n)]
    rows = batch_with_lengths(prompts, responses, 6, 4, generator=torch.Generator().manual_seed(n))
    return rows.union(DataProto.from_dict({"row": torch.arange(n)}, {"uid": [f"u{i}" for i in range(n)]}))


def simulated_rank(shard: DataProto) -> DataProto:
    """A per-row computation a rank might do: the row's token count, times 10, plus its id."""
    return DataProto.from_dict({"out": shard["attention_mask"].sum(-1) * 10 + shard["row"]})


@pytest.mark.parametrize(("n", "ranks"), [(8, 2), (7, 2), (7, 3), (1, 2), (5, 8)])
def test_split_then_gather_returns_every_row_once_in_order(n, ranks):
    rows = batch(n)
    split = split_for_ranks(rows, ranks)
    assert len(split.shards) == ranks and len({len(s) for s in split.shards}) == 1  # equal shares
    assert split.pad == -n % ranks
    gathered = gather_from_ranks([simulated_rank(s) for s in split.shards], split)
    expected = rows["attention_mask"].sum(-1) * 10 + torch.arange(n)
    assert torch.equal(gathered["out"], expected)


def test_padding_is_copies_of_the_leading_rows_and_is_dropped_on_gather():
    split = split_for_ranks(batch(5), 4, balance=False)  # 5 rows -> 8: rows 0, 1, 2 appended again
    assert split.pad == 3 and split.order == list(range(8))
    assert torch.cat([s["row"] for s in split.shards]).tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert list(split.shards[3].non_tensor_batch["uid"]) == ["u1", "u2"]


def test_shares_are_balanced_by_tokens():
    # lengths 10, 9, 2, 1 over 2 ranks: consecutive halves would be 19 vs 3; balanced 11 vs 11
    rows = batch_with_lengths([6, 5, 1, 1], [4, 4, 1, 0], 6, 4, generator=torch.Generator().manual_seed(0))
    split = split_for_ranks(rows, 2)
    assert [int(s["attention_mask"].sum()) for s in split.shards] == [11, 11]
    unbalanced = split_for_ranks(rows, 2, balance=False)
    assert [int(s["attention_mask"].sum()) for s in unbalanced.shards] == [19, 3]


def test_gather_rejects_a_rank_that_lost_rows():
    split = split_for_ranks(batch(6), 2)
    outputs = [simulated_rank(s) for s in split.shards]
    with pytest.raises(ValueError, match="rank 1 returned 2 rows for a shard of 3"):
        gather_from_ranks([outputs[0], outputs[1][:2]], split)


def test_each_rank_takes_its_share_of_every_global_mini_batch():
    rows = batch(8)
    split = split_for_update(rows, 2, mini_batch_size=4)
    assert split.local_mini_batch_size == 2 and split.pad_rows == 0
    for rank, shard in enumerate(split.shards):
        locals_ = [m["row"].tolist() for m in shard.make_iterator(split.local_mini_batch_size)]
        assert set(locals_[0]) <= {0, 1, 2, 3} and set(locals_[1]) <= {4, 5, 6, 7}, (rank, locals_)
    union = sorted(torch.cat([s["row"] for s in split.shards]).tolist())
    assert union == list(range(8))


def test_one_rank_update_share_is_the_batch_itself():
    rows = batch(6)
    (shard,) = split_for_update(rows, 1, mini_batch_size=3).shards
    assert torch.equal(shard["row"], rows["row"]) and torch.equal(shard["input_ids"], rows["input_ids"])


def test_uneven_mini_batches_get_zero_weight_rows():
    rows = batch(6)
    split = split_for_update(rows, 4, mini_batch_size=3)  # each mini-batch of 3 padded to 4
    assert split.pad_rows == 2 and split.local_mini_batch_size == 1
    every = DataProto.concat(split.shards)
    weighted = every["response_mask"].sum(-1) > 0
    assert sorted(every["row"][weighted].tolist()) == list(range(6))  # each real row once, with its mask
    assert int((~weighted).sum()) == 2
    assert int(every["response_mask"].sum()) == int(rows["response_mask"].sum())


def test_zero_weight_padding_leaves_the_real_rows_untouched():
    rows = batch(3)
    padded, pad = pad_with_zero_weight_rows(rows, 2)
    assert pad == 1 and torch.equal(padded["response_mask"][:3], rows["response_mask"])
    assert padded["response_mask"][3].sum() == 0 and torch.equal(padded["input_ids"][3], rows["input_ids"][0])
    same, none = pad_with_zero_weight_rows(rows, 3)
    assert none == 0 and same is rows


def test_update_needs_whole_mini_batches():
    with pytest.raises(ValueError, match="7 rows do not split into mini-batches of 4"):
        split_for_update(batch(7), 2, mini_batch_size=4)


class RecordingRank:
    """A worker whose update keeps the request it received, pickled the way a Ray rank receives it."""

    def update(self, shard: DataProto, loss_fn, request: UpdateRequest) -> dict[str, float]:
        self.request = pickle.loads(pickle.dumps(request))
        return {"rows": float(len(shard))}


def test_every_rank_receives_the_update_request_with_its_local_mini_batch_size():
    workers = [RecordingRank(), RecordingRank()]
    request = UpdateRequest(mini_batch_size=4, epochs=2, shuffle_seed=7, with_entropy=True)
    ranks = InProcessRanks("actor", workers)
    metrics, split = DirectDispatch().update(
        ranks, "actor.update", RecordingRank.update, batch(8), None, request
    )
    local = dataclasses.replace(request, mini_batch_size=2)  # 4 rows a mini-batch over 2 ranks
    assert [w.request for w in workers] == [local, local] and metrics == [{"rows": 4.0}] * 2
    assert request.mini_batch_size == 4 and split.local_mini_batch_size == 2  # the caller's is unchanged
