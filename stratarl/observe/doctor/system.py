"""Cross-cutting: the doctor's checks of the system layers — hangs and dead workers, numerics, weight
sync (staleness, rollout/training log-prob mismatch). Memory and time: `resources`.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

from stratarl.observe.doctor.checks import _late, _mean
from stratarl.observe.doctor.run_state import resume_advice
from stratarl.observe.doctor.view import (
    COMPUTE,
    CONFIG,
    CONTROL_FLOW,
    ORCHESTRATION,
    RL_MATH,
    TRANSPORT,
    Finding,
    RunView,
)
from stratarl.observe.stack_dumps import main_thread_frames

MISMATCH_KL_PROBLEM, MISMATCH_KL_WARNING = 0.05, 0.005  # |rollout_corr/kl|, both sides half precision
SAME_PRECISION_KL_PROBLEM, SAME_PRECISION_KL_WARNING = 1e-3, 1e-5  # ... fp32 on either side (mismatch_lines)


def _error_finding(view: RunView, report: dict[str, Any]) -> list[Finding]:
    """A run that stopped with an exception; nothing when a worker group's report already explains it."""
    if report["exception"] == "WorkerError" and any("reasons" in r for r in view.hangs):
        return []
    frames = report.get("frames", [])
    layer = _hang_layer({"phase": str(report.get("phase") or "").split(" ")[0]}, frames)
    where = f" in phase {report['phase']}" if report.get("phase") else ""
    return [
        Finding(
            "problem",
            layer,
            f"the run stopped with {report['exception']}{where}",
            [str(report["message"])[:300], *[f"at {frame}" for frame in frames[:3]]],
            f"the innermost frames say which layer raised; fix it, then {resume_advice(view)}",
            key="error",
        )
    ]


# --- hangs and dead workers -------------------------------------------------------------------------
# (pattern in a stack frame, layer), tried in order on each frame from the innermost out. Ranks that wait in a
# collective, and a weight push between the actor and its replicas, are the worker group's
# (orchestration: which process runs what, and what reaches it); the other layers by their package.
LAYER_BY_FRAME = (
    (re.compile(r"torch/distributed|process_group|all_reduce|broadcast|all_gather|fsdp"), ORCHESTRATION),
    (re.compile(r"weight_sync|push_weights|load_weights|sync_weights|receive_weights"), ORCHESTRATION),
    (re.compile(r"stratarl/algo/|actor_loss\.py|critic_loss\.py"), RL_MATH),
    (re.compile(r"stratarl/transport/"), TRANSPORT),
    (re.compile(r"stratarl/config/"), CONFIG),
    (re.compile(r"stratarl/cluster/"), ORCHESTRATION),
    (re.compile(r"stratarl/(data|reward|agent|rollout|engine)/|prompt_dataset|collate"), COMPUTE),
    (re.compile(r"stratarl/(trainer|run_directory)/"), CONTROL_FLOW),
)
LAYER_BY_PHASE = {"update_weights": ORCHESTRATION, "weight_sync": ORCHESTRATION}


def stuck_frames(stack_file: Path) -> list[str]:
    """The innermost frames of the main thread in a faulthandler dump file; [] if none."""
    return main_thread_frames(stack_file.read_text(encoding="utf-8", errors="replace"))


def _hang_layer(report: dict[str, Any], frames: list[str]) -> str:
    """The layer of the innermost frame that names one (frames are innermost first), else the phase's."""
    for frame in frames:
        for pattern, layer in LAYER_BY_FRAME:
            if pattern.search(frame):
                return layer
    phase = report.get("expired", {}).get("phase") or report.get("phase", "")
    return LAYER_BY_PHASE.get(str(phase).replace("rollout.", ""), COMPUTE)


