"""Layer 1, config: `ConfigError`, raised once with every problem found, each naming its key(s)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a config: the dotted keys involved and what to do about it."""

    keys: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"{', '.join(self.keys)}: {self.message}"


class ConfigError(ValueError):
    """An invalid config. `problems` lists every problem found; the message shows them all."""

    def __init__(self, problems: Iterable[ConfigProblem]):
        self.problems = list(problems)
        count = len(self.problems)
        lines = [f"invalid config ({count} problem{'s' if count != 1 else ''}):"]
        lines += [f"  - {problem}" for problem in self.problems]
        super().__init__("\n".join(lines))

    @property
    def keys(self) -> set[str]:
        """Every key named by any problem."""
        return {key for problem in self.problems for key in problem.keys}
