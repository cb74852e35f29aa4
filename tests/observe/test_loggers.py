"""TensorBoard and W&B sinks: what a reader of their files sees (values, steps, tags, one lineage)."""

import struct
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from stratarl.observe.loggers import TensorBoardSink, WandbSink, metric_tag


def scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def wandb_history(run_dir: Path, *, wait_s: float = 60.0) -> list[dict[str, str]]:
    """The history rows of the offline run under run_dir/wandb, read from its .wandb file (a leveldb
    log of protobuf records: 32 KiB blocks of [crc32, length, type] chunks after a 7-byte header).

    `run.finish()` returns once wandb's service has handled the run's exit, but the service's writer
    may append the records to the file a moment later (seen on a loaded machine: the file held no
    history yet). So read until the file holds the exit record, which is written after every row."""
    deadline = time.monotonic() + wait_s
    while True:
        records = wandb_records(run_dir)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return [
        {item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]


def wandb_records(run_dir: Path) -> list:
    """Every complete record of the offline run's .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, block, pos, pending, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # a record still being written
            break
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:  # zero padding to the block's end
            pos += block - pos % block if pos % block else 0
            continue
        pending = chunk if kind in (1, 2) else pending + chunk  # full/first, middle/last
        if kind in (1, 4):
            records.append(pending)
    parsed = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        parsed.append(record)
    return parsed


def test_tags_keep_train_and_validation_names_and_prefix_other_phases():
    assert metric_tag("actor/pg_loss", "train") == "actor/pg_loss"
    assert metric_tag("val-core/arithmetic/acc/mean@1", "val") == "val-core/arithmetic/acc/mean@1"
    assert metric_tag("loss", "sft") == "sft/loss"
    assert metric_tag("sft/loss", "sft") == "sft/loss"


def test_tensorboard_scalars_by_step_and_a_resume_keeps_one_lineage(tmp_path):
    sink = TensorBoardSink(tmp_path)
    for step in range(1, 6):
        sink.log(step, {"critic/score/mean": step / 10, "note": "text is skipped"}, "train")
    sink.close()
    # Killed after step 5, resumed from the checkpoint of step 3: steps 4 and 5 are logged again.
    resumed = TensorBoardSink(tmp_path, resumed_after=3)
    for step in (4, 5):
        resumed.log(step, {"critic/score/mean": step}, "train")
    resumed.close()
    steps, values = zip(*scalars(tmp_path / "tensorboard", "critic/score/mean"), strict=True)
    assert steps == (1, 2, 3, 4, 5)  # the old 4 and 5 purged: one lineage
    assert values == pytest.approx([0.1, 0.2, 0.3, 4.0, 5.0])


def test_wandb_writes_an_offline_run_with_steps_and_values(tmp_path):
    sink = WandbSink(tmp_path, project="p", experiment="e", config={"actor": {"lr": 1e-5}})
    sink.log(1, {"critic/score/mean": 0.25}, "train")
    sink.log(2, {"critic/score/mean": 0.5}, "train")
    sink.log(2, {"val-core/acc": 0.75}, "val")  # validation at the same global step
    sink.close()
    rows = wandb_history(tmp_path)
    assert [(r["_step"], r.get("critic/score/mean")) for r in rows] == [("1", "0.25"), ("2", "0.5")]
    assert rows[1]["val-core/acc"] == "0.75"