def check_hangs(view: RunView, earlier: list[Finding]) -> list[Finding]:
    findings = []
    for report in view.hangs:
        if "exception" in report:
            findings += _error_finding(view, report)
            continue
        folder = Path(report["folder"])
        stacks = sorted(folder.glob("stacks-*.txt"))
        ranks = [p for p in stacks if "controller" not in p.name]
        frames = {p.name: stuck_frames(p) for p in stacks}
        deepest = next((frames[p.name] for p in ranks if frames[p.name]), None) or next(
            (f for f in frames.values() if f), []
        )
        evidence = [str(report.get("message"))]
        evidence += [f"{name}: stuck at {f[0].strip()}" for name, f in frames.items() if f]
        evidence += [str(line) for line in report.get("processes", [])[:8]]
        if "expired" in report:  # the watchdog: a phase passed its deadline
            expired = report["expired"]
            phase, deadline = expired["phase"], expired["deadline_s"]
            title = f"hang: phase {phase!r} passed its {deadline:g} s deadline (step {expired['step']})"
            advice = (
                f"read the innermost frames in {folder}/stacks-*.txt (each process waits there); if the "
                f"phase is only slow, raise watchdog.phase_timeouts_s.{phase} or watchdog.scale"
            )
        else:  # a worker group: ranks that died, raised or did not answer
            reasons = report.get("reasons", {})
            title = f"{report.get('role')} ranks {sorted(reasons)} failed in phase {report.get('phase')!r}"
            died = any("died" in str(why) for why in reasons.values())
            advice = (
                "a rank process died: look for an out-of-memory kill (dmesg, the memory finding) or a crash "
                f"in its log; {resume_advice(view)}"
                if died
                else f"compare the ranks' stacks in {folder}: a rank that waits in a collective while "
                "another is elsewhere is a parallelism bug; raise cluster.call_timeout_s if the phase is "
                "only slow"
            )
        layer = _hang_layer(report, deepest)
        if "reasons" in report and any("died" in str(why) for why in report["reasons"].values()):
            layer = ORCHESTRATION
        findings.append(Finding("problem", layer, title, evidence, advice, key="hang"))
    return findings


def check_numerics(view: RunView, earlier: list[Finding]) -> list[Finding]:
    skipped = view.series("actor/skipped_steps")
    bad = [r["step"] for r in view.train if any(v in ("nan", "inf", "-inf") for v in r.values())]
    findings = []
    if skipped and skipped[-1][1] > 0:
        findings.append(
            Finding(
                "problem" if skipped[-1][1] >= len(skipped) / 2 else "warning",
                COMPUTE,
                f"{int(skipped[-1][1])} optimizer steps were skipped for a non-finite gradient norm",
                [f"actor/skipped_steps {int(skipped[-1][1])} by step {skipped[-1][0]}"],
                "look for inf/NaN in log-probs (a 0-probability token), advantages or the loss; mixed "
                "precision (model.dtype) and a lower actor.lr are the usual remedies",
                key="numerics",
            )
        )
    if bad:
        findings.append(
            Finding(
                "problem",
                COMPUTE,
                f"non-finite metrics on steps {bad[:8]}",
                ["metrics.jsonl holds nan/inf values"],
                "find the first phase whose metric is not finite",
                key="numerics",
            )
        )
    return findings


# --- weight sync and staleness --------------------------------------------------------------------
def staleness_bound(view: RunView) -> int:
    """The staleness the run's trainer.mode allows: 0 (sync: each step generates with the weights it
    trains), 1 (one_step_off), async_training.max_staleness (async)."""
    mode = view.setting("trainer.mode") or "sync"  # runs from before trainer.mode were sync
    if mode == "async":
        return int(view.setting("async_training.max_staleness"))
    return 1 if mode == "one_step_off" else 0


