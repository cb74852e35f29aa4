"""Cross-cutting: the doctor's diagnosis — every check in order, and `stratarl doctor RUN`'s output.

The learning map's stage 5: before reading code, decide which of the six layers a failure is in
(config, control flow, orchestration, data transport, compute & environment, RL math; the observer's
own cost is cross-cutting). Each check (the modules `checks`, `sampling`, `collapse`, `reward`,
`learning`, `system`, `resources`, `run_state` of this package) looks at metrics.jsonl, the trace,
the config, run.lock, run.json and the hang reports, and returns findings naming the cause, the
evidence (metrics, steps, a trajectory to trace) and the next thing to try; where two causes share a
symptom, the evidence that tells them apart. Severities: `problem` (the run cannot learn as
configured, or stopped), `warning` (it learns worse than it could), `info` (where time and memory
go). A healthy run has no problem and no warning. Works on a run still being written (a partial last
line of metrics.jsonl is left for later; trace files appear whole).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from stratarl.observe.doctor import checks as data_checks
from stratarl.observe.doctor import collapse as collapse_checks
from stratarl.observe.doctor import distillation as distillation_checks
from stratarl.observe.doctor import learning as learning_checks
from stratarl.observe.doctor import resources as resource_checks
from stratarl.observe.doctor import reward as reward_checks
from stratarl.observe.doctor import sampling as sampling_checks
from stratarl.observe.doctor import sft as sft_checks
from stratarl.observe.doctor import system as system_checks
from stratarl.observe.doctor.run_state import check_progress, run_status
from stratarl.observe.doctor.view import SEVERITIES, Finding, RunView, load_run

# In order: a later check sees the findings of the earlier ones and defers to a named cause (a
# broken policy explains truncation and missing signal; a misconfigured EOS explains truncation).
CHECKS = (
    system_checks.check_hangs,
    sft_checks.check_sft,
    sampling_checks.check_tokenizer_mismatch,
    data_checks.check_reward_constant,
    data_checks.check_scorer_failures,
    data_checks.check_parse_failures,
    data_checks.check_tool_failures,
    data_checks.check_gateway_splits,
    sampling_checks.check_prompts_dropped,
    sampling_checks.check_eos,
    collapse_checks.check_negative_entropy_bonus,
    collapse_checks.check_policy_broken,
    sampling_checks.check_cold_sampling,
    collapse_checks.check_repetition,
    reward_checks.check_shortcut,
    reward_checks.check_length_hacking,
    reward_checks.check_reward_sign,
    reward_checks.check_format_saturation,
    data_checks.check_truncation,
    data_checks.check_group_signal,
    data_checks.check_policy_moves,
    data_checks.check_entropy,
    reward_checks.check_flat_validation,
    learning_checks.check_kl_loss,
    distillation_checks.check_teacher_against_reward,
    learning_checks.check_critic,
    system_checks.check_numerics,
    system_checks.check_staleness,
    system_checks.check_logprob_mismatch,
    resource_checks.check_memory,
    resource_checks.check_memory_growth,
    resource_checks.check_throughput,
    check_progress,
)


def diagnose(view: RunView) -> list[Finding]:
    """Every check's findings, problems first, in check order within a severity."""
    findings: list[Finding] = []
    for check in CHECKS:
        findings += check(view, findings)
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


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
