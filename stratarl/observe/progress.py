"""Cross-cutting: how far a run is — a bar in a terminal, a plain line every N steps elsewhere.

In a terminal the bar shows the step, the seconds per step and the ETA, and goes away at the end.
Where the console is not a terminal (a log file, CI, nohup) a bar prints nothing, so `StepProgress`
prints one line every `line_interval(total)` steps (about ten a run) and at the last step:

    training: step 30/60 (50%)  2.41 s/step  elapsed 1m 12s  ETA 1m 12s

Seconds per step are measured over the steps this process ran (a resumed run does not count the
steps before its checkpoint); the ETA is the remaining steps at that rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

LINES_PER_RUN = 10


def line_interval(total_steps: int, lines: int = LINES_PER_RUN) -> int:
    """Steps between two plain progress lines: about `lines` lines a run (60 steps → every 6)."""
    return max(1, math.ceil(total_steps / lines))


def format_duration(seconds: float) -> str:
    """42s, 3m 05s, 2h 04m."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def progress_line(label: str, step: int, total: int, *, seconds_per_step: float, elapsed_s: float) -> str:
    """`training: step 30/60 (50%)  2.41 s/step  elapsed 1m 12s  ETA 1m 12s`."""
    eta = (total - step) * seconds_per_step
    return (
        f"{label}: step {step}/{total} ({100 * step // max(total, 1)}%)  {seconds_per_step:.3g} s/step  "
        f"elapsed {format_duration(elapsed_s)}  ETA {format_duration(eta)}"
    )


class SecondsPerStepColumn(ProgressColumn):
    """The bar's rate, as seconds per step (rich's own speed columns count bytes or items per second)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{1 / speed:.3g} s/step" if speed else "-- s/step", style="progress.data.speed")


class StepProgress:
    """Progress of steps start+1..total on `console`; `advance(step)` after each step."""

    def __init__(
        self,
        console: Console,
        *,
        total: int,
        start: int = 0,
        label: str = "training",
        clock: Callable[[], float] = time.monotonic,
    ):
        self.console, self.total, self.start, self.label, self.clock = console, total, start, label, clock
        self.every = line_interval(total)
        self.began = clock()
        self._bar: Progress | None = None
        self._task = None

    def __enter__(self) -> StepProgress:
        self.began = self.clock()
        if self.console.is_terminal:
            self._bar = Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                SecondsPerStepColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.start)
        return self

    def advance(self, step: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=step)
            return
        if step % self.every and step != self.total:
            return
        elapsed = self.clock() - self.began
        rate = elapsed / max(step - self.start, 1)
        line = progress_line(self.label, step, self.total, seconds_per_step=rate, elapsed_s=elapsed)
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, error, tb)
            self._bar = None
