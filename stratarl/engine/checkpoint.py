"""Layer 5, training engine: checkpoints — written atomically, verified on load, with retention.

Layout (verl's names where it has them):

    root/latest_checkpointed_iteration.txt      the step of the newest complete checkpoint
    root/global_step_{N}/<role>/model.pt         full (unsharded) model state, HF parameter names
    root/global_step_{N}/<role>/optimizer.pt     full optimizer state (keyed by parameter name)
    root/global_step_{N}/<role>/extra.pt         LR schedule state, skipped-step count
    root/global_step_{N}/rng/rank_{r}.pt         python, numpy, torch (and CUDA) RNG states per rank
    root/global_step_{N}/huggingface/            the policy, loadable with from_pretrained (LoRA merged)
    root/global_step_{N}/trainer_state.pt        what the caller passes (dataloader position, ...)
    root/global_step_{N}/manifest.json           size and sha256 of every file above, written last

A save writes into `.tmp-global_step_{N}` (every file fsynced), writes the manifest, renames the
directory into place and only then rewrites the `latest` pointer (itself through a temporary file
and `os.replace`), so a crash leaves either the old or the new checkpoint, never half of one. A
write that fails (disk full, permissions, ...) removes the partial save and raises
`CheckpointWriteError` naming the file and the errno, on every rank; the previous checkpoint stays
loadable. A load checks the manifest and falls back to the newest complete checkpoint, saying why
it skipped the others. Retention (`prune`) removes only checkpoints older than the newest, and only
those the caller says belong to its run.

A role trained in other processes than the ones that save (a critic on Ray ranks of its own) is
written first by its own ranks into `.staged-global_step_{N}/<role>/` (`stage_role`); the save
then moves that directory into `.tmp-global_step_{N}` before the manifest (`save(..., staged=…)`).
Until then nothing named global_step_N exists, so a crash between the two parts leaves the previous
checkpoint in charge, and the next save removes the leftovers. The layout is the same either way.

Departure from verl: verl saves one shard per rank (`model_world_size_W_rank_r.pt`), so a resume
needs the same world size; here states are gathered to rank 0 and saved whole, so a resume may use
any number of ranks, at the cost of rank 0 holding the full state while saving.
"""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.durable_files import (  # noqa: F401  (CheckpointWriteError, checkpoint_problem: part of this module's API)
    MANIFEST,
    CheckpointWriteError,
    Writes,
    checkpoint_problem,
    fsync_directory,
    make_directories,
    write_durably,
    write_manifest,
)

TRACKER = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"^global_step_(\d+)$")
STAGED = ".staged-global_step_{step}"  # roles written ahead of a save, by their own ranks
PARTS = ("model", "optimizer", "extra")


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # never a context where none was used
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # saved elsewhere: the devices both sides have
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)


@dataclass
class LoadedCheckpoint:
    step: int
    path: Path
    trainer_state: Any = None
    skipped: list[str] = field(default_factory=list)  # why newer checkpoints were not used


