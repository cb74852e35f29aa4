"""The layer rules of docs/design.md as data, and a checker that applies them to any source tree.

The checker parses imports with `ast` (nothing is imported or executed), so it runs on the real
package and on the synthetic trees the tests build to prove that each rule can fail.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "stratarl"
LAYER5 = ("engine", "rollout", "agent", "reward", "data")

# Which stratarl packages each package may import (its own package is always allowed).
# Top-level modules (cli.py, __main__.py) compose the layers and may import any of them.
ALLOWED_INTERNAL: dict[str, frozenset[str]] = {
    "algo": frozenset(),
    "transport": frozenset(),
    "observe": frozenset({"transport"}),
    # config validates names against the math registries; nothing below it receives a config.
    "config": frozenset({"algo"}),
    # The objectives the updates minimize: the math of `algo` composed over a micro-batch.
    "objective": frozenset({"algo", "transport"}),
    **{pkg: frozenset({"algo", "transport", "observe", *LAYER5}) for pkg in LAYER5},
    "cluster": frozenset({"algo", "transport", "observe", *LAYER5}),
    # A run directory's records (lock, lineage, checkpoint contents, end products): what the
    # trainer writes when it decides to; they name the config and the cluster's checkpoint and
    # handle types, never the trainer that drives them.
    "run_directory": frozenset({"config", "cluster", "observe"}),
    # What a config builds (datasets, the roles' specs and worker groups, losses, the reward, the
    # watchdog): config in, typed specs and built objects out. Like the trainer, it reaches engines
    # and rollout only through the cluster.
    "assembly": frozenset(
        {"config", "cluster", "transport", "algo", "objective", "observe", "data", "reward", "agent"}
    ),
    # The trainer reaches engines and rollout only through cluster handles.
    "trainer": frozenset(
        {
            "config",
            "assembly",
            "run_directory",
            "cluster",
            "transport",
            "algo",
            "objective",
            "observe",
            "data",
            "reward",
            "agent",
        }
    ),
}
# Applications (the quickstarts, `stratarl init`) compose the layers as cli.py does: they may import
# every package, and no package may import them (the top-level cli.py does).
ALLOWED_INTERNAL["apps"] = frozenset(ALLOWED_INTERNAL)

# Interface modules (data types, no compute) a package may import although their layer is closed to
# it: the trainer builds `SamplingParams` for the rollout phase but never touches an engine.
ALLOWED_INTERFACE_MODULES: dict[str, frozenset[str]] = {
    "trainer": frozenset({"stratarl.rollout.interface"}),
    "assembly": frozenset({"stratarl.rollout.interface"}),
}

# Third-party packages a layer may import at all (None: no closed list). Stdlib is always allowed.
ALLOWED_THIRD_PARTY: dict[str, frozenset[str] | None] = {
    "algo": frozenset({"torch", "numpy"}),
    "objective": frozenset({"torch", "numpy"}),
    "transport": frozenset({"torch", "numpy", "tensordict"}),
}

# Third-party modules reserved to some packages: (module prefix, packages allowed to import it).
RESERVED_MODULES: tuple[tuple[str, frozenset[str]], ...] = (
    ("ray", frozenset({"cluster"})),
    ("torch.distributed", frozenset({"engine", "rollout"})),
    ("vllm", frozenset({"rollout"})),
    ("sglang", frozenset({"rollout"})),
)

FORBIDDEN_MODULE_NAMES = frozenset({"utils", "helpers", "common", "misc"})
MAX_MODULE_LINES = 600


@dataclass(frozen=True)
class Violation:
    path: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: [{self.rule}] {self.detail}"


def _imported_modules(tree: ast.AST, module_name: str, is_package: bool) -> list[str]:
    """Absolute dotted names of every module a file imports, relative imports resolved."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                parts = module_name.split(".")
                anchor = parts if is_package else parts[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names.append(base)
            # `from pkg import sub` may import a submodule: record pkg.sub too.
            names.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _layer_of(parts: tuple[str, ...]) -> str | None:
    """The layer package a file lives in (`stratarl/algo/x.py` -> algo); None for top-level modules."""
    return parts[1] if len(parts) > 2 else None


def _check_imports(rel: str, layer: str | None, imported: list[str]) -> list[Violation]:
    found: list[Violation] = []
    for name in sorted(set(imported)):
        top = name.split(".")[0]
        if top == PACKAGE:
            target = name.split(".")[1] if "." in name else None
            crosses_layers = layer and target in ALLOWED_INTERNAL and target != layer
            interfaces = ALLOWED_INTERFACE_MODULES.get(layer, frozenset())
            is_interface = any(name == m or name.startswith(m + ".") for m in interfaces)
            if crosses_layers and target not in ALLOWED_INTERNAL[layer] and not is_interface:
                found.append(Violation(rel, "layer-direction", f"`{layer}` must not import `{name}`"))
            continue
        if top in sys.stdlib_module_names or top == "__future__" or not top:
            continue
        closed = ALLOWED_THIRD_PARTY.get(layer) if layer else None
        if closed is not None and top not in closed:
            found.append(
                Violation(rel, "third-party", f"`{layer}` may import only {sorted(closed)}, not `{name}`")
            )
        for prefix, owners in RESERVED_MODULES:
            if (name == prefix or name.startswith(prefix + ".")) and layer not in owners:
                found.append(
                    Violation(rel, "reserved-module", f"only {sorted(owners)} may import `{prefix}` ({name})")
                )
    return found


def check_tree(root: Path, package: str = PACKAGE) -> list[Violation]:
    """All rule violations in `root/package` (import direction, module size and names)."""
    found: list[Violation] = []
    pkg_dir = root / package
    for path in sorted(pkg_dir.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module_name = ".".join(parts[:-1] if is_package else parts)
        for part in parts:
            if part in FORBIDDEN_MODULE_NAMES:
                detail = f"no module may be named `{part}`: name the concept"
                found.append(Violation(rel, "module-name", detail))
        source = path.read_text(encoding="utf-8")
        n_lines = source.count("\n") + 1
        if n_lines > MAX_MODULE_LINES:
            found.append(Violation(rel, "module-size", f"{n_lines} lines > {MAX_MODULE_LINES}: split it"))
        tree = ast.parse(source, filename=str(path))
        layer = _layer_of(parts)
        if layer is not None and layer not in ALLOWED_INTERNAL:
            found.append(Violation(rel, "unknown-layer", f"`{layer}` is in no layer: add it to the rules"))
            continue
        imported = _imported_modules(tree, module_name, is_package)
        found.extend(_check_imports(rel, layer, imported))
    return found
