"""Cross-cutting: what a run writes down — metrics.jsonl, trajectories.jsonl, and a console view.

Each line of `metrics.jsonl` is {"step": k, "phase": "train"|"val"|"sft", <metric>: value, ...};
each line of `trajectories.jsonl` is one trajectory of one step (where it came from, what it said,
what it earned, which weights made it: docs/design.md#the-ten-questions-of-a-trajectory). Logs grow
by appending; any file that is rewritten instead (`replace_atomically`) is written beside, fsynced
and renamed over the old one.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.measure import Measurement
from rich.segment import Segments
from rich.table import Table

from stratarl.observe.loggers import MetricSink

# The few metrics shown on the console each step; everything goes to metrics.jsonl.
CONSOLE_METRICS = (
    "critic/score/mean",
    "actor/pg_loss",
    "actor/entropy",
    "actor/grad_norm",
    "response_length/mean",
    "timing_s/step",
)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible rather than dropping the key
    return value


class RunLog:
    """Appends metrics and trajectories under `run_dir`; prints a short line per step (unless
    `print_steps` is off: trainer.logger without `console`); mirrors metrics to attached sinks
    (`observe.loggers`: TensorBoard, W&B)."""

    def __init__(self, run_dir: str | Path, console: Console | None = None, *, print_steps: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.trajectories_path = self.run_dir / "trajectories.jsonl"
        self.console = console or Console()
        self.print_steps = print_steps
        self.history: list[dict[str, Any]] = []
        self.sinks: list[MetricSink] = []

    def attach(self, sinks: Iterable[MetricSink]) -> None:
        self.sinks.extend(sinks)

    def log_metrics(self, step: int, metrics: Mapping[str, Any], phase: str = "train") -> None:
        record = {"step": step, "phase": phase, **{k: _jsonable(v) for k, v in metrics.items()}}
        self.history.append(record)
        with naming_the_file(self.metrics_path), self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for sink in self.sinks:
            sink.log(step, metrics, phase)

    def log_image(self, tag: str, png_path: Path, step: int) -> None:
        for sink in self.sinks:
            sink.log_image(tag, png_path, step)

    def close(self) -> None:
        """Flush and close the sinks (each once; a failing one does not keep the others open)."""
        sinks, self.sinks = self.sinks, []
        errors = []
        for sink in sinks:
            try:
                sink.close()
            except Exception as err:  # report after closing the rest
                errors.append(err)
        if errors:
            raise errors[0]

    def log_trajectories(self, records: Iterable[Mapping[str, Any]]) -> None:
        with naming_the_file(self.trajectories_path), self.trajectories_path.open("a") as f:
            for record in records:
                f.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")

    @staticmethod
    def read(path: str | Path) -> list[dict[str, Any]]:
        return read_metrics(path)

    @staticmethod
    def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]]) -> None:
        with replace_atomically(path) as f:
            for record in records:
                f.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")

    def print_step(self, step: int, total: int, metrics: Mapping[str, Any]) -> None:
        if not self.print_steps:
            return
        shown = "  ".join(
            f"{name.split('/', 1)[-1] if name.startswith('critic') else name}={float(metrics[name]):.4g}"
            for name in CONSOLE_METRICS
            if name in metrics
        )
        self.console.print(f"[bold]step {step}/{total}[/bold]  {shown}")

    def print_table(self, title: str, rows: Mapping[str, Any]) -> None:
        """`rows` as a two-column table, never cut: wider than the console when a path or a metric
        name needs it (a terminal then wraps the line, a log file keeps it whole)."""
        table = Table(title=title, show_header=False)
        table.add_column(no_wrap=True)
        table.add_column(no_wrap=True)
        for key, value in rows.items():
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
        wide = self.console.options.update_width(1_000_000)
        width = max(Measurement.get(self.console, wide, table).maximum, self.console.width)
        lines = self.console.render_lines(
            table, self.console.options.update_width(width), pad=False, new_lines=True
        )
        self.console.print(Segments([s for line in lines for s in line]), soft_wrap=True, crop=False, end="")


@contextmanager
def naming_the_file(path: Path) -> Iterator[None]:
    """An OSError of a write to `path` names it (a full disk is reported at the flush on close, as
    `[Errno 28] No space left on device` without a file name)."""
    try:
        yield
    except OSError as err:
        if err.filename:
            raise
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file, in order."""
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]


@contextmanager
def replace_atomically(path: str | Path) -> Iterator[IO[str]]:
    """A text file to write the new content of `path` into: it is written beside (`<name>.tmp`, the
    same filesystem), fsynced and renamed over `path`, and the directory is fsynced, so a crash at
    any moment leaves either the whole old file or the whole new one. Nothing is replaced when the
    block raises."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_atomically(path: str | Path, text: str) -> Path:
    """Replace `path` by `text` through `replace_atomically`; returns the path."""
    with replace_atomically(path) as f:
        f.write(text)
    return Path(path)
