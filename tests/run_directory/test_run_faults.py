"""Faults around the run directory end well: refused before anything loads (exit 2, naming the key or
file), counted and survived, or stopped with one message; never a raw traceback, never a second writer."""

import errno
import os
import subprocess
import sys

import pytest

from stratarl.observe.doctor.diagnosis import run_status
from stratarl.observe.doctor.view import load_run
from stratarl.run_directory.lock import LOCK_FILE, RunDirectoryError, RunLock
from tests.run_directory.small_disk import small_tmpfs


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
    with small_tmpfs("1m", read_only=True) as disk:
        with pytest.raises(RunDirectoryError) as info:
            RunLock(disk).acquire()
    message = str(info.value)
    assert f"{disk / LOCK_FILE}: Read-only file system (errno {errno.EROFS}, EROFS)" in message


def test_a_run_directory_that_cannot_be_made_is_refused_naming_it():
    with small_tmpfs("1m", read_only=True) as disk:
        with pytest.raises(RunDirectoryError) as info:
            RunLock(disk / "project" / "run").acquire()
    assert f"cannot write the run directory: {disk / 'project' / 'run'}" in str(info.value)
    assert "EROFS" in str(info.value)


def test_the_lock_record_is_emptied_on_release_and_not_recreated_when_deleted(tmp_path):
    lock = RunLock(tmp_path).acquire()
    assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_FILE).read_text()
    (tmp_path / LOCK_FILE).unlink()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()
