"""Ctrl-C: `stratarl train` and `stratarl sft` stop at a safe point with one line (what is saved, the
command that continues), exit code 130 and run.json `interrupted`; the same command continues the
run; a second Ctrl-C exits at once."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stratarl.observe.run_log import read_metrics
from stratarl.trainer import interruption
from stratarl.trainer.interruption import StopRequest, StopRequested, continue_command, stopped_line

ROOT = Path(__file__).resolve().parents[2]
STEPS = 20
LINE = re.compile(r"^stratarl (train|sft): interrupted after step (\d+) of (\d+); (.*)$", re.M)


def train_command(task, run_dir, *extra):
    overrides = [
        f"data.train_files=[{task['train']}]",
        f"data.val_files=[{task['test']}]",
        f"model.path={task['model']}",
        f"trainer.run_dir={run_dir}",
        f"trainer.total_steps={STEPS}",
        "trainer.save_freq=100",  # > total_steps: only Ctrl-C and the last step save
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "data.prompts_per_step=4",
        "rollout.n=2",
        "rollout.max_response_tokens=6",
        "actor.prompts_per_mini_batch=4",
        "actor.trajectories_per_micro_batch=8",
        *extra,
    ]
    return [
        sys.executable,
        "-m",
        "stratarl",
        "train",
        str(ROOT / "recipes" / "grpo_arithmetic.yaml"),
        *overrides,
    ]


def launch(cmd):
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(proc, run_dir, step, phase="train", timeout=300):
    deadline = time.monotonic() + timeout
    path = run_dir / "metrics.jsonl"
    while True:
        if path.is_file() and any(
            json.loads(line).get("phase") == phase and json.loads(line)["step"] >= step
            for line in path.read_text().splitlines()
            if line.strip().endswith("}")
        ):
            return
        assert proc.poll() is None, (
            f"the run exited early (rc={proc.returncode}):\n{proc.stderr.read()[-3000:]}"
        )
        assert time.monotonic() < deadline, f"step {step} was never logged"
        time.sleep(0.02)


def finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def run_record(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def same_command(line_command: str, cmd: list[str]) -> bool:
    words = shlex.split(line_command)
    program = shutil.which(words[0]) or words[0]
    return Path(program).resolve() == Path(cmd[0]).resolve() and words[1:] == cmd[1:]


def test_ctrl_c_saves_marks_the_run_and_the_same_command_continues_it(task, tmp_path):
    run_dir = tmp_path / "run"
    cmd = train_command(task, run_dir)
    proc = launch(cmd)
    wait_for_step(proc, run_dir, 1)
    proc.send_signal(signal.SIGINT)
    rc, out, err = finish(proc)

    assert rc == 130, err[-3000:]
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
    lines = LINE.findall(err)
    assert len(lines) == 1, err  # exactly one line says what is saved
    _, step, total, rest = lines[0]
    step = int(step)
    assert 1 <= step < STEPS and int(total) == STEPS
    checkpoint = run_dir.absolute() / "checkpoints" / f"global_step_{step}"
    saved, continued = rest.split("; continue with: ")
    assert saved == f"saved checkpoint step {step} in {checkpoint}"
    assert same_command(continued, cmd), continued
    assert (checkpoint / "manifest.json").is_file()
    record = run_record(run_dir)
    assert record["status"] == "interrupted" and record["steps_done"] == step

    proc = launch(shlex.split(continued))  # the command the line gives
    rc, out, err = finish(proc)
    assert rc == 0, err[-3000:]
    assert f"continuing at step {step + 1}" in " ".join(out.split())
    train_steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]
    assert train_steps == list(range(1, STEPS + 1))
    assert run_record(run_dir)["status"] == "finished" and len(run_record(run_dir)["legs"]) == 2


def test_without_checkpoints_the_line_says_nothing_is_saved(task, tmp_path):
    run_dir = tmp_path / "run"
    cmd = train_command(task, run_dir, "trainer.save_freq=0")
    proc = launch(cmd)
    wait_for_step(proc, run_dir, 1)
    proc.send_signal(signal.SIGINT)
    rc, _, err = finish(proc)
    assert rc == 130 and "Traceback" not in err
    [(_, _, _, rest)] = LINE.findall(err)
    assert rest.startswith("nothing is saved (trainer.save_freq=0 keeps no checkpoints;")
    assert same_command(rest.split("; start again with: ")[1], [*cmd, "trainer.overwrite=true"])
    assert not (run_dir / "checkpoints").exists()
    assert run_record(run_dir)["status"] == "interrupted" and run_record(run_dir)["steps_done"] == 0


def test_a_second_ctrl_c_exits_at_once(task, tmp_path):
    """The reward sleeps 30 s a call once the flag file exists: the step cannot finish in time."""
    flag, scorer = tmp_path / "slow", tmp_path / "slow_reward.py"
    scorer.write_text(
        "import os, time\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        f"    if os.path.exists({str(flag)!r}):\n"
        "        time.sleep(30)\n"
        "    return 0.0\n"
    )
    run_dir = tmp_path / "run"
    extra = (f"reward.custom_function_path={scorer}", "reward.timeout_s=120")
    proc = launch(train_command(task, run_dir, *extra))
    wait_for_step(proc, run_dir, 1)
    flag.touch()
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert proc.poll() is None  # the first only asked
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc, _, err = finish(proc, timeout=20)
    assert rc == 130 and time.monotonic() - sent < 10
    assert "Ctrl-C again stops at once" in err and "Traceback" not in err
    assert re.search(
        r"^stratarl train: stopped at once \(second Ctrl-C\), interrupted after step \d+ of 20", err, re.M
    ), err[-3000:]
    assert run_record(run_dir)["status"] == "interrupted"


def test_ctrl_c_during_sft_stops_marks_the_run_and_says_nothing_is_saved(task, tmp_path):
    run_dir = tmp_path / "sft"
    cmd = [
        sys.executable, "-m", "stratarl", "sft", str(ROOT / "recipes" / "quickstart.yaml"),
        f"data.train_files=[{task['train']}]", "data.val_files=[]", f"model.path={task['model']}",
        f"trainer.run_dir={run_dir}",
        "sft.total_steps=500", "sft.trajectories_per_step=8", "sft.trajectories_per_micro_batch=8",
    ]  # fmt: skip
    proc = launch(cmd)
    wait_for_step(proc, run_dir, 1, phase="sft")
    proc.send_signal(signal.SIGINT)
    rc, out, err = finish(proc)
    assert rc == 130 and "Traceback" not in out + err
    [(command, step, total, rest)] = LINE.findall(err)
    assert command == "sft" and int(total) == 500 and int(step) >= 1
    assert rest.startswith("nothing is saved (SFT keeps no checkpoints); start again with: ")
    assert run_record(run_dir)["status"] == "interrupted" and not (run_dir / "final").exists()


def test_the_first_request_only_asks_and_check_stops_between_steps():
    exits, before = [], signal.getsignal(signal.SIGINT)
    stop = StopRequest(exit_process=exits.append)
    with stop.armed(lambda: "marked"):
        stop.check(0)  # nothing asked yet
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and not exits
        with pytest.raises(StopRequested) as stopped:
            stop.check(3)
        assert stopped.value.step == 3 and stopped.value.can_save
        os.kill(os.getpid(), signal.SIGINT)
        assert exits == [interruption.EXIT_INTERRUPTED]
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_the_continue_command_is_the_command_line_quoted_for_a_shell(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/x/stratarl/__main__.py", "train", "r.yaml", "data.train_files=[a b]"])
    words = shlex.split(continue_command())
    assert words[1:] == ["-m", "stratarl", "train", "r.yaml", "data.train_files=[a b]"]
    monkeypatch.setattr(sys, "argv", ["/nowhere/bin/stratarl", "sft", "r.yaml"])
    assert (
        continue_command(extra=["trainer.overwrite=true"])
        == "/nowhere/bin/stratarl sft r.yaml trainer.overwrite=true"
    )
    line = stopped_line(step=4, total=9, saved=(2, Path("/r/checkpoints/global_step_2")), save_freq=2)
    assert line.startswith(
        "interrupted after step 4 of 9; nothing new saved; newest checkpoint step 2 in /r/"
    )
