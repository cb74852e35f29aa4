"""A real small disk for the fault tests: a tmpfs of a given size (full when written past it), or
mounted read-only. Needs root (mount); the tests that use it are skipped with the reason otherwise."""

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(size: str, *, read_only: bool = False):
    """A tmpfs of `size` (e.g. "1m") mounted on a fresh directory, unmounted on exit."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount_point = Path(tempfile.mkdtemp(prefix="stratarl-disk-"))
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if done.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
        mount_point.rmdir()
