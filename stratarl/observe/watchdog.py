"""Cross-cutting: the watchdog — every phase has a deadline; a phase that passes it stops the run
with the Python stacks of every process of the run in <run_dir>/hang/, instead of hanging.

A monitor thread checks the active phases. When one passes its deadline it (1) writes the
controller's stacks (faulthandler: every thread) and a report (phase, step, role, rows, time),
(2) asks each registered dumper — the worker groups, for their rank processes — to add theirs,
(3) interrupts the main thread: a signal whose handler raises `WatchdogTimeout` (a blocking sleep
or lock wait returns at once; a C call returns first), and (4) if the run has not stopped after
`grace_s`, ends the process with the message (`os._exit`): a hang never outlives its deadline.

Deadlines (`DeadlinePolicy`): a fixed one per phase where configured; otherwise `initial_s` for a
phase's first `warmup_runs` runs, then max(floor_s, scale × its longest measured run).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratarl.observe.stack_dumps import BUSY, HANG_DIR, dump_this_process

INTERRUPT_SIGNAL = signal.SIGUSR2
HARD_EXIT_CODE = 70  # EX_SOFTWARE


class WatchdogTimeout(BaseException):
    """A phase passed its deadline. A BaseException (like KeyboardInterrupt), so that code which
    catches Exception — a scorer wrapper, a tool — cannot swallow it."""


@dataclass
class DeadlinePolicy:
    """How long each phase may take (`watchdog.*`)."""

    fixed: Mapping[str, float] = field(default_factory=dict)
    initial_s: float = 3600.0
    warmup_runs: int = 2
    scale: float = 10.0
    floor_s: float = 300.0
    measured: dict[str, list[float]] = field(default_factory=dict)

    def deadline(self, phase: str) -> tuple[float, str]:
        """(seconds, how they were chosen)."""
        if phase in self.fixed:
            return float(self.fixed[phase]), "fixed by watchdog.phase_timeouts_s"
        runs = self.measured.get(phase, [])
        if len(runs) < self.warmup_runs:
            return self.initial_s, f"watchdog.initial_timeout_s (run {len(runs) + 1} of the phase)"
        longest = max(runs)
        seconds = max(self.floor_s, self.scale * longest)
        return (
            seconds,
            f"max(floor {self.floor_s:g} s, {self.scale:g} × longest measured run {longest:.3g} s)",
        )

    def record(self, phase: str, seconds: float) -> None:
        runs = self.measured.setdefault(phase, [])
        if len(runs) < self.warmup_runs:
            runs.append(seconds)


@dataclass
class ActivePhase:
    name: str
    step: int | None
    role: str
    rows: int | None
    started: float  # time.monotonic()
    deadline_s: float
    why: str

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "phase": self.name,
            "step": self.step,
            "role": self.role,
            "rows": self.rows,
            "elapsed_s": round(now - self.started, 3),
            "deadline_s": self.deadline_s,
            "deadline_from": self.why,
        }


Dumper = Callable[[Path, str], list[str]]  # (hang folder, header) -> lines for the report


class Watchdog:
    """Deadlines for the phases of one run. `start()` from the thread that runs them (it is the one
    interrupted), `stop()` when the run ends (also after a timeout: a stop within grace_s prevents
    the hard exit)."""

    def __init__(
        self,
        run_dir: str | Path,
        policy: DeadlinePolicy,
        *,
        grace_s: float = 30.0,
        poll_s: float = 0.2,
        exit_process: Callable[[int], None] = os._exit,
    ):
        self.run_dir, self.policy = Path(run_dir), policy
        self.grace_s, self.poll_s, self.exit_process = grace_s, poll_s, exit_process
        self.dumpers: list[tuple[str, Dumper]] = []
        self.active: list[ActivePhase] = []
        self.fired: dict[str, Any] | None = None  # the report of the deadline that passed
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._target: int | None = None  # ident of the thread running the phases
        self._previous_handler: Any = None
        self._message = "watchdog: a phase passed its deadline"

    # --- lifecycle ---------------------------------------------------------------------------
    def add_dumper(self, name: str, dumper: Dumper) -> None:
        """`dumper(folder, header)` writes the stacks of processes beyond this one (a worker group's
        ranks) into the folder and returns a line per process for the report."""
        self.dumpers.append((name, dumper))

    def start(self) -> None:
        self._target = threading.get_ident()
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(INTERRUPT_SIGNAL, self._raise_timeout)
        self._stopped.clear()
        self._thread = threading.Thread(target=self._monitor, name="stratarl-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        if self._previous_handler is not None:
            signal.signal(INTERRUPT_SIGNAL, self._previous_handler)
            self._previous_handler = None

    @contextmanager
    def phase(
        self, name: str, *, step: int | None = None, role: str = "controller", rows: int | None = None
    ) -> Iterator[None]:
        """Run the block under the phase's deadline; its duration is measured for later deadlines."""
        deadline, why = self.policy.deadline(name)
        entry = ActivePhase(name, step, role, rows, time.monotonic(), deadline, why)
        with self._lock:
            self.active.append(entry)
        try:
            yield
        finally:
            with self._lock:
                self.active.remove(entry)
            if self.fired is None:
                self.policy.record(name, time.monotonic() - entry.started)

    # --- the monitor thread --------------------------------------------------------------------
    def _monitor(self) -> None:
        while not self._stopped.wait(self.poll_s):
            now = time.monotonic()
            with self._lock:
                expired = [p for p in self.active if now - p.started > p.deadline_s]
                stack = [p.describe(now) for p in self.active]
            if expired:
                self._fire(expired[0], stack)
                return

    def _fire(self, phase: ActivePhase, stack: list[dict[str, Any]]) -> None:
        step = phase.step if phase.step is not None else "-"
        folder = self.run_dir / HANG_DIR / f"step{step}-{phase.name}-{int(time.time())}"
        header = f"watchdog: phase {phase.name!r} past its {phase.deadline_s:g} s deadline"
        controller = folder / f"stacks-controller-pid{os.getpid()}.txt"
        dump_this_process(controller, header)
        processes = [f"controller pid {os.getpid()}: {controller}"]
        for name, dumper in self.dumpers:
            try:
                processes += dumper(folder, header)
            except Exception as error:  # a broken dumper must not keep the run from stopping
                processes.append(f"{name}: dump failed: {type(error).__name__}: {error}")
        busy = [line.split(" (", 1)[0] for line in processes if BUSY in line]
        inner = stack[-1] if stack else phase.describe(time.monotonic())
        waiting = (
            f"waiting on {', '.join(busy)} ({BUSY})"
            if busy
            else f"the controller (pid {os.getpid()}) was in phase {inner['phase']!r}"
        )
        message = (
            f"watchdog: phase {phase.name!r} (role {phase.role}, step {phase.step}) passed its deadline of "
            f"{phase.deadline_s:g} s ({phase.why}); {waiting}. Stacks of every process: {folder}"
        )
        report: dict[str, Any] = {
            "message": message,
            "expired": phase.describe(time.monotonic()),
            "active_phases": stack,
            "controller_pid": os.getpid(),
            "busy": busy,
            "processes": processes,
        }
        (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        self.fired = report
        print(message, file=sys.stderr, flush=True)
        self._interrupt(message)
        if not self._stopped.wait(self.grace_s):
            print(
                f"{message}\nwatchdog: the run did not stop within {self.grace_s:g} s of the interrupt "
                f"(stuck in a call Python cannot interrupt); exiting with code {HARD_EXIT_CODE}",
                file=sys.stderr,
                flush=True,
            )
            self.exit_process(HARD_EXIT_CODE)

    def _interrupt(self, message: str) -> None:
        """Raise WatchdogTimeout in the thread that runs the phases."""
        self._message = message
        if self._previous_handler is not None:  # the main thread: a signal interrupts a blocking call
            signal.pthread_kill(threading.main_thread().ident, INTERRUPT_SIGNAL)
        elif self._target is not None:  # another thread: raised at its next bytecode
            timeout = type("WatchdogTimeoutInThread", (WatchdogTimeout,), {"__init__": _init_with(message)})
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(self._target), ctypes.py_object(timeout)
            )

    def _raise_timeout(self, signum: int, frame: Any) -> None:
        raise WatchdogTimeout(self._message)


def _init_with(message: str) -> Callable[..., None]:
    def __init__(self: BaseException, *args: Any) -> None:
        BaseException.__init__(self, message)

    return __init__


def deadline_policy(
    *,
    phase_timeouts_s: Mapping[str, float],
    initial_timeout_s: float,
    warmup_steps: int,
    scale: float,
    floor_s: float,
) -> DeadlinePolicy:
    """The policy from the `watchdog.*` settings (as keyword arguments)."""
    return DeadlinePolicy(
        fixed=dict(phase_timeouts_s),
        initial_s=initial_timeout_s,
        warmup_runs=warmup_steps,
        scale=scale,
        floor_s=floor_s,
    )
