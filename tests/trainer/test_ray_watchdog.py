"""On Ray (slow): the update's per-row statistics come back from both ranks, and a step past its
deadline stops the run with the stacks of every rank process — whether the controller or the ranks
are the ones still busy."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stratarl.apps.quickstart import RECIPE
from stratarl.config import load_config
from stratarl.observe.doctor.diagnosis import diagnose
from stratarl.observe.doctor.view import load_run
from stratarl.observe.trace_store import read_steps
from stratarl.trainer.rl_trainer import RLTrainer

pytestmark = [pytest.mark.slow, pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[2]
SLEEPY = "import time\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
SLEEPY += "    time.sleep(120)\n    return 0.0\n"


def overrides(task, *extra):
    return [
        f"data.train_files=[{task['train']}]",
        f"data.val_files=[{task['test']}]",
        f"model.path={task['model']}",
        "data.prompts_per_step=4",
        "rollout.n=2",
        "rollout.max_response_tokens=8",
        "actor.prompts_per_mini_batch=2",
        "actor.trajectories_per_micro_batch=4",
        "trainer.total_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "cluster.backend=ray",
        "cluster.num_cpus=2",
        "cluster.training_workers=2",
        *extra,
    ]


def train_in_subprocess(task, run_dir, *extra):
    cmd = [sys.executable, "-m", "stratarl", "train", str(ROOT / "recipes" / "grpo_arithmetic.yaml"),
           *overrides(task, f"trainer.run_dir={run_dir}", *extra)]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    return done, time.monotonic() - start


def test_update_statistics_come_back_from_both_ranks(task, tmp_path):
    RLTrainer(load_config(RECIPE, overrides(task)), tmp_path / "run").fit()
    columns = ["new_log_prob_mean", "old_log_prob_mean", "log_ratio_mean", "staleness", "update_tokens"]
    traces = read_steps(tmp_path / "run", [*columns, "action_tokens"])
    for rows in traces.values():
        assert len(rows) == 8
        for row in rows:  # every trained row, from whichever rank trained it, matched to its trajectory
            assert row["update_tokens"] == row["action_tokens"] and row["staleness"] == 0
            assert row["new_log_prob_mean"] - row["old_log_prob_mean"] == pytest.approx(
                row["log_ratio_mean"], abs=1e-5
            )


def hang_report(run_dir):
    (path,) = (run_dir / "hang").glob("step*/report.json")
    return path.parent, json.loads(path.read_text())


def test_a_sleeping_reward_on_ray_stops_the_run_with_every_ranks_stacks(task, tmp_path):
    scorer = tmp_path / "sleepy.py"
    scorer.write_text(SLEEPY)
    done, seconds = train_in_subprocess(
        task,
        tmp_path / "run",
        f"reward.custom_function_path={scorer}",
        "reward.in_process=true",  # in the controller, as in tests/trainer/test_doctor_runs.py
        "watchdog.phase_timeouts_s={reward: 3}",
    )
    assert done.returncode != 0 and seconds < 240, done.stderr[-2000:]
    assert "phase 'reward' (role reward, step 1) passed its deadline of 3 s" in done.stderr
    folder, _ = hang_report(tmp_path / "run")
    for rank in (0, 1):  # the ranks were idle: their main threads wait in Ray's task loop
        (stacks,) = folder.glob(f"stacks-actor-rank{rank}-pid*.txt")
        assert "default_worker.py" in stacks.read_text()
    assert "sleepy.py" in next(folder.glob("stacks-controller-*.txt")).read_text()
    assert any(f.key == "hang" and "phase 'reward'" in f.title for f in diagnose(load_run(tmp_path / "run")))


def test_a_generation_past_its_deadline_names_the_busy_ranks_and_shows_their_stacks(task, tmp_path):
    done, seconds = train_in_subprocess(
        task, tmp_path / "run", "rollout.max_response_tokens=256", "watchdog.phase_timeouts_s={gen: 0.5}"
    )
    assert done.returncode != 0 and seconds < 240, done.stderr[-2000:]
    assert "phase 'gen' (role rollout, step 1)" in done.stderr and "waiting on actor rank" in done.stderr
    folder, report = hang_report(tmp_path / "run")
    assert report["busy"], report
    texts = [p.read_text() for p in folder.glob("stacks-actor-rank*-pid*.txt")]
    assert len(texts) == 2 and any("generate" in text for text in texts)  # caught mid-generation
    (hang,) = [f for f in diagnose(load_run(tmp_path / "run")) if f.key == "hang"]
    assert "phase 'gen'" in hang.title and any("stuck at" in line for line in hang.evidence)
