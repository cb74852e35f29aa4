"""Layer 5, training engine: the files of a checkpoint — durable writes, one failure kept per save, and
the manifest that says a checkpoint directory is complete.

Every file is written through a Python file object and fsynced (torch.save to a path reports a full
disk only as `basic_ios::clear: iostream error`); a text file is written to `NAME.tmp`, fsynced and
renamed over `NAME`, and the directory fsynced, so a reader sees the old text or the new, never half.
The manifest (`manifest.json`, written last) holds the size and sha256 of every other file; a
directory whose files do not match it is not a checkpoint (`checkpoint_problem`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

MANIFEST = "manifest.json"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, no permission, ...). The message names the file,
    the errno and what is left to resume from; `errno` is the operating system's."""


def save_durably(obj: Any, path: Path) -> None:
    """torch.save through a Python file, fsynced: a failed write raises OSError with its errno and
    `path` (torch.save to a path reports a full disk as `basic_ios::clear: iostream error`; to a file
    object it raises the OSError, then rewraps it as `RuntimeError: ... unexpected pos`)."""
    try:
        with path.open("wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
    except (RuntimeError, OSError) as err:
        cause = _os_error_in(err)
        if cause is None:
            raise
        raise OSError(cause.errno, cause.strerror or str(cause), str(path)) from None


def _os_error_in(err: BaseException) -> OSError | None:
    """The first OSError in `err`'s chain (itself, what it was raised from or while handling)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


class Writes:
    """The rank-local writes of one save. The first OSError is kept with the file it hit and later
    writes are skipped, so every rank still reaches each collective and all ranks fail together."""

    def __init__(self) -> None:
        self.failed: tuple[Path, OSError] | None = None

    def save(self, obj: Any, path: Path) -> None:
        self.run(lambda: save_durably(obj, path), path)

    def run(
        self, write: Callable[[], Any], path: Path, *, after_failure: Callable[[], None] | None = None
    ) -> None:
        if self.failed is not None:
            return
        try:
            write()
        except OSError as err:
            self.failed = (Path(err.filename) if err.filename else path, err)
            if after_failure is not None:
                after_failure()

    def describe(self) -> str | None:
        if self.failed is None:
            return None
        path, err = self.failed
        code = errno.errorcode.get(err.errno, str(err.errno)) if err.errno else type(err).__name__
        return f"writing {path} failed: {code} ({err.strerror or err})"


def sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(directory: Path, step: int, world_size: int) -> None:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {
        str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": sha256_of(p)} for p in files
    }
    text = json.dumps({"step": step, "world_size": world_size, "files": entries}, indent=1)
    write_durably(directory / MANIFEST, text)


def write_durably(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)


def make_directories(root: Path, names: Sequence[str]) -> None:
    for name in names:
        (root / name).mkdir(parents=True)


def fsync_directory(directory: Path) -> None:
    """Make renames inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_problem(directory: Path) -> str | None:
    """Why `directory` is not a complete checkpoint (None when it is)."""
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return f"{manifest.name} is missing (the save did not finish)"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError) as err:
        return f"{manifest.name} is unreadable ({err})"
    for name, expected in files.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {expected['bytes']}"
        if sha256_of(path) != expected["sha256"]:
            return f"{name} does not match its sha256 in the manifest"
    return None
