"""Real short runs with planted failures: the doctor names each (cause, layer, evidence) and stays
quiet on a healthy run; a step that sleeps past its deadline stops the run with stack dumps;
`stratarl trace` follows a field, writes a page, and `stratarl plot` draws the run."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stratarl.cli import main
from stratarl.observe.doctor.diagnosis import diagnose
from stratarl.observe.doctor.view import load_run
from stratarl.observe.plots import PLOTS
from stratarl.observe.trace_answers import QUESTIONS
from stratarl.observe.trace_store import read_steps
from tests.trainer.planted_runs import alarming, overrides, run

ROOT = Path(__file__).resolve().parents[2]
SLEEPY = "import time\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
SLEEPY += "    time.sleep(60)\n    return 0.0\n"


@pytest.fixture(scope="module")
def healthy(sft_task, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("healthy") / "run"
    return run_dir, run(sft_task, run_dir)


def test_the_doctor_is_quiet_on_a_healthy_run_and_reports_where_time_goes(healthy, capsys):
    run_dir, findings = healthy
    assert alarming(findings) == [], [f.title for f in findings]
    info = {f.key for f in findings}
    assert {"throughput", "memory"} <= info
    assert main(["doctor", str(run_dir)]) == 0
    assert "nothing alarming" in capsys.readouterr().out


def test_a_live_run_with_a_half_written_line_reads_the_same(healthy, tmp_path):
    run_dir, _ = healthy
    live = tmp_path / "live"
    shutil.copytree(run_dir, live, ignore=shutil.ignore_patterns("final"))
    with (live / "metrics.jsonl").open("a") as f:
        f.write('{"step": 9, "phase": "train", "critic/sco')  # the trainer is writing this line now
    view = load_run(live)
    assert [r["step"] for r in view.train] == list(range(1, 9))
    assert alarming(diagnose(view)) == []


def test_a_reward_that_is_always_zero_is_a_compute_and_environment_problem(sft_task, tmp_path):
    scorer = tmp_path / "zero.py"
    scorer.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    findings = run(sft_task, tmp_path / "run", f"reward.custom_function_path={scorer}")
    (problem,) = [f for f in findings if f.key == "reward_constant"]
    assert problem.severity == "problem" and problem.layer == "compute & environment"  # the scorer
    assert "always 0" in problem.title and "ground truth" in " ".join(problem.evidence)
    assert not [f for f in findings if f.key in ("no_signal", "weak_signal")]  # explained by the reward


def test_responses_always_truncated_are_found(sft_task, tmp_path):
    findings = run(sft_task, tmp_path / "run", "rollout.max_response_tokens=2")
    (problem,) = [f for f in findings if f.key == "truncation"]
    assert problem.severity == "problem" and problem.layer == "config"  # rollout.max_response_tokens
    assert "100%" in problem.title and "rollout.max_response_tokens" in problem.next_step


def test_a_learning_rate_of_zero_is_a_flat_loss(sft_task, tmp_path):
    findings = run(sft_task, tmp_path / "run", "actor.lr=0")
    (problem,) = [f for f in findings if f.key == "flat_loss"]
    assert problem.layer == "config" and "learning rate is 0" in problem.title
    rows = [r for rows in read_steps(tmp_path / "run", ["ratio_min", "ratio_max"]).values() for r in rows]
    assert rows and all(r["ratio_min"] == r["ratio_max"] == 1.0 for r in rows)  # the policy never moved


def test_trace_follows_a_field_through_the_phases(healthy, capsys):
    run_dir, _ = healthy
    assert main(["trace", str(run_dir), "--field", "old_log_probs"]) == 0
    out = capsys.readouterr().out
    assert "producer   actor.log_prob: trainer.phases.old_log_prob → PolicyWorker.compute_log_prob" in out
    assert "shape      [N, T] = [32, 8]" in out
    assert "mask       response_mask" in out and "consumers  advantage, actor.update, metrics" in out
    traces = read_steps(run_dir, ["old_log_prob_mean"])
    lines = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(line[0]) for line in lines] == sorted(traces)  # one row of statistics per step
    step, rows, mean = int(lines[2][0]), int(lines[2][1]), float(lines[2][2])
    values = [r["old_log_prob_mean"] for r in traces[step]]
    assert rows == len(values) == 32 and mean == pytest.approx(sum(values) / len(values), rel=1e-4)
    assert main(["trace", str(run_dir), "--field", "no_such_field"]) == 2


def test_trace_picks_trajectories_and_writes_a_page_and_plot_draws_the_run(healthy, tmp_path, capsys):
    run_dir, _ = healthy
    assert main(["trace", str(run_dir), "--step", "2", "--worst"]) == 0
    out = capsys.readouterr().out
    for number, question in enumerate(QUESTIONS, start=1):
        assert f"{number}. {question}" in out
    assert (
        main(
            [
                "trace",
                str(run_dir),
                "--where",
                "reward == 1 and sample_index == 0",
                "--html",
                str(tmp_path / "t.html"),
            ]
        )
        == 0
    )
    page = (tmp_path / "t.html").read_text()
    assert "10. loop closure" in page and "class='action" in page and "class='action reward'" in page
    assert "<script" not in page and "http" not in page  # self-contained
    assert main(["trace", str(run_dir), "--where", "__import__('os')"]) == 2
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "plots")]) == 0
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"curves.png", *PLOTS}
    assert set(PLOTS) <= {p.name for p in (run_dir / "plots").iterdir()}  # the end of the run drew them too


def test_a_step_that_sleeps_past_its_deadline_stops_the_run_with_stack_dumps(sft_task, tmp_path):
    scorer = tmp_path / "sleepy.py"
    scorer.write_text(SLEEPY)
    run_dir = tmp_path / "run"
    # In the controller's process: in scorer workers (the default) each call's own deadline ends a
    # sleeping scorer first (a `timeout`, counted: tests/trainer/test_hostile_user_code.py), and the
    # watchdog is what stops a phase that hangs in the controller itself.
    planted = [
        f"reward.custom_function_path={scorer}",
        "reward.in_process=true",
        "watchdog.phase_timeouts_s={reward: 3}",
    ]
    recipe = str(ROOT / "recipes" / "grpo_arithmetic.yaml")
    cmd = [
        sys.executable,
        "-m",
        "stratarl",
        "train",
        recipe,
        *overrides(sft_task, *planted, f"trainer.run_dir={run_dir}"),
    ]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode != 0 and time.monotonic() - start < 120  # stopped, not 60 s per sample
    assert (
        "WatchdogTimeout: watchdog: phase 'reward' (role reward, step 1) passed its deadline of 3 s"
        in done.stderr
    )
    (report_path,) = (run_dir / "hang").glob("*/report.json")
    report = json.loads(report_path.read_text())
    stacks = next(report_path.parent.glob("stacks-controller-*.txt")).read_text()
    assert "sleepy.py" in stacks and "in compute_score" in stacks
    (hang,) = [f for f in diagnose(load_run(run_dir)) if f.key == "hang"]
    assert hang.severity == "problem" and "phase 'reward'" in hang.title
    assert any("sleepy.py" in line for line in hang.evidence), hang.evidence
    assert report["expired"]["rows"] == 32
    assert read_steps(run_dir, ["trajectory_id", "reward"])[1], "the failed step's rollout is still traced"
