"""Layer 6, RL math: looking a variant up by name in one of the layer's plain-dict registries."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


def look_up(registry: Mapping[str, T], name: str, kind: str) -> T:
    """registry[name]; otherwise ValueError naming the valid names and the closest one."""
    if name in registry:
        return registry[name]
    close = difflib.get_close_matches(name, list(registry), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown {kind} {name!r}; valid names: {sorted(registry)}.{hint}")
