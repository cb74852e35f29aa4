"""Fixtures of the run-directory tests: the trainer tests' tiny arithmetic task and 1M model (the
claim is tested through real, short training runs)."""

from tests.trainer.conftest import task  # noqa: F401  (the fixture)
