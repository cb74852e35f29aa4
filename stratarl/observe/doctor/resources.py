"""Cross-cutting: the doctor's checks of compute & environment resources — where memory peaks and
whether it grows step after step, where a step's time goes (and how much the controller's own
work, the observer's, takes).
"""

from __future__ import annotations

import itertools

from stratarl.observe.doctor.checks import _steps
from stratarl.observe.doctor.view import COMPUTE, CROSS_CUTTING, Finding, RunView

MEMORY_PROBLEM, MEMORY_WARNING = 0.9, 0.75  # peak over the machine's total
IDLE_WARNING = 0.3  # share of a step outside every timed phase
GROWTH_SHARE, GROWTH_MIN_GB = 0.2, 0.5  # memory in use grew this much (share of its start, and GiB) ...
GROWTH_RISING = 0.8  # ... rising on at least this share of consecutive steps: it accumulates


def _peak(view: RunView, kind: str) -> tuple[float, str | None, int | None]:
    """(the highest peak in GiB, the phase that set it, its step) of `memory/<kind>_peak_gb/<phase>`."""
    best = (0.0, None, None)
    for r in view.train:
        for key, value in r.items():
            if (
                key.startswith(f"memory/{kind}_peak_gb/")
                and isinstance(value, int | float)
                and value > best[0]
            ):
                best = (float(value), key.rsplit("/", 1)[1], int(r["step"]))
    return best


def check_memory(view: RunView, earlier: list[Finding]) -> list[Finding]:
    findings = []
    for kind, label in (("host", "host (RSS of the trainer process)"), ("device", "device (CUDA allocator)")):
        totals = view.series(f"memory/{kind}_total_gb")
        peaks = view.series(f"memory/{kind}_peak_gb")
        if not totals or not peaks:
            continue
        total, peak = totals[-1][1], max(v for _, v in peaks)
        value, phase, step = _peak(view, kind)
        share = peak / total if total else 0.0
        severity = "problem" if share >= MEMORY_PROBLEM else "warning" if share >= MEMORY_WARNING else "info"
        where = f"set in phase {phase!r} at step {step}" if phase else "set before the first step (loading)"
        findings.append(
            Finding(
                severity,
                COMPUTE,
                f"{label} memory peak {peak:.2f} GiB ({share:.0%} of {total:.1f} GiB), {where}",
                [
                    f"memory/{kind}_peak_gb {peak:.2f}; memory/{kind}_peak_gb/{phase} {value:.2f}"
                    if phase
                    else f"memory/{kind}_peak_gb {peak:.2f}"
                ],
                ""
                if severity == "info"
                else f"the {phase or 'start-up'} phase needs less memory: smaller micro-batches "
                "(*.trajectories_per_micro_batch, *.max_tokens_per_micro_batch), rollout."
                "trajectories_per_generate_batch, or more processes (cluster.training_workers)",
                key="memory",
            )
        )
    ranks = view.series("perf/max_memory_allocated_gb")
    if ranks and view.setting("cluster.backend") == "ray":
        findings.append(
            Finding(
                "info",
                COMPUTE,
                f"training ranks' peak memory {max(v for _, v in ranks):.2f} GiB (actor update, rank 0)",
                [f"perf/max_memory_allocated_gb {_steps(ranks)}"],
                key="memory",
            )
        )
    return findings


def check_memory_growth(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """Memory in use (perf/cpu_memory_used_gb, the trainer's RSS after each step) that grows step
    after step: something accumulates (batches or trajectories kept alive, a cache), and the run
    will meet the machine's limit at the slope shown."""
    used, totals = view.series("perf/cpu_memory_used_gb"), view.series("memory/host_total_gb")
    if len(used) < 5:
        return []
    rising = sum(b > a for (_, a), (_, b) in itertools.pairwise(used)) / (len(used) - 1)
    grown = used[-1][1] - used[0][1]
    if rising < GROWTH_RISING or grown < GROWTH_MIN_GB or grown < GROWTH_SHARE * used[0][1]:
        return []
    slope = grown / (used[-1][0] - used[0][0])
    evidence = [
        f"perf/cpu_memory_used_gb {used[0][1]:.2f} at step {used[0][0]} → {used[-1][1]:.2f} at step "
        f"{used[-1][0]}: +{slope * 1024:.0f} MiB a step, rising on {rising:.0%} of steps"
    ]
    if totals and slope > 0:
        evidence.append(
            f"at this slope the machine's {totals[-1][1]:.1f} GiB are reached in "
            f"~{(totals[-1][1] - used[-1][1]) / slope:.0f} more steps"
        )
    _, phase, step = _peak(view, "host")
    if phase:
        evidence.append(f"the phase that last raised the peak: {phase!r} (step {step})")
    return [
        Finding(
            "warning",
            COMPUTE,
            f"memory grows every step: +{grown:.2f} GiB over {len(used)} steps",
            evidence,
            "something is kept from step to step: look for batches, trajectories or traces held in a list "
            "(trainer.save_trajectories, trace.max_trajectories_per_step), and compare "
            "memory/host_peak_gb/<phase> across steps to find the phase that grows",
            key="memory_growth",
        )
    ]


def check_throughput(view: RunView, earlier: list[Finding]) -> list[Finding]:
    steps = [
        r for r in view.train if isinstance(r.get("timing_s/step"), int | float) and r["timing_s/step"] > 0
    ]
    if not steps:
        return []
    phases = sorted({k for r in steps for k in r if k.startswith("timing_s/") and k != "timing_s/step"})
    total = sum(r["timing_s/step"] for r in steps)
    shares = {p.removeprefix("timing_s/"): sum(float(r.get(p, 0.0)) for r in steps) / total for p in phases}
    idle = max(0.0, 1.0 - sum(shares.values()))
    top = sorted(shares.items(), key=lambda kv: -kv[1])[:3]
    evidence = [
        f"mean step {total / len(steps):.2f} s over {len(steps)} steps; "
        + ", ".join(f"{p} {s:.0%}" for p, s in top)
    ]
    evidence.append(f"outside any phase (metrics, logging): {idle:.0%}")
    findings = [
        Finding(
            "info",
            COMPUTE,
            f"time: {top[0][0]} takes {top[0][1]:.0%} of a step",
            evidence,
            key="throughput",
        )
    ]
    if idle >= IDLE_WARNING:
        findings.append(
            Finding(
                "warning",
                CROSS_CUTTING,
                f"{idle:.0%} of each step is spent outside the timed phases",
                evidence,
                "the controller's own work dominates (metrics, the trajectory JSONL, tracing): set "
                "trainer.save_trajectories=false or a smaller trace.fraction, and look at timing_s/trace",
                key="throughput",
            )
        )
    return findings
