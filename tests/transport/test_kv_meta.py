"""KVBatchMeta: selection, chunk∘concat, union, their errors, and a pickled size of O(rows)."""

from __future__ import annotations

import pickle

import pytest

from stratarl.transport.kv_meta import FieldInfo, KVBatchMeta

LOGP = FieldInfo("float32", (1024,))
IDS = FieldInfo("int64", (1024,))


def meta(n_rows: int, partition: str = "train/step-1", **extra) -> KVBatchMeta:
    return KVBatchMeta(
        partition, [f"k{i}" for i in range(n_rows)], {"old_log_probs": LOGP, "responses": IDS}, extra
    )


def test_keys_must_be_unique_and_partition_named():
    with pytest.raises(ValueError, match=r"repeated: \['a'\]"):
        KVBatchMeta("p", ["a", "b", "a"])
    with pytest.raises(ValueError, match="partition"):
        KVBatchMeta("", ["a"])


def test_extra_info_is_copied_not_shared():
    info = {"sampling": {"temperature": 1.0}}
    ref = KVBatchMeta("p", ["a"], {}, info)
    info["sampling"]["temperature"] = 0.0
    assert ref.extra_info == {"sampling": {"temperature": 1.0}}


def test_select_fields_rows_and_keys():
    ref = meta(5, temperature=0.7)
    assert ref.select_fields(["responses"]).field_names == ["responses"]
    assert ref.select_rows([4, 0]).keys == ("k4", "k0")
    assert ref.select_rows(slice(1, 3)).keys == ("k1", "k2")
    assert ref.select_keys(["k3", "k1"]).keys == ("k3", "k1")
    assert ref.select_rows([1]).extra_info == {"temperature": 0.7}
    with pytest.raises(KeyError, match="values"):
        ref.select_fields(["values"])
    with pytest.raises(KeyError, match="k9"):
        ref.select_keys(["k9"])


@pytest.mark.parametrize(("n_rows", "k"), [(8, 2), (10, 4), (3, 5), (0, 3)])
def test_chunk_puts_the_remainder_first_and_concat_restores(n_rows, k):
    ref = meta(n_rows, temperature=0.7)
    chunks = ref.chunk(k)
    assert [len(c) for c in chunks] == [n_rows // k + (i < n_rows % k) for i in range(k)]
    assert KVBatchMeta.concat(chunks) == ref


def test_concat_requires_one_partition_and_the_same_fields_and_unions_extra_info():
    a, b = (
        meta(2, step=1),
        KVBatchMeta("train/step-1", ["x"], {"old_log_probs": LOGP, "responses": IDS}, {"lr": 1}),
    )
    joined = KVBatchMeta.concat([a, KVBatchMeta("train/step-1", [], {}), b])  # empty metas are skipped
    assert joined.keys == ("k0", "k1", "x") and joined.extra_info == {"step": 1, "lr": 1}
    with pytest.raises(ValueError, match="across partitions"):
        KVBatchMeta.concat([a, meta(1, partition="val/step-1").select_rows([0])])
    with pytest.raises(ValueError, match="with fields"):
        KVBatchMeta.concat([a, b.select_fields(["responses"])])
    with pytest.raises(ValueError, match=r"extra_info\['step'\] conflicts"):
        KVBatchMeta.concat([a, KVBatchMeta("train/step-1", ["y"], a.fields, {"step": 2})])
    with pytest.raises(ValueError, match="unique"):
        KVBatchMeta.concat([a, a])


def test_concat_summarises_rows_of_different_lengths_with_none():
    short = KVBatchMeta("p", ["a"], {"responses": FieldInfo("int64", (16,))})
    long = KVBatchMeta("p", ["b"], {"responses": FieldInfo("int64", (32,))})
    assert KVBatchMeta.concat([short, long]).fields["responses"] == FieldInfo("int64", (None,))
    with pytest.raises(ValueError, match="'responses' is int64"):
        KVBatchMeta.concat([short, KVBatchMeta("p", ["c"], {"responses": FieldInfo("int32", (16,))})])


def test_union_adds_fields_of_the_same_rows():
    ref = meta(3)
    values = KVBatchMeta(ref.partition, ref.keys, {"values": LOGP}, {"critic": "v1"})
    both = ref.union(values)
    assert both.field_names == ["old_log_probs", "responses", "values"] and both.extra_info == {
        "critic": "v1"
    }
    with pytest.raises(ValueError, match="different rows"):
        ref.union(values.select_rows([2, 1, 0]))
    with pytest.raises(ValueError, match="field 'responses'"):
        ref.union(KVBatchMeta(ref.partition, ref.keys, {"responses": LOGP}))


def test_pickled_size_grows_with_rows_not_with_tokens():
    small, large = len(pickle.dumps(meta(128))), len(pickle.dumps(meta(256)))
    assert large < 256 * 16 + 1024, "a few bytes per key, nothing per token"
    assert 1.6 < large / small < 2.1
    wide = KVBatchMeta("train/step-1", meta(256).keys, {"old_log_probs": FieldInfo("float32", (65536,))})
    assert abs(len(pickle.dumps(wide)) - len(pickle.dumps(meta(256).select_fields(["old_log_probs"])))) < 8
