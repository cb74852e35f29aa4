"""Each doctor check on a run directory written by hand: the failure classes the short real runs of
tests/trainer/test_doctor_runs.py cannot plant cheaply (scorer errors, stale weights, log-prob
mismatch, memory, entropy collapse, dead ranks, a run killed from outside), each in its layer of
docs/architecture.md, and silence otherwise."""

import json
import os
import time

import yaml

from stratarl.observe.doctor.diagnosis import diagnose
from stratarl.observe.doctor.view import load_run

CONFIG = {"data": {"prompts_per_step": 8}, "rollout": {"n": 4, "max_response_tokens": 16},
          "actor": {"prompts_per_mini_batch": 8, "lr": 1e-4}, "trainer": {"total_steps": 10}}  # fmt: skip


def healthy_step(step):
    return {
        "step": step, "phase": "train", "critic/score/mean": 0.4 + 0.01 * step, "critic/score/min": 0.0,
        "critic/score/max": 1.0, "critic/advantages/max": 1.2, "critic/advantages/min": -1.1,
        "batch/groups_with_signal": 0.6, "response_length/clip_ratio": 0.02, "response_length/mean": 6.0,
        "actor/lr": 1e-4, "actor/grad_norm": 0.5, "actor/entropy": 0.4, "rollout/weight_version": float(step),
        "rollout/staleness/max": 0.0, "rollout_corr/kl": 1e-7, "reward/failures/total": 0.0,
        "timing_s/step": 1.0, "timing_s/gen": 0.5, "timing_s/update_actor": 0.4,
        "memory/host_peak_gb": 1.0, "memory/host_total_gb": 16.0, "memory/host_peak_gb/gen": 1.0,
    }  # fmt: skip


def write_run(path, steps=10, change=None, finished=True):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    records = [healthy_step(s) | (change(s) if change else {}) for s in range(1, steps + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if finished:
        (path / "final").mkdir()
    return path


def findings(path):
    return {f.key: f for f in diagnose(load_run(path))}


def test_a_healthy_record_has_only_information(tmp_path):
    found = diagnose(load_run(write_run(tmp_path / "run")))
    assert {f.severity for f in found} == {"info"}
    assert "gen" in next(f for f in found if f.key == "memory").title


def test_scorer_failures_are_compute_and_environment(tmp_path):
    run = write_run(
        tmp_path / "run", change=lambda s: {"reward/failures/total": 24.0, "reward/failures/timeout": 24.0}
    )
    problem = findings(run)["scorer_failures"]
    assert problem.severity == "problem" and problem.layer == "compute & environment"
    assert "75%" in problem.title and "timeout: 240" in " ".join(problem.evidence)


def test_stale_samples_and_a_skipped_sync_are_orchestration(tmp_path):
    run = write_run(tmp_path / "run", change=lambda s: {"rollout/staleness/max": 2.0} if s > 5 else {})
    assert findings(run)["stale"].layer == "orchestration"  # the weight push did not reach the rollout
    skipped = write_run(tmp_path / "skipped", change=lambda s: {"rollout/weight_version": float(min(s, 4))})
    problem = findings(skipped)["stale"]
    assert problem.layer == "orchestration" and "advance" in problem.title


def test_a_log_prob_mismatch_from_the_start_is_compute_later_is_orchestration(tmp_path):
    early = write_run(tmp_path / "early", change=lambda s: {"rollout_corr/kl": 0.1})
    assert findings(early)["mismatch"].layer == "compute & environment"
    late = write_run(tmp_path / "late", change=lambda s: {"rollout_corr/kl": 0.1 if s > 3 else 0.0})
    assert findings(late)["mismatch"].layer == "orchestration"
    assert findings(late)["mismatch"].severity == "problem"


def test_memory_near_the_machine_total_names_the_phase(tmp_path):
    peak = {"memory/host_peak_gb": 15.0, "memory/host_peak_gb/update_actor": 15.0}
    run = write_run(tmp_path / "run", change=lambda s: peak if s == 7 else {})
    problem = findings(run)["memory"]
    assert problem.severity == "problem" and "'update_actor' at step 7" in problem.title


def test_entropy_collapse_is_an_rl_math_warning(tmp_path):
    run = write_run(tmp_path / "run", change=lambda s: {"actor/entropy": 0.4 * 0.5**s})
    warning = findings(run)["entropy"]
    assert warning.severity == "warning" and warning.layer == "RL math"


def test_a_dead_rank_is_orchestration_and_a_run_killed_from_outside_is_noticed(tmp_path):
    run = write_run(tmp_path / "run", steps=4, finished=False)
    folder = run / "hang" / "actor-actor_update-1"
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps({
        "message": "actor worker group failed in phase 'actor.update': rank 1 died (OOM)", "role": "actor",
        "phase": "actor.update", "reasons": {"1": "died (the actor died unexpectedly)"}, "processes": [],
    }))  # fmt: skip
    hang = findings(run)["hang"]
    assert hang.layer == "orchestration" and "ranks ['1'] failed in phase 'actor.update'" in hang.title
    killed = write_run(tmp_path / "killed", steps=4, finished=False)
    old = time.time() - 3600
    os.utime(killed / "metrics.jsonl", (old, old))
    warning = findings(killed)["progress"]
    assert "stopped after step 4 of 10" in warning.title


def test_weak_signal_and_non_finite_metrics(tmp_path):
    run = write_run(tmp_path / "run", change=lambda s: {"batch/groups_with_signal": 0.05})
    assert findings(run)["weak_signal"].severity == "warning"
    bad = write_run(tmp_path / "bad", change=lambda s: {"actor/grad_norm": "nan"} if s == 3 else {})
    assert findings(bad)["numerics"].severity == "problem"


def test_a_run_that_stopped_with_an_exception_names_the_phase_and_the_layer(tmp_path):
    run = write_run(tmp_path / "run", steps=3, finished=False)
    folder = run / "hang" / "error-1"
    folder.mkdir(parents=True)
    frames = ['File "/x/stratarl/algo/advantages/gae.py", line 40 in gae_advantages',
              'File "/x/stratarl/trainer/phases.py", line 160 in advantage']  # fmt: skip
    report = {"message": "ValueError: values has shape [8, 5]", "exception": "ValueError",
              "phase": "adv (step 4)", "frames": frames}  # fmt: skip
    (folder / "report.json").write_text(json.dumps(report))
    problem = findings(run)["error"]
    assert problem.layer == "RL math" and "ValueError in phase adv (step 4)" in problem.title
    assert "progress" not in findings(run)  # the error says why it stopped
