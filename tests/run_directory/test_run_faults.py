"""Faults around the run directory end well: refused before anything loads (exit 2, naming the key or
file), counted and survived, or stopped with one message; never a raw traceback, never a second writer."""

import errno
import json
import os
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from stratarl.apps.quickstart import RECIPE
from stratarl.cli import main
from stratarl.config import ConfigError
from stratarl.engine import checkpoint as engine_checkpoint
from stratarl.engine.durable_files import CheckpointWriteError, checkpoint_problem
from stratarl.observe.doctor.diagnosis import run_status
from stratarl.observe.doctor.view import load_run
from stratarl.observe.run_log import RunLog
from stratarl.run_directory.lock import LOCK_FILE, RunDirectoryError, RunLock
from stratarl.trainer.rl_trainer import RLTrainer
from tests.run_directory.small_disk import small_tmpfs
from tests.run_directory.test_run_directory import train_steps
from tests.trainer.test_rl_trainer import small_config as trainer_config


def small_overrides(task):
    return [f"data.train_files=[{task['train']}]", "data.val_files=[]", f"model.path={task['model']}",
            "data.prompts_per_step=4", "rollout.n=4", "rollout.max_response_tokens=8",
            "actor.prompts_per_mini_batch=2", "actor.trajectories_per_micro_batch=4",
            "trainer.test_freq=0", "trainer.val_before_train=false"]  # fmt: skip


def small_config(task, *extra):
    """The trainer tests' tiny run, without validation."""
    return trainer_config(task, "trainer.test_freq=0", "trainer.val_before_train=false", *extra)


