"""Layer 1, config: what a run records about itself — `trace.*` (the per-trajectory trace) and
`watchdog.*` (deadlines of phases; a stack dump of every process when one passes).

The trace answers the ten questions of docs/design.md#the-ten-questions-of-a-trajectory for each
traced trajectory (`stratarl trace`); the watchdog turns a hang into an error naming the phase,
role and rank (`stratarl doctor` reads both).
"""

from __future__ import annotations

from dataclasses import dataclass

from stratarl.config.errors import ConfigProblem
from stratarl.config.setting import setting

# The phases the watchdog can give a deadline: the step, its timed phases (timing_s/<name>),
# writing the trace, validation and checkpoint saving.
WATCHED_PHASES = (
    "step",
    "gen",
    "gen_max",
    "wait_rollout",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
    "trace",
    "val",
    "save",
)


@dataclass
class TraceConfig:
    """Per-trajectory records, one parquet file per step under <run_dir>/traces."""

    enable: bool = setting(
        True,
        "write one record per traced trajectory (source, prompt, generation, turns, masks, reward, "
        "advantage, log-probs, update statistics, staleness) to <run_dir>/traces/step_<k>.parquet",
    )
    fraction: float = setting(
        1.0, "share of each step's prompt groups that are traced (whole groups, chosen by a seeded draw)"
    )
    max_trajectories_per_step: int | None = setting(
        None, "at most this many trajectories traced per step (whole groups); null: no cap"
    )
    max_total_mb: float = setting(
        512.0, "size bound of <run_dir>/traces: when a step file takes it past, the oldest steps are deleted"
    )


@dataclass
class WatchdogConfig:
    """A deadline for every phase; when one passes, every process of the run dumps its Python stacks
    into <run_dir>/hang/ and the run stops with an error naming the phase, role and rank."""

    enable: bool = setting(True, "watch every phase's deadline (a monitor thread in the trainer)")
    phase_timeouts_s: dict[str, float] = setting(
        {},
        "fixed deadlines in seconds by phase (" + ", ".join(WATCHED_PHASES) + "); "
        "a phase not named here gets the automatic deadline",
    )
    initial_timeout_s: float = setting(
        3600.0, "deadline of a phase during its first watchdog.warmup_steps runs (nothing measured yet)"
    )
    warmup_steps: int = setting(
        2, "runs of each phase that are measured before its automatic deadline applies"
    )
    scale: float = setting(
        10.0, "automatic deadline: max(floor_s, scale × the longest of the phase's measured runs)"
    )
    floor_s: float = setting(300.0, "the shortest automatic deadline, in seconds")
    grace_s: float = setting(
        30.0, "after a deadline: seconds for the run to stop cleanly before the process exits hard"
    )


def observe_problems(trace: TraceConfig, watchdog: WatchdogConfig) -> list[ConfigProblem]:
    """Values of trace.* and watchdog.* that cannot work, each naming its key."""
    problems = []
    if not 0 < trace.fraction <= 1:
        problems.append(ConfigProblem(("trace.fraction",), f"must be in (0, 1], got {trace.fraction!r}"))
    cap = trace.max_trajectories_per_step
    if cap is not None and cap < 1:
        problems.append(
            ConfigProblem(("trace.max_trajectories_per_step",), f"must be null or ≥ 1, got {cap}")
        )
    if trace.max_total_mb <= 0:
        problems.append(ConfigProblem(("trace.max_total_mb",), f"must be > 0, got {trace.max_total_mb!r}"))
    for phase, seconds in watchdog.phase_timeouts_s.items():
        key = f"watchdog.phase_timeouts_s.{phase}"
        if phase not in WATCHED_PHASES:
            problems.append(ConfigProblem((key,), f"unknown phase {phase!r}; valid: {list(WATCHED_PHASES)}"))
        elif isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
            problems.append(ConfigProblem((key,), f"must be a number of seconds > 0, got {seconds!r}"))
    for name in ("initial_timeout_s", "scale", "floor_s", "grace_s"):
        value = getattr(watchdog, name)
        if value <= 0:
            problems.append(ConfigProblem((f"watchdog.{name}",), f"must be > 0, got {value!r}"))
    if watchdog.warmup_steps < 1:
        problems.append(
            ConfigProblem(("watchdog.warmup_steps",), f"must be ≥ 1, got {watchdog.warmup_steps}")
        )
    return problems
