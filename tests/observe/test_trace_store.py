"""The trace's storage: phases joined by trajectory id, whole groups sampled, a size bound that drops
the oldest steps, complete files only, and a resume that cuts later steps."""

import pyarrow.parquet as pq
import pytest

from stratarl.observe.trace_store import StepTrace, TraceWriter, choose_traced_groups, read_step, step_files


def test_phases_join_by_trajectory_id_whatever_their_row_order():
    trace = StepTrace(3)
    trace.add(["a/0", "a/1", "b/0"], {"reward": [1.0, 0.0, 0.5], "prompt_ids": [[1, 2], [1, 2], [3]]})
    trace.add(["b/0", "a/0"], {"ratio_mean": [1.1, 0.9]})  # the update reports rows in its own order
    rows = {r["trajectory_id"]: r for r in trace.table().to_pylist()}
    assert rows["a/0"]["ratio_mean"] == 0.9 and rows["b/0"]["ratio_mean"] == 1.1
    assert rows["a/1"]["ratio_mean"] is None  # not trained: null, not missing
    assert rows["a/0"]["step"] == 3 and rows["b/0"]["prompt_ids"] == [3]
    assert str(trace.table().schema.field("prompt_ids").type) == "list<item: int32>"
    with pytest.raises(ValueError, match="3 values for 2 trajectories"):
        trace.add(["a/0", "a/1"], {"x": [1, 2, 3]})


def test_whole_groups_are_traced_up_to_the_cap():
    sizes = {f"u{i}": 4 for i in range(10)}
    assert choose_traced_groups(sizes, fraction=1.0, max_trajectories=None, seed=0) == set(sizes)
    half = choose_traced_groups(sizes, fraction=0.5, max_trajectories=None, seed=0)
    assert len(half) == 5 and half == choose_traced_groups(sizes, fraction=0.5, max_trajectories=None, seed=0)
    assert len(choose_traced_groups(sizes, fraction=1.0, max_trajectories=9, seed=0)) == 2  # 8 ≤ 9 < 12
    assert len(choose_traced_groups(sizes, fraction=1.0, max_trajectories=1, seed=0)) == 1  # at least one
    writer = TraceWriter("unused", fraction=0.5, seed=1)
    ids = [f"u{i}/{s}" for i in range(10) for s in range(4)]
    chosen = writer.traced_ids(2, [i.split("/")[0] for i in ids], ids)
    assert len(chosen) == 20 and {i.split("/")[0] for i in chosen}.__len__() == 5  # whole groups


def test_the_folder_stays_under_its_bound_and_a_resume_cuts_later_steps(tmp_path):
    writer = TraceWriter(tmp_path, max_total_mb=0.01)  # ~10 KB: about four of these steps
    for step in range(1, 9):
        trace = StepTrace(step)
        trace.add(
            [f"{step}-{i}/0" for i in range(50)],
            {"response_ids": [list(range(i, i + 40)) for i in range(50)]},
        )
        writer.write(trace)
    files = step_files(tmp_path)
    assert max(files) == 8 and min(files) > 1  # oldest deleted first, the newest kept
    assert sum(p.stat().st_size for p in files.values()) <= 0.01 * 2**20
    assert not list((tmp_path / "traces").glob("*.partial"))
    (tmp_path / "traces" / "step_000009.parquet.partial").write_bytes(b"half a file")  # being written
    assert 9 not in step_files(tmp_path)
    writer.truncate_after(6)
    assert max(step_files(tmp_path)) == 6
    assert len(read_step(tmp_path, 6, columns=["trajectory_id", "missing"])) == 50
    with pytest.raises(KeyError, match="no trace of step 99"):
        read_step(tmp_path, 99)
    assert pq.read_metadata(step_files(tmp_path)[6]).row_group(0).column(0).compression == "ZSTD"
