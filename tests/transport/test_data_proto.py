"""DataProto: construction, indexing, column operations, their errors, pickling and save/load."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from stratarl.transport.data_proto import DataProto, DataProtoItem


def small_batch(n_rows: int = 4, width: int = 3) -> DataProto:
    return DataProto.from_columns(
        {
            "responses": torch.arange(n_rows * width).reshape(n_rows, width),
            "old_log_probs": -torch.arange(n_rows * width, dtype=torch.float32).reshape(n_rows, width) / 10,
            "uid": [f"u{i // 2}" for i in range(n_rows)],
            "reward_model": [{"ground_truth": str(i)} for i in range(n_rows)],
        },
        meta_info={"temperature": 0.7},
    )


def test_from_columns_sorts_tensors_and_objects_and_keeps_nested_lists_whole():
    batch = DataProto.from_columns({"ids": torch.zeros(2, 3), "tools": [[1, 2], [3, 4]]})
    assert batch.tensor_keys == ["ids"] and batch.non_tensor_keys == ["tools"]
    assert batch["tools"].shape == (2,) and batch["tools"][1] == [3, 4]
    assert len(batch) == 2 and "ids" in batch and "nope" not in batch


def test_only_non_tensor_columns_and_empty_batch_have_a_length():
    assert len(DataProto.from_columns({"uid": ["a", "b", "c"]})) == 3
    assert len(DataProto()) == 0


def test_mismatched_lengths_are_rejected_naming_the_columns():
    with pytest.raises(ValueError, match=r"'b'.*'a' has 3 rows"):
        DataProto.from_dict({"a": torch.zeros(3, 2), "b": torch.zeros(4, 2)})
    with pytest.raises(ValueError, match="non-tensor column 'uid' has 2 rows but the batch has 3"):
        DataProto.from_dict({"a": torch.zeros(3)}, {"uid": ["x", "y"]})
    with pytest.raises(ValueError, match="0-d"):
        DataProto.from_dict({"a": torch.tensor(1.0)})


def test_a_name_cannot_be_both_a_tensor_and_a_non_tensor_column():
    with pytest.raises(ValueError, match="'x' is both"):
        DataProto.from_dict({"x": torch.zeros(2)}, {"x": ["a", "b"]})


def test_indexing_by_int_slice_list_array_tensor_and_mask():
    batch = small_batch()
    item = batch[-1]
    assert isinstance(item, DataProtoItem)
    assert item.batch["responses"].tolist() == [9, 10, 11] and item.non_tensor_batch["uid"] == "u1"
    assert batch[1:3]["responses"][:, 0].tolist() == [3, 6]
    for rows in ([3, 0], np.array([3, 0]), torch.tensor([3, 0])):
        picked = batch[rows]
        assert picked["responses"][:, 0].tolist() == [9, 0] and list(picked["uid"]) == ["u1", "u0"]
    masked = batch[np.array([True, False, False, True])]
    assert masked["responses"][:, 0].tolist() == [0, 9]
    assert masked.meta_info == {"temperature": 0.7}
    with pytest.raises(ValueError, match="bool row mask"):
        batch.take(np.array([True, False]))


def test_select_shares_tensors_and_names_missing_columns():
    batch = small_batch()
    picked = batch.select(["responses", "uid"], meta_keys=[])
    assert picked.columns == ["responses", "uid"] and picked.meta_info == {}
    assert picked["responses"].data_ptr() == batch["responses"].data_ptr()
    with pytest.raises(KeyError, match="values"):
        batch.select(["responses", "values"])


def test_pop_removes_columns_and_meta_from_the_batch():
    batch = small_batch()
    popped = batch.pop(["old_log_probs", "uid"], meta_keys=["temperature"])
    assert popped.columns == ["old_log_probs", "uid"] and popped.meta_info == {"temperature": 0.7}
    assert batch.columns == ["responses", "reward_model"] and batch.meta_info == {}
    assert len(popped) == len(batch) == 4


def test_rename_covers_both_kinds_and_refuses_collisions():
    batch = small_batch()
    renamed = batch.rename(["old_log_probs", "uid"], ["log_prob", "group"])
    assert set(renamed.columns) == {"responses", "log_prob", "group", "reward_model"}
    assert torch.equal(renamed["log_prob"], batch["old_log_probs"])
    assert "old_log_probs" in batch, "rename returns a new batch"
    with pytest.raises(ValueError, match="already exists"):
        batch.rename("uid", "responses")


def test_union_adds_columns_and_accepts_equal_ones_including_nan():
    batch = small_batch()
    batch.batch["old_log_probs"][0, 0] = float("nan")
    other = batch.select(["old_log_probs", "uid"]).union(
        DataProto.from_columns({"values": torch.ones(4, 3), "uid": batch["uid"].copy()}, {"step": 3})
    )
    merged = batch.union(other)
    assert set(merged.columns) == {"responses", "old_log_probs", "uid", "reward_model", "values"}
    assert merged.meta_info == {"temperature": 0.7, "step": 3}
    assert "values" not in batch, "union returns a new batch"


def test_union_rejects_conflicts_naming_the_column_or_meta_key():
    batch = small_batch()
    changed = batch.select(["old_log_probs"])
    changed.batch["old_log_probs"] = batch["old_log_probs"] + 1
    with pytest.raises(ValueError, match="column 'old_log_probs'"):
        batch.union(changed)
    uid_changed = DataProto.from_columns({"uid": ["u0", "u0", "u1", "other"]})
    with pytest.raises(ValueError, match="column 'uid'"):
        batch.union(uid_changed)
    with pytest.raises(ValueError, match=r"meta_info\['temperature'\]"):
        batch.union(DataProto.from_columns({"x": torch.zeros(4)}, {"temperature": 1.0}))
    with pytest.raises(ValueError, match="4 and 2 rows"):
        batch.union(batch[:2])


def test_pickle_round_trip_sends_tensors_out_of_band_whatever_the_length():
    for width in (3, 512):
        batch = small_batch(width=width)
        batch.batch["half"] = torch.full((4, width), 0.5, dtype=torch.bfloat16)
        buffers: list[pickle.PickleBuffer] = []
        payload = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
        assert len(buffers) == 3, "one raw buffer per tensor column, no per-row objects"
        assert len(payload) < 2000, "in-band bytes hold names, object columns and meta only"
        back = pickle.loads(payload, buffers=buffers)
        assert back.columns == batch.columns and back.meta_info == batch.meta_info
        for name in batch.tensor_keys:
            assert back[name].dtype == batch[name].dtype and torch.equal(back[name], batch[name])
        assert list(back["reward_model"]) == list(batch["reward_model"])
    assert torch.equal(pickle.loads(pickle.dumps(batch))["half"], batch["half"])


def test_save_and_load_round_trip(tmp_path):
    batch = small_batch()
    batch.save(tmp_path / "batch.pkl")
    back = DataProto.load(tmp_path / "batch.pkl")
    assert torch.equal(back["old_log_probs"], batch["old_log_probs"]) and list(back["uid"]) == list(
        batch["uid"]
    )
    with open(tmp_path / "other.pkl", "wb") as f:
        pickle.dump({"not": "a batch"}, f)
    with pytest.raises(TypeError, match="not a DataProto"):
        DataProto.load(tmp_path / "other.pkl")


def test_to_moves_tensors_and_keeps_the_rest():
    batch = small_batch().to("cpu")
    assert batch["responses"].device.type == "cpu" and batch.meta_info == {"temperature": 0.7}
