"""StorageUnit on its own: rows × fields storage, copies on put, production and consumption records."""

from __future__ import annotations

import numpy as np
import pytest

from stratarl.transport.kv_meta import FieldInfo
from stratarl.transport.storage import InProcessUnits, StorageUnit


def filled_unit() -> tuple[StorageUnit, np.ndarray]:
    unit = StorageUnit()
    logp = np.arange(12, dtype=np.float32).reshape(4, 3)
    unit.put("p", ["a", "b", "c", "d"], [10, 11, 12, 13], {"logp": (logp, "float32")})
    return unit, logp


def test_get_returns_rows_in_the_requested_order():
    unit, logp = filled_unit()
    values, dtype = unit.get("p", ["d", "a"], ["logp"])["logp"]
    assert dtype == "float32" and values.tolist() == [logp[3].tolist(), logp[0].tolist()]


def test_get_interleaves_rows_of_several_puts():
    unit, logp = filled_unit()
    later = 100 + np.arange(6, dtype=np.float32).reshape(2, 3)
    unit.put("p", ["x", "y"], [20, 21], {"logp": (later, "float32")})
    values, _ = unit.get("p", ["y", "a", "x", "d"], ["logp"])["logp"]
    assert values.tolist() == [later[1].tolist(), logp[0].tolist(), later[0].tolist(), logp[3].tolist()]


def test_put_copies_so_later_edits_or_read_only_buffers_do_not_matter():
    unit, logp = filled_unit()
    logp[:] = -1
    assert unit.get("p", ["a"], ["logp"])["logp"][0].tolist() == [[0.0, 1.0, 2.0]]
    frozen = np.ones((2, 3), dtype=np.float32)
    frozen.setflags(write=False)  # what Ray hands an actor
    unit.put("p", ["e", "f"], [14, 15], {"logp": (frozen, "float32")})
    stored = unit.get("p", ["e"], ["logp"])["logp"][0]
    assert stored.tolist() == [[1.0, 1.0, 1.0]]


def test_scalar_columns_and_object_columns_keep_their_shape_and_values():
    unit = StorageUnit()
    version = np.array([3, 4], dtype=np.int64)
    info = np.empty(2, dtype=object)
    info[0], info[1] = {"turns": [1, 2]}, np.zeros(2)
    unit.put("p", ["a", "b"], [0, 1], {"weight_version": (version, "int64"), "extra_info": (info, "object")})
    got = unit.get("p", ["b", "a"], ["weight_version", "extra_info"])
    assert got["weight_version"][0].tolist() == [4, 3] and got["weight_version"][0].shape == (2,)
    extra = got["extra_info"][0]
    assert extra.dtype == object and extra.shape == (2,) and extra[1] == {"turns": [1, 2]}
    assert isinstance(extra[0], np.ndarray), "an array held in an object column stays one value"
    assert unit.describe("p", ["a"], ["weight_version", "extra_info"]) == {
        "weight_version": FieldInfo("int64", ()),
        "extra_info": FieldInfo("object", ()),
    }


def test_production_and_consumption_records():
    unit, _ = filled_unit()
    unit.put("p", ["b", "c"], [0, 0], {"values": (np.zeros((2, 3), dtype=np.float32), "float32")})
    assert sorted(key for _, key in unit.ready("p", ["logp", "values"])) == ["b", "c"]
    unit.get("p", ["b"], ["values"], consumer="critic.update")
    assert [key for _, key in unit.ready("p", ["values"], consumer="critic.update")] == ["c"]
    assert [key for _, key in unit.ready("p", ["values"], consumer="metrics")] == ["b", "c"]
    status = {key: (set(fields), readers) for _, key, fields, readers in unit.status("p")}
    assert status["b"] == ({"logp", "values"}, ("critic.update",)) and status["a"] == ({"logp"}, ())
    assert unit.status("p")[1][0] == 11, "a re-put keeps the row's original sequence number"


def test_errors_name_keys_fields_and_dtypes():
    unit, _ = filled_unit()
    with pytest.raises(KeyError, match=r"\['zz'\] not in partition 'p'"):
        unit.get("p", ["a", "zz"], ["logp"])
    with pytest.raises(KeyError, match="'values' not produced yet"):
        unit.get("p", ["a"], ["values"])
    with pytest.raises(ValueError, match="'logp' of partition 'p' is float32, not bfloat16"):
        unit.put("p", ["a"], [0], {"logp": (np.zeros((1, 3), dtype=np.int16), "bfloat16")})
    with pytest.raises(ValueError, match="2 rows for 1 keys"):
        unit.put("p", ["a"], [0], {"logp": (np.zeros((2, 3), dtype=np.float32), "float32")})
    unit.put("p", ["w"], [20], {"logp": (np.zeros((1, 5), dtype=np.float32), "float32")})
    with pytest.raises(ValueError, match="different shapes"):
        unit.get("p", ["a", "w"], ["logp"])
    assert unit.describe("p", ["a", "w"], ["logp"]) == {"logp": FieldInfo("float32", (None,))}


def test_clear_rows_or_a_whole_partition():
    unit, _ = filled_unit()
    assert unit.nbytes() == 4 * 3 * 4
    assert unit.clear("p", ["a", "zz"]) == 1
    assert unit.clear("p") == 3 and unit.status("p") == [] and unit.nbytes() == 0


def test_in_process_units_run_calls_directly():
    units = InProcessUnits(3)
    pending = [units.submit(u, "nbytes") for u in range(len(units))]
    assert units.collect(pending) == [0, 0, 0]
    with pytest.raises(ValueError, match="at least one"):
        InProcessUnits(0)