def check_staleness(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """Trajectories trained by weights newer than those that generated them (past the bound of the
    run's trainer.mode), and pushed weight versions that do not advance by one per step."""
    findings, max_staleness = [], staleness_bound(view)
    stale = view.series("rollout/staleness/max")
    over = [(s, v) for s, v in stale if v > max_staleness]
    # sync: the weight push did not reach a replica (orchestration); an asynchronous mode: its batch
    # source let batches older than its bound through (control flow, trainer/async_batches.py)
    layer = ORCHESTRATION if max_staleness == 0 else CONTROL_FLOW
    if over:
        findings.append(
            Finding(
                "problem",
                layer,
                f"stale samples: trajectories trained {int(max(v for _, v in over))} weight versions after "
                "the ones that generated them",
                [
                    f"rollout/staleness/max > {max_staleness} on {len(over)} of {len(stale)} steps "
                    f"(first: step {over[0][0]})"
                ],
                "the rollout serves old weights: check that every step's sync reaches every replica "
                "(rollout/weight_version)"
                if max_staleness == 0
                else "batches older than the mode's bound reached the update (trainer.mode="
                f"{view.setting('trainer.mode')}, bound {max_staleness}): the batch source should drop them "
                "(async/dropped_samples counts what it drops); check trainer/async_batches.py's bound",
                key="stale",
            )
        )
    versions = view.series("rollout/weight_version")  # async pushes every k steps: one version per step
    jumps = [(a, b) for (i, a), (j, b) in itertools.pairwise(versions) if b - a != j - i]
    if jumps:
        findings.append(
            Finding(
                "problem",
                ORCHESTRATION,
                "the served weight version does not advance by one per step",
                [f"rollout/weight_version goes {jumps[0][0]:g} → {jumps[0][1]:g} ({len(jumps)} steps)"],
                "a weight sync was skipped or repeated: the rollout generated with weights the actor no "
                "longer has; see the update_weights phase (timing_s/update_weights, "
                "rollout/weight_sync_bytes)",
                key="stale",
            )
        )
    return findings


HALF_PRECISION = ("bfloat16", "bf16", "float16", "fp16", "half")


def mismatch_lines(view: RunView) -> tuple[float, float, str]:
    """(warning, problem) lines of |rollout_corr/kl| for the run's precisions, and which they are.

    The same weights in the same precision give the same log-probs up to kernel noise: over 213
    healthy fp32 sync test runs the largest |KL| of any step was 2.9e-7 (the quickstart: < 1e-7), so
    1e-5 (35× that) is a warning and 1e-3 a problem. A rollout in bf16 over fp32 training
    (rollout.dtype) measured 3.2e-4 with nothing else wrong: that gap is the precision's, named as
    such above 1e-5 (the fix is the dtype or a correction, not a bug hunt). Both sides in half
    precision round alike, and one bf16 ulp (2^-8 of a logit) gives per-token KLs near 1e-3: there
    the lines are 5e-3 and 5e-2."""
    train = str(view.setting("model.dtype") or "float32")
    rollout = str(view.setting("rollout.dtype") or train)
    if train in HALF_PRECISION and rollout in HALF_PRECISION:
        return MISMATCH_KL_WARNING, MISMATCH_KL_PROBLEM, f"rollout and training both in {rollout}"
    return SAME_PRECISION_KL_WARNING, SAME_PRECISION_KL_PROBLEM, f"rollout {rollout}, training {train}"


def check_logprob_mismatch(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """π_old (the trainer's forward) against π_rollout (the sampler's log-probs): the same weights
    should give the same numbers up to kernel and precision noise (`mismatch_lines`)."""
    kl = view.series("rollout_corr/kl")
    if not kl or staleness_bound(view) > 0:  # off-policy modes: π_old is newer than π_rollout by design
        return []
    warning, problem, precisions = mismatch_lines(view)
    late = _mean(_late(kl))
    if abs(late) < warning:
        return []
    diff = view.series("rollout_corr/log_ppl_abs_diff")
    first = kl[0][1]
    from_start = abs(first) >= warning
    train = str(view.setting("model.dtype") or "float32")
    dtype_differs = str(view.setting("rollout.dtype") or train) != train
    if dtype_differs and abs(late) < MISMATCH_KL_PROBLEM:
        cause = (
            f"the rollout serves its weights in another precision ({precisions}): a KL of this size from "
            "the first step is that precision's rounding, not a weight-sync fault (that would appear later)"
        )
        layer, advice = (
            COMPUTE,
            (
                f"set rollout.dtype to model.dtype ({train}) if the rollout can afford it, or keep the cheap "
                "dtype and correct for it: algorithm.rollout_correction.rollout_is (importance weights)"
            ),
        )
    else:
        layer = COMPUTE if from_start else ORCHESTRATION
        cause = (
            "already at the first step: the rollout computes log-probs differently (dtype, kernels, "
            "temperature or sampling filters)"
            if from_start
            else "it appears after the first steps: the rollout serves weights that differ from the actor's"
        )
        advice = (
            "compare rollout and model precision (model.dtype, the rollout's dtype); check the weight sync "
            "(rollout/weight_version, checksums); correct what remains with "
            "algorithm.rollout_correction.rollout_is"
        )
    # a precision gap alone stays a warning below the half-precision problem line
    is_problem = abs(late) >= (MISMATCH_KL_PROBLEM if dtype_differs else problem)
    return [
        Finding(
            "problem" if is_problem else "warning",
            layer,
            f"rollout and training log-probs disagree: KL {late:.3g} nats per token",
            [
                f"rollout_corr/kl: step {kl[0][0]} {first:.3g}, later half {late:.3g} (lines for "
                f"{precisions}: warning {warning:g}, problem {problem:g})"
            ]
            + ([f"rollout_corr/log_ppl_abs_diff later half {_mean(_late(diff)):.3g}"] if diff else [])
            + [cause],
            advice,
            key="mismatch",
        )
    ]
