"""READ_BY_MODE (the async_training keys each trainer.mode reads, behind the "has no effect" warning)
against the code: every function outside stratarl/config/ that touches cfg.async_training is run with
a recording section, and what sync and one_step_off read is exactly what READ_BY_MODE says."""

import ast
import dataclasses
from pathlib import Path

import pytest
from transformers import Qwen2Config

from stratarl.assembly import roles
from stratarl.config import load_config
from stratarl.config.schema_async import READ_BY_MODE, AsyncTrainingConfig, async_problems
from stratarl.trainer import correction, pi_old, training_modes

PACKAGE = Path(__file__).resolve().parents[2] / "stratarl"
KEYS = {f.name: f for f in dataclasses.fields(AsyncTrainingConfig)}


class RecordingSection:
    """Stands in for cfg.async_training and records the names of the keys read through it."""

    def __init__(self, section: AsyncTrainingConfig):
        self._section, self.read = section, set()

    def __getattr__(self, name):
        if name in KEYS:
            self.read.add(name)
        return getattr(self._section, name)


@dataclasses.dataclass
class StubCollector:
    tracer: object = None  # the producer copies its collector's tracer, nothing more at build time


class StubWorker:
    weight_version = 0


def _run_read_sites(cfg) -> None:
    """Each function of READ_SITES, the way the trainer calls it for `cfg`."""
    correction.correction_settings(cfg)
    pi_old.reuse_blockers(
        cfg, model_has_dropout=pi_old.has_dropout(Qwen2Config()), estimator_inputs=frozenset()
    )
    roles.rollout_engine_spec(cfg, share_weights=roles.shares_weights(cfg))
    source = training_modes.build_batch_source(
        cfg, StubCollector(), StubWorker(), None, total_steps=2, version_of=lambda s: s - 1, first_step=1
    )
    source.close()


READ_SITES = {  # (module under stratarl/, function): every place outside config/ that reads async_training
    ("trainer/correction.py", "correction_settings"),
    ("trainer/training_modes.py", "build_batch_source"),
    ("trainer/pi_old.py", "reuse_blockers"),
    ("assembly/roles.py", "rollout_engine_spec"),
}


def reads_in(mode: str) -> set[str]:
    cfg = load_config(None, [f"trainer.mode={mode}"])
    cfg.async_training = recorder = RecordingSection(cfg.async_training)
    _run_read_sites(cfg)
    return recorder.read


def _functions_touching_async_training() -> set[tuple[str, str]]:
    """(module, innermost enclosing function) of every `.async_training` attribute outside config/."""
    found = set()

    def visit(node: ast.AST, module: str, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Attribute) and child.attr == "async_training":
                found.add((module, function))
            visit(child, module, inner)

    for path in PACKAGE.rglob("*.py"):
        module = path.relative_to(PACKAGE).as_posix()
        if not module.startswith("config/"):
            visit(ast.parse(path.read_text()), module, "<module>")
    return found


def test_the_read_sites_run_here_are_every_place_that_reads_async_training():
    """A new read elsewhere must be added to READ_SITES (and run by `_run_read_sites`), or the
    comparison with READ_BY_MODE below would not see it."""
    assert _functions_touching_async_training() == READ_SITES


def _non_default_values(name: str) -> list:
    info = KEYS[name]
    choices = info.metadata.get("choices") or ()
    if choices:
        return [c for c in choices if c != info.default]
    return [not info.default] if isinstance(info.default, bool) else []


@pytest.mark.parametrize("mode", sorted(READ_BY_MODE))
def test_a_mode_reads_exactly_the_keys_read_by_mode_lists(mode):
    """Keys read but not listed must be pinned to their default in that mode by validation (then no
    warning can be wrong about them); every listed key must really be read (or its warning would
    be silenced for nothing)."""
    read, listed = reads_in(mode), set(READ_BY_MODE[mode])
    assert listed <= read, f"READ_BY_MODE[{mode!r}] lists keys {mode} never reads: {listed - read}"
    for name in sorted(read - listed):
        values = _non_default_values(name)
        assert values, f"trainer.mode={mode} reads async_training.{name}: add it to READ_BY_MODE"
        for value in values:
            cfg = load_config(None, [f"trainer.mode={mode}", f"async_training.{name}={value}"])
            named = [p for p in async_problems(cfg) if f"async_training.{name}" in p.keys]
            assert named, (
                f"trainer.mode={mode} reads async_training.{name}, which READ_BY_MODE leaves out, and "
                f"accepts {name}={value}: add it to READ_BY_MODE"
            )


def test_async_reads_every_key_which_is_why_read_by_mode_leaves_it_out():
    assert reads_in("async") == set(KEYS)
    assert "async" not in READ_BY_MODE  # async_warnings: a mode missing from READ_BY_MODE reads all
