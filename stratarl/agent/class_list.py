"""Layer 5, agent loops: verl's class-list configs, the YAML format of tools and of interactions.

    <key>:
      - class_name: pkg.module.SomeClass
        ...

Each entry names a class by dotted path; the caller builds one named object from each entry and
its class. `build_class_list` checks what every such list needs (a list under the key, a dict with
`class_name` per entry, a subclass of the expected base, no name twice) so each format states only
its own fields (`agent/tools/registry.py`, `agent/interactions/base.py`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml


class Named(Protocol):
    name: str


T = TypeVar("T", bound=Named)


def import_class(dotted: str) -> type:
    """`pkg.module.Class` -> the class; errors name the path."""
    module_name, _, class_name = dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"class_name must be a dotted path like pkg.module.Class, got {dotted!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(f"cannot import module {module_name!r} for {dotted!r}: {err}") from err
    if not hasattr(module, class_name):
        raise AttributeError(f"module {module_name!r} has no class {class_name!r}")
    return getattr(module, class_name)


def build_class_list(
    config: Any,
    key: str,
    base: type,
    build: Callable[[type, dict[str, Any], str], T],
    *,
    required: tuple[str, ...] = ("class_name",),
) -> dict[str, T]:
    """{name: object} from the list `config[key]`: `build(cls, entry, where)` makes each object from
    its entry and the `base` subclass the entry names (`where`, e.g. "tools[2]", for its errors).

    Every entry must be a dict holding the `required` keys; a name built twice is refused. Every
    error names the entry (`where`), also one raised by the class's own constructor.
    """
    entries = config.get(key) if isinstance(config, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"the config needs a top-level {key!r} list")
    built: dict[str, T] = {}
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if not isinstance(entry, dict) or any(field not in entry for field in required):
            raise ValueError(f"{where} needs {' and '.join(repr(field) for field in required)}")
        try:
            cls = import_class(entry["class_name"])
        except (ImportError, AttributeError, ValueError) as err:
            raise type(err)(f"{where}: {err}") from None
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(f"{where}: {entry['class_name']} is not a stratarl {base.__name__} subclass")
        try:
            item = build(cls, entry, where)
        except Exception as err:  # the class's own __init__: whatever it raises, name the entry
            if str(err).startswith(where):
                raise
            raise ValueError(
                f"{where}: building {entry['class_name']} raised {type(err).__name__}: {err}"
            ) from err
        if item.name in built:
            raise ValueError(f"{where}: duplicate name {item.name!r}")
        built[item.name] = item
    return built


def read_class_list_file(path: str | Path) -> dict[str, Any]:
    """The parsed YAML file (an empty file is an empty config)."""
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}
