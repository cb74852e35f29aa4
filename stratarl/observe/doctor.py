"""Cross-cutting: `stratarl doctor RUN` — read a run's own records, say what is wrong and in which layer.

The learning map's stage 5: before reading code, decide whether a failure is one of data,
algorithm, parallelism, weight sync, or compute & environment. Each check of `doctor_checks`
looks at metrics.jsonl, the trace, the config and the hang reports, and returns findings with the
evidence and the next thing to try. Severities: `problem` (the run cannot learn as configured, or
stopped), `warning` (it learns worse than it could), `info` (where time and memory go). A healthy
run has no problem and no warning. Works on a run still being written (a partial last line of
metrics.jsonl is left for later; trace files appear whole).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from stratarl.observe import doctor_checks as data_checks
from stratarl.observe import doctor_system as system_checks
from stratarl.observe.doctor_view import LIVE_WITHIN_S, SEVERITIES, Finding, RunView, load_run

# In order: a later check sees the findings of the earlier ones (and defers to them).
CHECKS = (
    system_checks.check_hangs,
    data_checks.check_reward_constant,
    data_checks.check_scorer_failures,
    data_checks.check_parse_failures,
    data_checks.check_truncation,
    data_checks.check_group_signal,
    data_checks.check_policy_moves,
    data_checks.check_entropy,
    system_checks.check_numerics,
    system_checks.check_staleness,
    system_checks.check_logprob_mismatch,
    system_checks.check_memory,
    system_checks.check_throughput,
    system_checks.check_progress,
)


def diagnose(view: RunView) -> list[Finding]:
    """Every check's findings, problems first, in check order within a severity."""
    findings: list[Finding] = []
    for check in CHECKS:
        findings += check(view, findings)
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


def run_status(view: RunView) -> str:
    steps = [int(r["step"]) for r in view.train]
    total = view.setting("trainer.total_steps")
    of = f" of {total}" if total else ""
    done = f"steps {min(steps)}..{max(steps)}" if steps else "no training step logged yet"
    live = view.modified_s_ago is not None and view.modified_s_ago < LIVE_WITHIN_S
    finished = (view.run_dir / "final").is_dir()
    state = "finished" if finished else "live (written to in the last 2 minutes)" if live else "not finished"
    return f"{done}{of if steps else f' (total {total})' if total else ''}, {state}"


STYLES = {"problem": "bold red", "warning": "yellow", "info": "cyan"}


def render(view: RunView, findings: list[Finding], console: Console) -> None:
    console.print(f"[bold]stratarl doctor[/bold] {view.run_dir}  ({run_status(view)})")
    alarming = [f for f in findings if f.severity != "info"]
    for finding in findings:
        style = STYLES[finding.severity]
        label = f"[{style}]{finding.severity.upper()}[/{style}] [bold]\\[{finding.layer}][/bold]"
        console.print(f"\n{label} {finding.title}")
        for line in finding.evidence:
            console.print(f"  · {line}", highlight=False)
        if finding.next_step:
            console.print(f"  [green]next:[/green] {finding.next_step}", highlight=False)
    verdict = (
        f"{sum(f.severity == 'problem' for f in findings)} problem(s), "
        f"{sum(f.severity == 'warning' for f in findings)} warning(s)"
        if alarming
        else "nothing alarming: no problem, no warning"
    )
    console.print(f"\n[bold]verdict:[/bold] {verdict}")


def doctor_command(run: str | Path, *, as_json: bool = False, console: Console | None = None) -> int:
    """What `stratarl doctor` does; exit code 1 when a problem was found, 2 when RUN is no run."""
    console = console or Console()
    try:
        view = load_run(run)
    except FileNotFoundError as error:
        console.print(f"[red]stratarl doctor:[/red] {error}")
        return 2
    findings = diagnose(view)
    if as_json:
        print(json.dumps({"run_dir": str(view.run_dir), "status": run_status(view),
                          "findings": [asdict(f) for f in findings]}, indent=2))  # fmt: skip
    else:
        render(view, findings, console)
    return 1 if any(f.severity == "problem" for f in findings) else 0
