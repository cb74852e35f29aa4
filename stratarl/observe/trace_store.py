"""Cross-cutting: where the trace lives — one parquet file per step, one row per traced trajectory.

`StepTrace` gathers what each phase wrote about a step's trajectories, joined by trajectory id
(phases may drop rows, e.g. dynamic sampling, or report them in another order, e.g. the update's
per-row statistics). `TraceWriter` chooses which prompt groups are traced (trace.fraction,
trace.max_trajectories_per_step), writes `<run_dir>/traces/step_<k>.parquet` (zstd) atomically,
and keeps the folder under trace.max_total_mb by deleting the oldest steps. The readers take a run
that is still being written: a step file appears whole or not at all.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

TRACE_DIR = "traces"
_STEP_FILE = re.compile(r"step_(\d+)\.parquet$")
# Token-id columns are stored as int32 lists (vocabularies stay below 2³¹).
_TOKEN_COLUMNS = ("prompt_ids", "response_ids")


class StepTrace:
    """The trace rows of one step, keyed by trajectory id, in the order they first appear.

    traced: the trajectory ids to keep (None: all); rows of other ids are ignored by `add`.
    """

    def __init__(self, step: int, traced: set[str] | None = None):
        self.step, self.traced = step, traced
        self.rows: dict[str, dict[str, Any]] = {}

    def add(self, ids: Sequence[str], columns: Mapping[str, Sequence[Any]]) -> None:
        """Each column's value i belongs to trajectory ids[i]; later phases add to earlier rows."""
        for name, values in columns.items():
            if len(values) != len(ids):
                raise ValueError(
                    f"trace column {name!r} has {len(values)} values for {len(ids)} trajectories"
                )
        for i, trajectory in enumerate(ids):
            if self.traced is not None and trajectory not in self.traced:
                continue
            row = self.rows.setdefault(trajectory, {"trajectory_id": trajectory, "step": self.step})
            row.update({name: values[i] for name, values in columns.items()})

    def table(self) -> pa.Table:
        """One row per trajectory; a column a phase did not write for a row is null there."""
        names = list(dict.fromkeys(name for row in self.rows.values() for name in row))
        data = {name: [row.get(name) for row in self.rows.values()] for name in names}
        table = pa.table(data)
        for name in _TOKEN_COLUMNS:
            if name in table.column_names:
                index = table.column_names.index(name)
                table = table.set_column(index, name, table[name].cast(pa.list_(pa.int32())))
        return table


def choose_traced_groups(
    group_sizes: Mapping[str, int], *, fraction: float, max_trajectories: int | None, seed: int
) -> set[str]:
    """The prompt groups (uid -> its trajectories) to trace: a seeded draw of ⌈fraction·groups⌉, then
    as many whole groups as fit in `max_trajectories` (at least one group)."""
    uids = sorted(group_sizes)
    wanted = len(uids) if fraction >= 1 else max(1, round(fraction * len(uids)))
    chosen = uids if wanted >= len(uids) else sorted(random.Random(seed).sample(uids, wanted))
    if max_trajectories is None:
        return set(chosen)
    kept, total = set(), 0
    for uid in chosen:
        if kept and total + group_sizes[uid] > max_trajectories:
            break
        kept.add(uid)
        total += group_sizes[uid]
    return kept


class TraceWriter:
    """Writes step tables under <run_dir>/traces, bounded to `max_total_mb`."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        fraction: float = 1.0,
        max_trajectories_per_step: int | None = None,
        max_total_mb: float = 512.0,
        seed: int = 0,
    ):
        self.root = Path(run_dir) / TRACE_DIR
        self.fraction, self.max_trajectories = fraction, max_trajectories_per_step
        self.max_bytes = int(max_total_mb * 2**20)
        self.seed = seed

    def traced_ids(self, step: int, uids: Sequence[str], ids: Sequence[str]) -> set[str] | None:
        """The trajectory ids of this step's rows to trace (None: every one)."""
        if self.fraction >= 1 and self.max_trajectories is None:
            return None
        sizes: dict[str, int] = {}
        for uid in uids:
            sizes[uid] = sizes.get(uid, 0) + 1
        groups = choose_traced_groups(
            sizes,
            fraction=self.fraction,
            max_trajectories=self.max_trajectories,
            seed=self.seed * 1_000_003 + step,
        )
        return {trajectory for uid, trajectory in zip(uids, ids, strict=True) if uid in groups}

    def write(self, trace: StepTrace) -> Path | None:
        """traces/step_<k>.parquet, written to a temporary name and renamed (readers never see half a
        file); then the oldest steps are deleted while the folder exceeds its bound."""
        if not trace.rows:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"step_{trace.step:06d}.parquet"
        partial = path.with_suffix(".parquet.partial")
        pq.write_table(trace.table(), partial, compression="zstd")
        os.replace(partial, path)
        self._enforce_bound(keep=path)
        return path

    def _enforce_bound(self, keep: Path) -> None:
        files = step_files(self.root.parent)
        total = sum(f.stat().st_size for f in files.values())
        for _, path in sorted(files.items()):
            if total <= self.max_bytes or path == keep:
                break
            total -= path.stat().st_size
            path.unlink()

    def truncate_after(self, step: int) -> None:
        """Delete the traces of steps after `step` (a resume continues from there)."""
        for k, path in step_files(self.root.parent).items():
            if k > step:
                path.unlink()


def step_files(run_dir: str | Path) -> dict[int, Path]:
    """step -> its trace file, for every complete step file of the run."""
    root = Path(run_dir) / TRACE_DIR
    if not root.is_dir():
        return {}
    found = {}
    for path in root.iterdir():
        match = _STEP_FILE.search(path.name)
        if match:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def read_step(run_dir: str | Path, step: int, columns: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The trace rows of one step (only `columns` when given); KeyError naming the traced steps."""
    files = step_files(run_dir)
    if step not in files:
        have = f"{min(files)}..{max(files)}" if files else "none"
        raise KeyError(f"no trace of step {step} in {Path(run_dir) / TRACE_DIR} (traced steps: {have})")
    return _read(files[step], columns)


def read_steps(run_dir: str | Path, columns: Iterable[str]) -> dict[int, list[dict[str, Any]]]:
    """step -> its rows with `columns` (those a step file has), for every traced step."""
    return {step: _read(path, columns) for step, path in step_files(run_dir).items()}


def _read(path: Path, columns: Iterable[str] | None) -> list[dict[str, Any]]:
    wanted = None if columns is None else list(columns)
    if wanted is not None:
        present = set(pq.read_schema(path).names)
        wanted = [c for c in wanted if c in present]
    return pq.read_table(path, columns=wanted).to_pylist()
