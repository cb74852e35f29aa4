"""Layer 1, config: a verl command line read as verl reads it — verl 0.9.1's defaults (the generated
`ppo_trainer.yaml` in its wheel, read as YAML: verl itself is not imported), then a verl YAML config
(`--config-path DIR --config-name NAME`), then Hydra overrides, interpolations resolved.

The result is a `VerlArgs`: every leaf key with its value, verl's default, and whether it was given.
"""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from stratarl.config.errors import ConfigError, ConfigProblem
from stratarl.config.hydra_overrides import ADD, DELETE, SET, Override, OverrideSyntaxError, parse_override

GENERATED_YAML = "trainer/config/_generated_ppo_trainer.yaml"
BASE_NAMES = ("ppo_trainer", "/ppo_trainer", "_self_")  # a user config's defaults that name verl's own
MISSING = object()


def verl_defaults_path() -> Path | None:
    """verl's generated PPO config in the installed wheel (found without importing verl), or None."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GENERATED_YAML
    return path if path.is_file() else None


@dataclass
class VerlArgs:
    """One verl configuration: resolved leaf values, verl's defaults, and the keys the user set."""

    values: dict[str, Any]  # dotted leaf key -> resolved value
    defaults: dict[str, Any]  # the same for verl's untouched defaults
    given: dict[str, str] = field(default_factory=dict)  # dotted key -> where it was set
    followers: frozenset[str] = frozenset()  # keys whose default is an interpolation of another key

    def value(self, key: str, fallback: Any = None) -> Any:
        return self.values.get(key, self.defaults.get(key, fallback))

    def is_given(self, key: str) -> bool:
        return key in self.given

    def differs(self, key: str) -> bool:
        """True when `key` was set to something other than verl's default (a key that follows
        another by interpolation differs only where it was set itself)."""
        if key in self.followers and key not in self.given:
            return False
        return self.values.get(key, MISSING) != self.defaults.get(key, MISSING)

    def subtree(self, prefix: str) -> dict[str, Any]:
        """Leaves under `prefix.` as a flat dict keyed by the rest of their key."""
        return {k[len(prefix) + 1 :]: v for k, v in self.values.items() if k.startswith(f"{prefix}.")}


def read_verl_args(
    overrides: list[str], *, config_path: str | None = None, config_name: str | None = None
) -> VerlArgs:
    """verl's defaults, then the YAML config, then the overrides; every problem raised at once."""
    base_path = verl_defaults_path()
    if base_path is None:
        problem = "verl's defaults are read from its wheel: pip install --no-deps verl==0.9.1"
        raise ConfigError([ConfigProblem(("verl",), problem)])
    base = OmegaConf.load(base_path)
    problems: list[ConfigProblem] = []
    given: dict[str, str] = {}
    node = OmegaConf.merge(base, _user_config(config_path, config_name, given, problems))
    for text in overrides:
        _apply(node, text, given, problems)
    values = _resolved_leaves(node, problems)
    if problems:
        raise ConfigError(problems)
    raw = _leaves(OmegaConf.to_container(base, resolve=False))
    followers = frozenset(key for key, value in raw if isinstance(value, str) and "${" in value)
    return VerlArgs(values, _resolved_leaves(base, problems), given, followers)


def _user_config(
    config_path: str | None, config_name: str | None, given: dict[str, str], problems: list[ConfigProblem]
) -> DictConfig:
    """The user's YAML (its own keys only; a `defaults` list may name only verl's ppo_trainer)."""
    if config_name in (None, "ppo_trainer"):
        return OmegaConf.create({})
    path = Path(config_path or ".") / (
        config_name if config_name.endswith(".yaml") else f"{config_name}.yaml"
    )
    if not path.is_file():
        problems.append(ConfigProblem(("--config-name",), f"verl config not found: {path}"))
        return OmegaConf.create({})
    node = OmegaConf.load(path)
    node.pop("hydra", None)  # Hydra's own settings (search paths, run dirs): nothing to translate
    for entry in node.pop("defaults", []) or []:
        if entry not in BASE_NAMES:
            reason = "only verl's ppo_trainer (and _self_) can be composed here; copy its keys into the file"
            problems.append(ConfigProblem((f"{path}: defaults",), f"{entry!r}: {reason}"))
    for key, _ in _leaves(OmegaConf.to_container(node, resolve=False)):
        given[key] = str(path)
    return node


def _apply(node: DictConfig, text: str, given: dict[str, str], problems: list[ConfigProblem]) -> None:
    """One Hydra override applied to `node`, with Hydra's rules for keys that exist or do not."""
    try:
        override = parse_override(text)
    except OverrideSyntaxError as err:
        problems.append(ConfigProblem((text,), str(err)))
        return
    parent, _, leaf = override.key.rpartition(".")
    container = OmegaConf.select(node, parent, default=None) if parent else node
    # keys(): `leaf in container` is False for a mandatory `???` value, which Hydra counts as present
    exists = isinstance(container, DictConfig) and leaf in container.keys()  # noqa: SIM118
    message = _hydra_refusal(override, exists, "" if exists else _nearest(node, override.key))
    if message:
        problems.append(ConfigProblem((override.key,), message))
        return
    if override.op == DELETE:
        container.pop(leaf)
    else:
        OmegaConf.update(node, override.key, override.value, merge=False, force_add=True)
    given[override.key] = "command line"


def _hydra_refusal(override: Override, exists: bool, nearest: str) -> str:
    if override.op == SET and not exists:
        return f"is not in verl's config{nearest}; to add it write +{override.key}=... (Hydra's rule)"
    if override.op == ADD and exists:
        return f"is already in verl's config: write {override.key}=... (or ++{override.key}=...)"
    if override.op == DELETE and not exists:
        return "cannot be deleted: it is not in verl's config"
    return ""


def _nearest(node: DictConfig, key: str) -> str:
    """'; did you mean K?' with the nearest leaf key of `node`, or ''."""
    keys = [k for k, _ in _leaves(OmegaConf.to_container(node, resolve=False))]
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.8)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _resolved_leaves(node: DictConfig, problems: list[ConfigProblem]) -> dict[str, Any]:
    """Every leaf of `node`, interpolations resolved (a mandatory `???` left out: it has no value)."""
    try:
        tree = OmegaConf.to_container(node, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as err:
        problems.append(ConfigProblem((err.full_key or "verl config",), str(err).splitlines()[0]))
        return {}
    return {key: value for key, value in _leaves(tree) if value != "???"}


def _leaves(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf; an empty dict is a leaf, a list is a value."""
    if isinstance(tree, dict) and tree:
        return [leaf for name, sub in tree.items() for leaf in _leaves(sub, f"{prefix}{name}.")]
    return [(prefix[:-1], tree)]


def verl_leaf_keys() -> list[str]:
    """The dotted key of every leaf of verl's generated default config (empty when verl is absent)."""
    path = verl_defaults_path()
    if path is None:
        return []
    return [key for key, _ in _leaves(OmegaConf.to_container(OmegaConf.load(path), resolve=False))]