def hold_lock(run_dir):
    """A process of its own holding the run directory's lock, as a live trainer does."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from stratarl.run_directory.lock import RunLock; "
         "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)", str(run_dir)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_deleting_run_lock_admits_no_second_writer_and_the_doctor_still_sees_the_run_live(tmp_path):
    """Was: the lock was the file; with run.lock deleted a second trainer locked a new one and wrote too."""
    run_dir = tmp_path / "run"
    holder = hold_lock(run_dir)
    (run_dir / "metrics.jsonl").write_text("")  # what the doctor needs to call it a run directory
    try:
        (run_dir / LOCK_FILE).unlink()
        with pytest.raises(RunDirectoryError, match="is being written by another process"):
            RunLock(run_dir).acquire()
        (run_dir / LOCK_FILE).write_text("")  # replaced by an empty record: still held
        with pytest.raises(RunDirectoryError, match="is being written by"):
            RunLock(run_dir).acquire()
        assert "live (a process holds the run directory's lock)" in run_status(load_run(run_dir))
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock(run_dir).acquire()  # the holder died: the kernel let its lock go
    lock.release()
    assert "live" not in run_status(load_run(run_dir))


def test_a_read_only_run_directory_is_refused_naming_the_file_and_errno():
    with small_tmpfs("1m", read_only=True) as disk, pytest.raises(RunDirectoryError) as info:
        RunLock(disk).acquire()
    message = str(info.value)
    assert f"{disk / LOCK_FILE}: Read-only file system (errno {errno.EROFS}, EROFS)" in message


def test_a_run_directory_that_cannot_be_made_is_refused_naming_it():
    with small_tmpfs("1m", read_only=True) as disk, pytest.raises(RunDirectoryError) as info:
        RunLock(disk / "project" / "run").acquire()
    assert f"cannot write the run directory: {disk / 'project' / 'run'}" in str(info.value)
    assert "EROFS" in str(info.value)


def test_the_lock_record_is_emptied_on_release_and_not_recreated_when_deleted(tmp_path):
    lock = RunLock(tmp_path).acquire()
    assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_FILE).read_text()
    (tmp_path / LOCK_FILE).unlink()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


# --- disk: a full disk during a checkpoint or a log write ------------------------------------------


def fill_disk(disk, *, leave_bytes):
    stat = os.statvfs(disk)
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave_bytes))


def test_a_full_disk_during_a_checkpoint_is_one_error_naming_the_file_and_the_last_good_one_stays(task):
    """Was: three chained tracebacks (torch rewrapped ENOSPC as `RuntimeError ... unexpected pos`) and
    the partial .tmp-global_step_2 left on the full disk."""
    with small_tmpfs("64m") as disk:
        trainer = RLTrainer(small_config(task, "trainer.save_freq=1", "trainer.total_steps=2"), disk / "run")
        save = trainer.save_checkpoint

        def fill_then_save(step):
            if step == 2:
                fill_disk(disk, leave_bytes=200_000)  # the logs of step 2 fit, its checkpoint does not
            save(step)

        trainer.save_checkpoint = fill_then_save
        with pytest.raises(CheckpointWriteError) as info:
            trainer.fit()
        root = disk / "run" / "checkpoints"
        assert sorted(p.name for p in root.iterdir()) == [
            "global_step_1",
            "latest_checkpointed_iteration.txt",
        ]
        assert checkpoint_problem(root / "global_step_1") is None  # intact: a resume uses it
        record = json.loads((disk / "run" / "run.json").read_text())
    err = info.value
    assert err.errno == errno.ENOSPC and err.__cause__ is None
    assert ".tmp-global_step_2/actor/model.pt failed: ENOSPC" in str(err)
    assert "global_step_1 is intact and a resume uses it" in str(err)
    assert record["status"] == "failed" and record["steps_done"] == 1
    assert record["error"].startswith("CheckpointWriteError: [Errno 28]")


def test_logs_on_a_full_disk_stop_the_cli_with_one_line_naming_the_file(task, capsys):
    with small_tmpfs("64m") as disk:
        args = ["train", str(RECIPE), *small_overrides(task), f"trainer.run_dir={disk / 'run'}",
                "trainer.total_steps=2", "trainer.save_freq=0"]  # fmt: skip
        real = RunLog.log_metrics

        def fill_then_log(self, step, metrics, phase="train"):
            if step == 2 and phase == "train":
                fill_disk(disk, leave_bytes=0)
            real(self, step, metrics, phase)

        RunLog.log_metrics = fill_then_log
        try:
            code = main(args)
        finally:
            RunLog.log_metrics = real
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("stratarl train:")]
    assert f"{disk / 'run'}/" in line and "No space left on device (errno 28, ENOSPC)" in line


# --- resume edges ----------------------------------------------------------------------------------


def test_a_run_killed_in_its_first_checkpoint_save_starts_again_from_step_0(
    task, tmp_path, monkeypatch, capsys
):
    """Was: refused ("no checkpoint to resume from") though a killed run is meant to continue."""
    run_dir = tmp_path / "run"
    trainer = RLTrainer(small_config(task, "trainer.save_freq=2", "trainer.total_steps=3"), run_dir)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # as a kill stops it: no clean-up of the save, no record

    monkeypatch.setattr(engine_checkpoint, "write_manifest", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == [".tmp-global_step_2"]
    assert train_steps(run_dir) == [1, 2]
    monkeypatch.undo()
    capsys.readouterr()
    RLTrainer(small_config(task, "trainer.save_freq=2", "trainer.total_steps=3"), run_dir).fit()
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "killed while saving its first checkpoint (.tmp-global_step_2, incomplete): nothing to resume, "
        "so it starts again at step 0" in out
    )
    assert train_steps(run_dir) == [1, 2, 3]  # the lost steps' records went, not logged twice
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "global_step_2", "global_step_3", "latest_checkpointed_iteration.txt"]  # fmt: skip
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished" and [leg["start_step"] for leg in record["legs"]] == [0, 0]


def test_a_training_file_rewritten_with_fewer_rows_is_refused_naming_it_and_both_counts(task, tmp_path):
    """Was: `ValueError: sampler state has num_items=64 but this sampler has 16` as a traceback."""
    train = tmp_path / "train.parquet"
    shutil.copy(task["train"], train)
    ours = {**task, "train": train}
    run_dir = tmp_path / "run"
    RLTrainer(small_config(ours, "trainer.save_freq=1", "trainer.total_steps=1"), run_dir).fit()
    pq.write_table(pq.read_table(train).slice(0, 16), train)
    again = small_config(ours, "trainer.save_freq=1", "trainer.total_steps=2",
                         "trainer.resume_allow_changes=[trainer.total_steps]")  # fmt: skip
    with pytest.raises(RunDirectoryError) as info:
        RLTrainer(again, run_dir).fit()
    message = " ".join(str(info.value).split())
    assert (
        "drew prompts from 64 training rows" in message
        and f"data.train_files ({train}) now gives 16" in message
    )
    assert [leg["start_step"] for leg in json.loads((run_dir / "run.json").read_text())["legs"]] == [0]


def test_a_run_that_dies_of_an_exception_is_recorded_failed_with_the_error(task, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    trainer = RLTrainer(small_config(task, "trainer.total_steps=2"), run_dir)

    def breaks(step):
        raise ValueError("a scorer returned a string")

    monkeypatch.setattr(trainer, "train_step", breaks)
    with pytest.raises(ValueError):
        trainer.fit()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and record["error"] == "ValueError: a scorer returned a string"
    assert "failed (ValueError: a scorer returned a string)" in run_status(load_run(run_dir))


# --- config: refused before anything loads -------------------------------------------------------


def test_more_prompts_per_step_than_training_rows_is_refused_naming_the_keys(task, tmp_path):
    with pytest.raises(ConfigError) as info:
        RLTrainer(small_config(task, "data.prompts_per_step=128"), tmp_path / "run")
    message = " ".join(str(info.value).split())
    assert "data.prompts_per_step, data.train_files" in message
    assert (
        f"data.prompts_per_step=128 prompts, and data.train_files ({task['train']}) gives 64 rows" in message
    )
    assert not (tmp_path / "run" / "config.yaml").exists()
