"""Fixtures of the parity tests (verl, imported only when a parity test runs) and the deviation table."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.parity.verl_091 import DEVIATIONS, deviation_table, load_verl


@pytest.fixture(scope="session")
def verl() -> SimpleNamespace:
    return load_verl()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if DEVIATIONS:
        terminalreporter.section("stratarl vs verl 0.9.1: largest deviation per family")
        for line in deviation_table():
            terminalreporter.write_line(line)
