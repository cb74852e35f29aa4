"""benchmarks/distillation.py end to end on the smallest setting (slow): a teacher, one student, the
three arms through the trainer, and the JSON it writes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "distillation.py"


@pytest.mark.slow
def test_the_benchmark_trains_every_arm_and_reports_the_teachers_cost(tmp_path):
    out = tmp_path / "out.json"
    tiny = ["--steps", "3", "--seeds", "0", "--teacher-sft-steps", "5", "--teacher-grpo-steps", "1"]
    tiny += ["--student-sft-steps", "5", "--work", str(tmp_path / "work"), "--json", str(out)]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(SCRIPT.parents[1])}  # this stratarl
    done = subprocess.run([sys.executable, str(SCRIPT), *tiny], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    arms = result["seeds"]["0"]["arms"]
    assert sorted(arms) == ["distill", "grpo", "grpo+distill"]
    assert all(0.0 <= a["accuracy"] <= 1.0 and a["s_per_step"] > 0 for a in arms.values())
    # the teacher's forward runs in the distillation arms only, and is part of their step time
    assert arms["grpo"]["teacher_s_per_step"] == 0.0
    assert all(0 < arms[k]["teacher_s_per_step"] < arms[k]["s_per_step"] for k in ("distill", "grpo+distill"))
    assert result["mean"]["grpo"]["step_time_vs_grpo"] == 1.0
    assert 0.0 <= result["teacher"]["accuracy_after_grpo"] <= 1.0
    assert "mean over seeds 0" in done.stdout
    # the teacher is built in --work, named by its settings (a later run with them reuses it)
    teacher_dirs = [p for p in (tmp_path / "work").iterdir() if p.name.startswith("teacher-")]
    assert len(teacher_dirs) == 1 and (teacher_dirs[0] / "grpo" / "final" / "config.json").exists()
