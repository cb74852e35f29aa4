"""Progress: where the console is not a terminal, one plain line every N steps (about ten a run, and
the last step) with step/total, seconds per step and the ETA; in a terminal, a bar instead."""

import io
import re

import pytest
from rich.console import Console

from stratarl.observe.progress import StepProgress, format_duration, line_interval, progress_line

LINE = re.compile(
    r"^training: step (\d+)/(\d+) \((\d+)%\)  ([\d.]+) s/step  elapsed (\S+( \S+)?)  ETA (\S+( \S+)?)$"
)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def run(total, start=0, seconds_per_step=2.5, terminal=False):
    out, clock = io.StringIO(), FakeClock()
    console = Console(file=out, force_terminal=terminal, width=200)
    with StepProgress(console, total=total, start=start, clock=clock) as progress:
        for step in range(start + 1, total + 1):
            clock.now += seconds_per_step
            progress.advance(step)
    return out.getvalue().splitlines()


def test_about_ten_lines_a_run_and_always_the_last_step():
    lines = run(total=60)
    steps = [int(LINE.match(line).group(1)) for line in lines]
    assert steps == [6, 12, 18, 24, 30, 36, 42, 48, 54, 60]
    assert run(total=7)[-1].startswith("training: step 7/7 (100%)")
    assert [int(LINE.match(line).group(1)) for line in run(total=95)][-2:] == [90, 95]  # every 10, and 95


def test_the_line_gives_the_rate_and_the_eta_of_the_remaining_steps():
    lines = run(total=60, seconds_per_step=2.5)
    # step 30: 30 steps in 75 s, 2.5 s/step; 30 steps left → 75 s = 1m 15s
    assert lines[4] == "training: step 30/60 (50%)  2.5 s/step  elapsed 1m 15s  ETA 1m 15s"
    assert lines[-1].endswith("ETA 0s")


def test_a_resumed_run_measures_only_its_own_steps():
    # resumed at step 40 of 60: step 42 is 2 steps in 6 s, 3 s/step; 18 left → 54 s
    lines = run(total=60, start=40, seconds_per_step=3.0)
    assert lines[0] == "training: step 42/60 (70%)  3 s/step  elapsed 6s  ETA 54s"


def test_a_terminal_gets_a_bar_not_the_lines():
    assert not any(LINE.match(line) for line in run(total=20, terminal=True))


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0s"), (42, "42s"), (185, "3m 05s"), (7440, "2h 04m")])
def test_durations_read_as_a_person_writes_them(seconds, text):
    assert format_duration(seconds) == text


def test_intervals_and_the_line_format():
    assert [line_interval(n) for n in (1, 5, 10, 60, 95, 1000)] == [1, 1, 1, 6, 10, 100]
    assert progress_line("sft", 3, 4, seconds_per_step=0.5, elapsed_s=1.5) == (
        "sft: step 3/4 (75%)  0.5 s/step  elapsed 2s  ETA 0s"
    )
