"""Cross-cutting: what the trainer wraps each phase in — its wall time (`timing_s/<phase>`), the
memory peak it may set (`memory/*`), and its deadline (the watchdog, when one runs).

    with monitor.phase("gen", timings, step=step, rows=len(batch)):
        batch = phases.generate(...)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager

from stratarl.observe.memory import PeakTracker
from stratarl.observe.timing import timed
from stratarl.observe.watchdog import Watchdog


class PhaseMonitor:
    """roles: phase -> the role that runs it (named when its deadline passes; default controller)."""

    def __init__(self, watchdog: Watchdog | None = None, roles: Mapping[str, str] | None = None):
        self.watchdog = watchdog
        self.roles = dict(roles or {})
        self.memory = PeakTracker()
        self.failed_in: str | None = None  # the innermost phase an error passed through

    @contextmanager
    def phase(
        self,
        name: str,
        timings: dict[str, float] | None = None,
        *,
        step: int | None = None,
        rows: int | None = None,
    ) -> Iterator[None]:
        """Time the block into timings[name] (when given), record the memory peak it sets, and hold
        it to the phase's deadline."""
        before = self.memory.marks()
        try:
            with ExitStack() as stack:
                if self.watchdog is not None:
                    role = self.roles.get(name, "controller")
                    stack.enter_context(self.watchdog.phase(name, step=step, role=role, rows=rows))
                if timings is not None:
                    stack.enter_context(timed(name, timings))
                yield
        except BaseException:
            if self.failed_in is None:  # the innermost phase: the first one the error leaves
                self.failed_in = name if step is None else f"{name} (step {step})"
            raise
        self.memory.after(name, before)
