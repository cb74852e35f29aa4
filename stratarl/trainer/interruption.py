"""Layer 2, control flow: Ctrl-C stops a run (`stratarl train`, `stratarl sft`) at a safe point.

The first SIGINT only asks (`StopRequest`): the step that runs finishes, the trainer saves what it
may, marks run.json `interrupted` and raises `RunInterrupted`, whose message is the one line the
command prints (what is saved, the command that continues). A second SIGINT exits at once with
code 130, as a kill would leave the run: checkpoints and run.json are written atomically.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process Ctrl-C ended
ACKNOWLEDGED = (
    "stratarl: Ctrl-C: stopping once the current step is done (saving where trainer.save_freq allows); "
    "Ctrl-C again stops at once\n"
)


class RunInterrupted(KeyboardInterrupt):
    """The run stopped at a safe point after Ctrl-C; the message says what is saved and how to go on.
    A KeyboardInterrupt (a BaseException), so that code catching Exception cannot swallow it."""


class StopRequested(BaseException):
    """Raised between steps once Ctrl-C asked to stop: the loop stops after step `step` (done).
    can_save=False: a step failed after the signal, so the state in memory is not a step's end."""

    def __init__(self, step: int, *, can_save: bool = True):
        super().__init__(f"stop requested after step {step}")
        self.step, self.can_save = step, can_save


class StopRequest:
    """Ctrl-C as a request to stop between steps. `armed(on_second)` installs the SIGINT handler (in
    the main thread; elsewhere Python delivers no signal, and nothing changes) for the block: the
    first SIGINT sets `requested`, a second calls `on_second()` (best effort: it marks the run and
    returns the line to print) and exits with code 130."""

    def __init__(self, *, exit_process: Callable[[int], Any] = os._exit):
        self.requested = False
        self.exit_process = exit_process
        self._on_second: Callable[[], str] | None = None

    @contextlib.contextmanager
    def armed(self, on_second: Callable[[], str]) -> Iterator[StopRequest]:
        self._on_second = on_second
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGINT, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    def check(self, done_step: int) -> None:
        """Between steps: raise StopRequested(done_step) once Ctrl-C asked to stop."""
        if self.requested:
            raise StopRequested(done_step)

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.requested:
            self.requested = True
            _write(ACKNOWLEDGED)
            return
        try:
            line = self._on_second() if self._on_second is not None else "stopped at once (second Ctrl-C)"
        except Exception as error:  # the exit must happen whatever the record did
            line = f"stopped at once (second Ctrl-C); the run record could not be written: {error}"
        # on a line of its own: the signal may land while the main thread has written half a line
        # (a progress bar drawn with \r, a message in pieces)
        _write(f"\n{_program()}: {line}\n")
        self.exit_process(EXIT_INTERRUPTED)


def _write(text: str) -> None:
    """Straight to fd 2: a signal handler must not re-enter a buffered stream the main thread may
    be writing."""
    with contextlib.suppress(OSError):
        os.write(2, text.encode())


def _program() -> str:
    command = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else ""
    return f"stratarl {command}".strip()


def continue_command(argv: Sequence[str] | None = None, *, extra: Sequence[str] = ()) -> str:
    """The command line that started this process, as a shell would take it again (shlex quoting):
    `python -m stratarl ...` for the module, `stratarl ...` where that is the script on PATH."""
    argv = list(sys.argv if argv is None else argv)
    head, rest = argv[0], argv[1:]
    if Path(head).name == "__main__.py":
        python = Path(sys.executable).name
        found = shutil.which(python)
        exe = python if found and Path(found).resolve() == Path(sys.executable).resolve() else sys.executable
        words = [exe, "-m", "stratarl"]
    else:
        found = shutil.which("stratarl")
        on_path = found is not None and Path(found).resolve() == Path(head).resolve()
        words = ["stratarl" if on_path else head]
    return shlex.join([*words, *rest, *extra])


def stopped_line(
    *, step: int, total: int, saved: tuple[int, Path] | None, save_freq: int, resumable: bool = True
) -> str:
    """The one line an interrupted run prints. saved: (step, path) of the newest checkpoint, None when
    there is none; resumable=False: a kind of run that never resumes (SFT)."""
    head = f"interrupted after step {step} of {total}"
    if saved is not None:
        what = "saved" if saved[0] == step else "nothing new saved; newest"
        return f"{head}; {what} checkpoint step {saved[0]} in {saved[1]}; continue with: {continue_command()}"
    if not resumable:
        why = "SFT keeps no checkpoints"
    elif save_freq <= 0:
        why = f"trainer.save_freq={save_freq} keeps no checkpoints; trainer.save_freq=N makes a run resumable"
    else:
        why = "no step finished in this start"
    again = continue_command(extra=["trainer.overwrite=true"])
    return f"{head}; nothing is saved ({why}); start again with: {again}"
