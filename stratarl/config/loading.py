"""Layer 1, config: schema defaults ← recipe YAML ← dotted CLI overrides, merged with OmegaConf.

A recipe holds overrides only (nested YAML); `extends: other.yaml` (relative to the recipe) layers it
on another recipe. Unknown keys (with the nearest valid key, or our name for a verl key) and values
of the wrong type are all collected and raised together as one `ConfigError`. A run's saved
`config.yaml` holds every setting resolved, with file and directory paths made absolute.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from stratarl.config.errors import ConfigError, ConfigProblem
from stratarl.config.schema_run import RunConfig
from stratarl.config.setting import leaf_settings, section_keys, type_name

EXTENDS_KEY = "extends"
VERL_PREFIX = "actor_rollout_ref."


def load_config(recipe: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """The typed RunConfig: schema defaults, then the recipe, then `key=value` overrides."""
    layers = _read_recipe(Path(recipe)) if recipe is not None else []
    problems: list[ConfigProblem] = []
    layers.append(_parse_overrides(overrides, problems))
    return load_config_data(OmegaConf.to_container(OmegaConf.merge(*layers), resolve=False), problems)


def load_config_data(data: dict, problems: Sequence[ConfigProblem] = ()) -> RunConfig:
    """The typed RunConfig from nested plain data over the schema defaults (a translated verl command
    line, `stratarl verl`); unknown keys and wrong types raised together with `problems`."""
    problems = list(problems)
    cfg = _merge_typed(_known_part(data, "", problems), problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def to_yaml(cfg: RunConfig, *, absolute_paths: bool = False) -> str:
    """Every setting of `cfg` as YAML, interpolations resolved (paths made absolute if asked)."""
    return OmegaConf.to_yaml(OmegaConf.create(resolved_settings(cfg, absolute_paths=absolute_paths)))


def resolved_settings(cfg: RunConfig, *, absolute_paths: bool = False) -> dict[str, Any]:
    """`cfg` as nested plain data, interpolations resolved; with absolute_paths, every setting
    that names a file or directory (`path_keys`) made absolute against the current directory."""
    tree = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    if absolute_paths:
        for key in path_keys():
            *parents, leaf = key.split(".")
            node = tree
            for part in parents:
                node = node[part]
            value = node[leaf]
            node[leaf] = [_absolute(v) for v in value] if isinstance(value, list) else _absolute(value)
    return tree


def path_keys() -> list[str]:
    """Settings that name files or directories: a leaf named `path` or ending in `_path`, `_files`,
    `_root` or `_dir` (tests/config/test_loading.py lists them, so a new one is noticed)."""
    return [
        key
        for key in leaf_settings(RunConfig)
        if key.rpartition(".")[2] == "path" or key.endswith(("_path", "_files", "_root", "_dir"))
    ]


def _absolute(value: str | None) -> str | None:
    return os.path.abspath(os.path.expanduser(value)) if value else value


def save_resolved_config(cfg: RunConfig, run_dir: str | Path) -> Path:
    """Write the full resolved config to `run_dir/config.yaml` (loadable as a recipe, paths absolute,
    so it repeats the run from any directory); return its path. Written beside and renamed over
    the old file: a crash leaves the old config or the new one. (config imports no other layer, so
    the few lines of `observe.run_log.replace_atomically` are repeated here.)"""
    path = Path(run_dir) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# The resolved config of this run; `stratarl train <this file>` repeats it.\n"
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(header + to_yaml(cfg, absolute_paths=True))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def _read_recipe(path: Path, chain: tuple[Path, ...] = ()) -> list[DictConfig]:
    """The recipe at `path` after the recipes it extends (base first)."""
    recipe_problem = ("recipe",)
    if path.resolve() in chain:
        raise ConfigError([ConfigProblem(recipe_problem, f"recipes extend each other in a cycle: {path}")])
    if not path.is_file():
        raise ConfigError([ConfigProblem(recipe_problem, f"recipe file not found: {path}")])
    try:
        node = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException) as err:
        raise ConfigError([ConfigProblem(recipe_problem, f"cannot read {path}: {err}")]) from err
    if not isinstance(node, DictConfig):
        raise ConfigError([ConfigProblem(recipe_problem, f"{path} must hold a mapping of settings")])
    base = node.pop(EXTENDS_KEY, None)
    layers = _read_recipe(path.parent / str(base), (*chain, path.resolve())) if base else []
    return [*layers, node]


def _parse_overrides(overrides: Sequence[str], problems: list[ConfigProblem]) -> DictConfig:
    """`key=value` strings as one config (values parsed as YAML: 8, 0.5, true, null, [a,b])."""
    good = []
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            problems.append(ConfigProblem((item,), "an override must read key=value, e.g. rollout.n=8"))
            continue
        good.append(item.lstrip("+"))  # Hydra's "+" (add a key) has no meaning here: the schema is closed
    try:
        return OmegaConf.from_dotlist(good)
    except OmegaConfBaseException as err:
        problems.append(ConfigProblem(tuple(good), f"cannot parse overrides: {err}"))
        return OmegaConf.create({})


def _known_part(node: dict, prefix: str, problems: list[ConfigProblem]) -> dict:
    """`node` without the keys the schema lacks (each reported), recursing into sections."""
    leaves, sections = leaf_settings(RunConfig), section_keys(RunConfig)
    kept = {}
    for name, value in node.items():
        key = f"{prefix}{name}"
        if key in sections:
            if isinstance(value, dict):
                kept[name] = _known_part(value, f"{key}.", problems)
            else:
                example = next(k for k in leaves if k.startswith(f"{key}."))
                problems.append(
                    ConfigProblem((key,), f"is a group of settings; set its keys, e.g. {example}=...")
                )
        elif key in leaves:
            if isinstance(value, dict) and not leaves[key].accepts_any_subkey:
                expected = type_name(leaves[key].type)
                problems.append(ConfigProblem((key,), f"expected {expected}, got a mapping {value}"))
            else:
                kept[name] = value
        else:
            problems += [ConfigProblem((k,), f"unknown key{_suggestion(k)}") for k in _flat_keys(value, key)]
    return kept


def _flat_keys(value: Any, key: str) -> list[str]:
    """Dotted keys of the leaves under `key` (`key` itself when `value` is not a mapping)."""
    if not isinstance(value, dict) or not value:
        return [key]
    return [leaf for name, sub in value.items() for leaf in _flat_keys(sub, f"{key}.{name}")]


def _suggestion(key: str) -> str:
    """'; did you mean X?' with our name for a verl key, else the nearest valid key (difflib)."""
    leaves = leaf_settings(RunConfig)
    for ours, info in leaves.items():
        verl_key = info.verl.split(" ")[0]
        if verl_key and not ours.startswith("sft.") and key in (verl_key, verl_key.removeprefix(VERL_PREFIX)):
            return f"; verl's {verl_key} is {ours!r} here"
    parent, _, leaf = key.rpartition(".")
    siblings = [k.rpartition(".")[2] for k in leaves if k.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {f'{parent}.{close[0]}' if parent else close[0]!r}?"
    close = difflib.get_close_matches(key, [*leaves, *section_keys(RunConfig)], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _merge_typed(known: dict, problems: list[ConfigProblem]) -> RunConfig | None:
    """Merge `known` into the typed schema; each value OmegaConf rejects is reported and dropped."""
    leaves = leaf_settings(RunConfig)
    for _ in range(len(leaves) + 1):
        try:
            merged = OmegaConf.merge(OmegaConf.structured(RunConfig), known)
            return OmegaConf.to_object(merged)  # type: ignore[return-value]
        except OmegaConfBaseException as err:
            key = err.full_key or ""
            value = _pop(known, key)
            if key not in leaves or value is _ABSENT:
                problems.append(ConfigProblem((key or "config",), str(err).splitlines()[0]))
                return None
            problems.append(ConfigProblem((key,), _type_message(key, value, err)))
    return None


def _type_message(key: str, value: Any, err: OmegaConfBaseException) -> str:
    expected = type_name(leaf_settings(RunConfig)[key].type)
    hint = f" (write {key}=[{value}])" if expected.startswith("list") and not isinstance(value, list) else ""
    # A failed conversion says nothing more than this; other errors (interpolation) need OmegaConf's words.
    cause = "" if isinstance(err, ValidationError) else f": {str(err).splitlines()[0]}"
    return f"expected {expected}, got {value!r}{hint}{cause}"


_ABSENT = object()


def _pop(tree: dict, key: str) -> Any:
    """Remove dotted `key` from nested dict `tree`; return its value, or _ABSENT."""
    *parents, leaf = key.split(".")
    for part in parents:
        tree = tree.get(part, {})
        if not isinstance(tree, dict):
            return _ABSENT
    return tree.pop(leaf, _ABSENT)
