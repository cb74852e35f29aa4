"""Row operations of DataProto: chunk/split∘concat, repeat, reorder, pad∘unpad, mini-batch iteration."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stratarl.transport.batch_ops import values_equal
from stratarl.transport.data_proto import DataProto


def numbered(n_rows: int, meta: dict | None = None) -> DataProto:
    """Row i holds i everywhere, so every result can be read back as a list of source rows."""
    return DataProto.from_columns(
        {"row": torch.arange(n_rows), "ids": torch.arange(n_rows).repeat_interleave(2).reshape(n_rows, 2),
         "uid": [f"u{i}" for i in range(n_rows)]},
        meta_info=meta or {"step": 1},
    )  # fmt: skip


def rows_of(batch: DataProto) -> list[int]:
    assert batch["ids"][:, 0].tolist() == batch["row"].tolist() == [int(u[1:]) for u in batch["uid"]]
    return batch["row"].tolist()


@pytest.mark.parametrize(("n_rows", "k"), [(8, 4), (10, 4), (3, 5), (0, 2), (7, 1)])
def test_chunk_sizes_follow_array_split_and_concat_restores_the_batch(n_rows, k):
    chunks = numbered(n_rows).chunk(k)
    # plain rule: the first n mod k chunks get one extra row
    expected_sizes = [n_rows // k + (i < n_rows % k) for i in range(k)]
    assert [len(c) for c in chunks] == expected_sizes
    assert all(c.meta_info == {"step": 1} for c in chunks)
    assert rows_of(DataProto.concat(chunks)) == list(range(n_rows))


def test_split_gives_consecutive_pieces_with_the_remainder_last():
    pieces = numbered(7).split(3)
    assert [rows_of(p) for p in pieces] == [[0, 1, 2], [3, 4, 5], [6]]
    assert rows_of(DataProto.concat(pieces)) == list(range(7))


def test_chunks_do_not_share_one_meta_dict():
    first, second = numbered(4).chunk(2)
    first.meta_info["step"] = 99
    assert second.meta_info["step"] == 1


def test_concat_merges_metrics_into_lists_and_refuses_conflicts():
    parts = [
        numbered(2, {"step": 1, "metrics": {"loss": 0.5}}),
        numbered(2, {"step": 1, "metrics": [{"loss": 0.25}]}),
    ]
    merged = DataProto.concat(parts)
    assert merged.meta_info == {"step": 1, "metrics": {"loss": [0.5, 0.25]}}
    with pytest.raises(ValueError, match=r"meta_info\['step'\]"):
        DataProto.concat([numbered(2, {"step": 1}), numbered(2, {"step": 2})])
    with pytest.raises(ValueError, match=r"\['extra'\] are missing"):
        DataProto.concat([numbered(2), numbered(2).union(DataProto.from_columns({"extra": torch.zeros(2)}))])
    wide = numbered(2)
    wide.batch["ids"] = torch.zeros(2, 5, dtype=torch.int64)
    with pytest.raises(ValueError, match="column 'ids'"):
        DataProto.concat([numbered(2), wide])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])


@pytest.mark.parametrize("interleave", [True, False])
def test_repeat_matches_a_plain_loop(interleave):
    n_rows, n = 3, 4
    if interleave:  # [a, a, a, a, b, b, b, b, c, ...]: the n samples of a prompt are adjacent
        expected = [i for i in range(n_rows) for _ in range(n)]
    else:  # [a, b, c, a, b, c, ...]
        expected = [i for _ in range(n) for i in range(n_rows)]
    repeated = numbered(n_rows).repeat(n, interleave=interleave)
    assert rows_of(repeated) == expected and repeated.meta_info == {"step": 1}


def test_repeat_rows_matches_a_plain_loop_and_keeps_meta():
    times = [2, 0, 3, 1]
    expected = [i for i, k in enumerate(times) for _ in range(k)]  # [0, 0, 2, 2, 2, 3]
    for as_type in (list, tuple, np.array, torch.tensor):
        repeated = numbered(4).repeat_rows(as_type(times))
        assert rows_of(repeated) == expected and repeated.meta_info == {"step": 1}


def test_repeat_rows_round_trips():
    batch = numbered(5)
    # all ones is the identity; n everywhere is repeat(n) (interleaved)
    assert rows_of(batch.repeat_rows([1] * 5)) == list(range(5))
    assert rows_of(batch.repeat_rows([3] * 5)) == rows_of(batch.repeat(3))
    # taking the first copy of every row undoes it: cumsum(times) - times are the first positions
    times = np.array([1, 4, 2, 1, 3])
    first = np.cumsum(times) - times
    assert rows_of(batch.repeat_rows(times).take(first)) == list(range(5))
    # a count per row of the repeated batch composes: row i ends up times[i] * 2 times
    twice = batch.repeat_rows(times).repeat_rows([2] * int(times.sum()))
    assert rows_of(twice) == rows_of(batch.repeat_rows(times * 2))


def test_repeat_rows_edge_cases_and_bad_counts():
    assert len(numbered(3).repeat_rows([0, 0, 0])) == 0
    assert len(numbered(0).repeat_rows([])) == 0
    with pytest.raises(ValueError, match="3 integer counts"):
        numbered(3).repeat_rows([1, 2])
    with pytest.raises(ValueError, match="3 integer counts"):
        numbered(3).repeat_rows([1.5, 1, 1])
    with pytest.raises(ValueError, match=">= 0"):
        numbered(3).repeat_rows([1, -1, 1])


def test_reorder_applies_a_permutation_and_its_inverse_restores_the_batch():
    perm = [2, 0, 3, 1]
    batch = numbered(4).reorder(perm)
    assert rows_of(batch) == perm
    assert rows_of(batch.reorder(np.argsort(perm))) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="permutation"):
        numbered(4).reorder([0, 0, 1, 2])


@pytest.mark.parametrize(("n_rows", "divisor", "pad"), [(10, 4, 2), (8, 4, 0), (2, 7, 5), (1, 3, 2)])
def test_pad_to_divisor_appends_leading_rows_cyclically_and_unpad_removes_them(n_rows, divisor, pad):
    padded, got_pad = numbered(n_rows).pad_to_divisor(divisor)
    assert got_pad == pad and len(padded) % divisor == 0
    assert rows_of(padded) == list(range(n_rows)) + [i % n_rows for i in range(pad)]
    assert rows_of(padded.unpad(got_pad)) == list(range(n_rows))


def test_padding_edge_cases():
    empty, pad = numbered(0).pad_to_divisor(3)  # 0 rows are divisible by anything
    assert (len(empty), pad) == (0, 0)
    with pytest.raises(ValueError, match="divisor >= 1"):
        numbered(2).pad_to_divisor(0)
    with pytest.raises(ValueError, match="unpad"):
        numbered(2).unpad(3)


def test_make_iterator_in_order_without_seed():
    batches = list(numbered(6).make_iterator(mini_batch_size=2, epochs=2))
    assert [rows_of(b) for b in batches] == [[0, 1], [2, 3], [4, 5]] * 2
    assert all(b.meta_info == {"step": 1} for b in batches)


def test_make_iterator_with_a_seed_is_deterministic_and_covers_every_row_each_epoch():
    def order(seed: int) -> list[list[int]]:
        return [rows_of(b) for b in numbered(8).make_iterator(mini_batch_size=4, epochs=3, seed=seed)]

    first = order(seed=7)
    assert first == order(seed=7)
    assert first != order(seed=8)
    for epoch in range(3):
        assert sorted(first[2 * epoch] + first[2 * epoch + 1]) == list(range(8))
    assert first[0:2] != first[2:4] or first[2:4] != first[4:6], "each epoch draws a new permutation"
    with pytest.raises(ValueError, match="mini-batches of 3"):
        next(numbered(8).make_iterator(mini_batch_size=3))


def test_values_equal_treats_nan_as_equal_only_to_nan():
    nan = float("nan")
    assert values_equal(torch.tensor([1.0, nan]), torch.tensor([1.0, nan]))
    assert not values_equal(torch.tensor([0.0, nan]), torch.tensor([0.0, 0.0]))
    assert values_equal(np.array([{"a": [1, nan]}], dtype=object), np.array([{"a": [1, nan]}], dtype=object))
    assert not values_equal(np.array(["a", "b"], dtype=object), np.array(["a", "c"], dtype=object))
    assert not values_equal(torch.zeros(2), np.zeros(2))
