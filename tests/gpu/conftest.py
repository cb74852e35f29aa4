"""The GPU tests' fixtures: the trainer tests' tiny arithmetic task and model (built on the CPU)."""

from tests.trainer.conftest import task  # noqa: F401  (a fixture, found by name)