class CheckpointManager:
    """Saves and restores the trained roles (`TrainingEngine`s: actor, critic) of one run.

    All ranks call `save` and `load` (they gather and scatter sharded states); rank 0 writes.
    max_to_keep: complete checkpoints kept (oldest removed first); None keeps all."""

    def __init__(self, root: str | Path, *, max_to_keep: int | None = None, dp: DataParallel | None = None):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        self.root = Path(root)
        self.max_to_keep = max_to_keep
        self.dp = dp or DataParallel()

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def staged_dir(self, step: int) -> Path:
        return self.root / STAGED.format(step=step)

    def steps(self) -> list[int]:
        """Steps of the global_step_* directories present, complete or not, newest first."""
        if not self.root.is_dir():
            return []
        found = (STEP_DIR.match(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def latest_pointer(self) -> int | None:
        tracker = self.root / TRACKER
        text = tracker.read_text().strip() if tracker.is_file() else ""
        return int(text) if text.isdigit() else None

    # --- save ------------------------------------------------------------------------------------
    def stage_role(self, step: int, name: str, role: Any) -> Path:
        """Write role `name` of checkpoint `step` ahead of the save, into its staging directory (a
        collective over the role's ranks; rank 0 writes). Not a checkpoint until `save(step, …,
        staged=[name])` adopts it; staging again replaces what an interrupted attempt left."""
        main = self.dp.rank == 0
        out = self.staged_dir(step) / name
        writes = Writes()
        if main:
            for stale in self.root.glob(STAGED.format(step="*") + f"/{name}"):
                shutil.rmtree(stale)
            writes.run(lambda: out.mkdir(parents=True), out)
        _write_role(role, out, main, writes)
        self._raise_if_failed(writes, step, out)
        return out

    def save(
        self,
        step: int,
        roles: dict[str, Any],
        *,
        hf_policy: Any = None,
        tokenizer: Any = None,
        trainer_state: Any = None,
        staged: Sequence[str] = (),
    ) -> Path:
        """Write checkpoint `step` of `roles` ({"actor": actor, "critic": critic}); hf_policy (an
        Actor) is also exported as huggingface/; `staged` names roles already written by
        `stage_role(step, …)`, moved in before the manifest. Returns the final directory."""
        main = self.dp.rank == 0
        tmp = self.root / f".tmp-global_step_{step}"
        if staged:  # every rank raises together, rather than rank 0 alone before a barrier
            problem = self.dp.broadcast_object(self._staged_problem(step, roles, staged) if main else None)
            if problem is not None:
                raise ValueError(problem)
        writes = Writes()
        if main:
            self._remove_leftovers(step)
            writes.run(lambda: make_directories(tmp, ["rng", *roles]), tmp)
        self.dp.barrier()
        for name, role in roles.items():
            _write_role(role, tmp / name, main, writes)
        writes.save(rng_state(), tmp / "rng" / f"rank_{self.dp.rank}.pt")
        if hf_policy is not None and not self._any_failed(writes):
            # save_hf is a collective export, a write on rank 0, then a barrier: a rank 0 whose write
            # failed meets the other ranks at that barrier itself.
            export = partial(hf_policy.save_hf, tmp / "huggingface", tokenizer=tokenizer)
            writes.run(export, tmp / "huggingface", after_failure=self.dp.barrier)
        if main and trainer_state is not None:
            writes.save(trainer_state, tmp / "trainer_state.pt")
        self._raise_if_failed(writes, step, tmp)
        final = self.step_dir(step)
        if main:
            for name in staged:
                writes.run(partial(os.replace, self.staged_dir(step) / name, tmp / name), tmp / name)
            if self.staged_dir(step).is_dir() and not any(self.staged_dir(step).iterdir()):
                self.staged_dir(step).rmdir()
            writes.run(partial(self._publish, tmp, final, step), final)
        self._raise_if_failed(writes, step, tmp)
        return final

    def _remove_leftovers(self, step: int) -> None:
        """What saves that never finished left: their temporary and staging directories."""
        for stale in self.root.glob(".tmp-global_step_*"):
            shutil.rmtree(stale)
        for stale in self.root.glob(STAGED.format(step="*")):
            if stale != self.staged_dir(step):
                shutil.rmtree(stale)

    def _any_failed(self, writes: Writes) -> bool:
        """Whether a write failed on any rank (a collective)."""
        return self.dp.reduce([float(writes.failed is not None)], "max")[0] > 0

    def _raise_if_failed(self, writes: Writes, step: int, partial_dir: Path) -> None:
        """A collective barrier. When a write failed on any rank, rank 0 removes `partial_dir` and
        every rank raises CheckpointWriteError naming the file and the errno (rank 0's, else its
        own) and what a resume will find."""
        if not self._any_failed(writes):
            self.dp.barrier()
            return
        mine = writes.describe()
        first = self.dp.broadcast_object(mine if self.dp.rank == 0 else None) or mine
        if self.dp.rank == 0:
            shutil.rmtree(partial_dir, ignore_errors=True)
        latest = self.dp.broadcast_object(self.find_latest()[0] if self.dp.rank == 0 else None)
        removed = "it was not saved (the partial files were removed)"
        if latest == step:  # it was published; what failed came after (the pointer, retention)
            left = "the checkpoint itself is complete"
        elif latest is not None:
            left = f"{removed}; {self.step_dir(latest)} is intact and a resume uses it"
        else:
            left = f"{removed}; no earlier complete checkpoint exists"
        code = writes.failed[1].errno if writes.failed and writes.failed[1].errno else errno.EIO
        raise CheckpointWriteError(
            code, f"checkpoint {self.step_dir(step)}: {first or 'a write failed on another rank'}; {left}"
        )

    def _staged_problem(self, step: int, roles: dict[str, Any], staged: Sequence[str]) -> str | None:
        clash = sorted(set(staged) & set(roles))
        if clash:
            return f"roles {clash} are both staged and saved directly"
        missing = [name for name in staged if not (self.staged_dir(step) / name).is_dir()]
        if missing:
            return f"roles {missing} were not staged for step {step} (no {self.staged_dir(step)}/<role>)"
        return None

    def _publish(self, tmp: Path, final: Path, step: int) -> None:
        write_manifest(tmp, step, self.dp.size)
        if final.exists():  # the same step saved again: replace it
            old = final.with_name(f".old-{final.name}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
        fsync_directory(self.root)
        write_durably(self.root / TRACKER, f"{step}\n")  # the pointer moves last
        if self.max_to_keep is not None:
            self.prune(self.max_to_keep, newest=step)

    def prune(
        self, max_to_keep: int, *, newest: int, belongs: Callable[[Path], bool] | None = None
    ) -> list[int]:
        """Retention after saving checkpoint `newest`: of the complete checkpoints older than it that
        `belongs` accepts (default: all), remove all but the newest max_to_keep − 1. Checkpoints of
        another run (`belongs` false), newer ones and incomplete ones are never touched. Returns
        the steps removed."""
        ours = [
            s
            for s in self.steps()
            if s < newest
            and (belongs is None or belongs(self.step_dir(s)))
            and checkpoint_problem(self.step_dir(s)) is None
        ]
        removed = ours[max(max_to_keep - 1, 0) :]
        for step in removed:
            shutil.rmtree(self.step_dir(step))
        return removed

    # --- load ------------------------------------------------------------------------------------
    def find_latest(self) -> tuple[int | None, list[str]]:
        """The newest complete step (the pointer's first, then every directory newest first), and a
        message for each checkpoint skipped on the way."""
        pointer = self.latest_pointer()
        candidates = ([pointer] if pointer is not None else []) + [s for s in self.steps() if s != pointer]
        skipped = []
        for step in candidates:
            directory = self.step_dir(step)
            problem = checkpoint_problem(directory) if directory.is_dir() else "the directory is missing"
            if problem is None:
                return step, skipped
            skipped.append(f"checkpoint {directory} is incomplete or corrupted: {problem}")
        return None, skipped

    def load(self, roles: dict[str, Any], *, step: int | None = None) -> LoadedCheckpoint | None:
        """Restore the newest complete checkpoint (or checkpoint `step`, which must be complete) into
        `roles` and the RNG states; None if there is none. Skipped checkpoints are reported with a
        warning naming the one used instead."""
        if step is not None:
            problem = checkpoint_problem(self.step_dir(step)) if self.step_dir(step).is_dir() else "missing"
            if problem is not None:
                raise ValueError(f"checkpoint {self.step_dir(step)} cannot be loaded: {problem}")
            found = (step, [])
        else:
            found = self.dp.broadcast_object(self.find_latest() if self.dp.rank == 0 else None)
        step, skipped = found
        for message in skipped:
            used = f"using global_step_{step}" if step is not None else "no complete checkpoint remains"
            warnings.warn(f"{message}; {used}", stacklevel=2)
        if step is None:
            return None
        directory = self.step_dir(step)
        for name, role in roles.items():
            _read_role(role, directory / name, self.dp.rank == 0)
        rng_file = directory / "rng" / f"rank_{self.dp.rank}.pt"
        if rng_file.is_file():
            set_rng_state(torch.load(rng_file, map_location="cpu", weights_only=False))
        else:
            warnings.warn(
                f"{rng_file} is missing (saved with other ranks); RNG states not restored", stacklevel=2
            )
        trainer_file = directory / "trainer_state.pt"
        trainer_state = (
            torch.load(trainer_file, map_location="cpu", weights_only=False)
            if trainer_file.is_file()
            else None
        )
        return LoadedCheckpoint(step=step, path=directory, trainer_state=trainer_state, skipped=skipped)

    def load_role(self, step: int, name: str, role: Any) -> None:
        """Restore role `name` alone from checkpoint `step` — a role on ranks of its own, after
        `load` on the main roles chose and verified that step (its manifest covers this role too)."""
        directory = self.step_dir(step) / name
        if not directory.is_dir():
            raise ValueError(
                f"checkpoint {self.step_dir(step)} holds no {name!r} (it was saved without that role)"
            )
        _read_role(role, directory, self.dp.rank == 0)


def _write_role(role: Any, directory: Path, main: bool, writes: Writes) -> None:
    """The role's full states into directory/{model,optimizer,extra}.pt (a collective; rank 0 writes)."""
    state = role.checkpoint_state()
    if main:
        for part in PARTS:
            writes.save(state[part], directory / f"{part}.pt")


def _read_role(role: Any, directory: Path, main: bool) -> None:
    """Rank 0 reads the model and optimizer states (broadcast by the role), every rank the small extra."""
    state = {
        part: torch.load(directory / f"{part}.pt", map_location="cpu", weights_only=False) if main else {}
        for part in ("model", "optimizer")
    }
    state["extra"] = torch.load(directory / "extra.pt", map_location="cpu", weights_only=False)
    role.load_checkpoint_state(state)
