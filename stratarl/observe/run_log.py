"""Cross-cutting: what a run writes down — metrics.jsonl, trajectories.jsonl, and a console view.

Each line of `metrics.jsonl` is {"step": k, "phase": "train"|"val"|"sft", <metric>: value, ...};
each line of `trajectories.jsonl` is one trajectory of one step (DESIGN.md §4: where it came from,
what it said, what it earned, which weights made it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
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
        with self.metrics_path.open("a") as f:
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
        with self.trajectories_path.open("a") as f:
            for record in records:
                f.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")

    @staticmethod
    def read(path: str | Path) -> list[dict[str, Any]]:
        return read_metrics(path)

    @staticmethod
    def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]]) -> None:
        with Path(path).open("w") as f:
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
        table = Table(title=title, show_header=False)
        for key, value in rows.items():
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
        self.console.print(table)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file, in order."""
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]
