"""Cross-cutting: what `stratarl doctor` reads and says — a run's records loaded once (`RunView`), and
the `Finding`s its checks return (severity, layer, evidence, the next thing to try).

A finding's layer is one of the six of docs/architecture.md (plus cross-cutting, the observer's
own work): the layer whose code or setting a fix changes, not the one where the symptom shows.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratarl.observe.run_records import (
    config_value,
    read_config,
    read_hang_reports,
    read_metrics_tolerant,
    resolve_run_dir,
    train_records,
)
from stratarl.observe.trace_store import read_steps

CONFIG, CONTROL_FLOW, ORCHESTRATION = "config", "control flow", "orchestration"
TRANSPORT, COMPUTE, RL_MATH, CROSS_CUTTING = (
    "data transport",
    "compute & environment",
    "RL math",
    "cross-cutting",
)
LAYERS = (CONFIG, CONTROL_FLOW, ORCHESTRATION, TRANSPORT, COMPUTE, RL_MATH, CROSS_CUTTING)
SEVERITIES = ("problem", "warning", "info")
LIVE_WITHIN_S = 120.0  # metrics.jsonl written this recently: the run is probably still going

# The trace columns the checks read (a small part of each step file).
TRACE_COLUMNS = (
    "step", "reward", "finish_reason", "stop_reason", "response_text", "ground_truth", "reward_extras",
    "advantage", "ratio_mean", "ratio_min", "ratio_max", "staleness", "weight_version", "trained_version",
    "parse_failures", "tool_calls", "trajectory_id", "action_tokens", "response_tokens", "group_has_signal",
    "uid", "response_ids", "sampling", "tool_errors", "data_source", "teacher_log_prob_mean",
    "old_log_prob_mean", "gateway_calls",
)  # fmt: skip


@dataclass
class Finding:
    severity: str  # SEVERITIES
    layer: str  # LAYERS
    title: str
    evidence: list[str] = field(default_factory=list)
    next_step: str = ""
    key: str = ""  # what the finding is about, so that later checks can defer to it

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES or self.layer not in LAYERS:
            raise ValueError(f"finding {self.title!r}: severity {self.severity!r}, layer {self.layer!r}")


@dataclass
class RunView:
    """Everything the checks read, loaded once."""

    run_dir: Path
    config: dict[str, Any]
    records: list[dict[str, Any]]
    traces: dict[int, list[dict[str, Any]]]
    hangs: list[dict[str, Any]]
    modified_s_ago: float | None
    lock: dict[str, Any] | None = None  # run.lock: the writer's pid, host, since ({} when released)
    lock_held: bool | None = None  # a process holds the run directory's flock; None: not probed
    record: dict[str, Any] | None = None  # run.json: status, steps_done, legs

    @property
    def train(self) -> list[dict[str, Any]]:
        return train_records(self.records)

    @property
    def val(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("phase") == "val"]

    def setting(self, key: str) -> Any:
        return config_value(self.config, key)

    def series(self, key: str) -> list[tuple[int, float]]:
        """(step, value) of a numeric train metric, in step order."""
        return [
            (int(r["step"]), float(r[key]))
            for r in self.train
            if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)
        ]

    def trace_rows(self) -> list[dict[str, Any]]:
        return [row for _, rows in sorted(self.traces.items()) for row in rows]


def read_json_file(path: Path) -> dict[str, Any] | None:
    """A JSON object file; {} when empty (a released lock), None when absent or unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def directory_lock_held(run_dir: Path) -> bool | None:
    """Whether a process holds the flock on the run directory that a writer takes for its life
    (`run_directory/lock.py`): probed with a shared lock, let go at once. None: cannot be opened."""
    try:
        dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(dir_fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(dir_fd)


def load_run(run: str | Path) -> RunView:
    run_dir = resolve_run_dir(run)
    metrics = run_dir / "metrics.jsonl"
    modified = time.time() - metrics.stat().st_mtime if metrics.exists() else None
    return RunView(
        run_dir=run_dir,
        config=read_config(run_dir),
        records=read_metrics_tolerant(metrics),
        traces=read_steps(run_dir, TRACE_COLUMNS),
        hangs=read_hang_reports(run_dir),
        modified_s_ago=modified,
        lock=read_json_file(run_dir / "run.lock"),
        lock_held=directory_lock_held(run_dir),
        record=read_json_file(run_dir / "run.json"),
    )
