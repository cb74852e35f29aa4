"""Layer 1, config: how one setting is declared, and how the schema is walked.

Every field of every config dataclass is made with `setting(default, doc, ...)` (or `section(cls, doc)`
for a nested group), so its default, one-line meaning, verl counterpart and allowed values live in
one place. Loading, validation and the generated docs/config.md all read them through `walk_settings`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


def setting(default: Any, doc: str, *, verl: str = "", choices: tuple[str, ...] = ()) -> Any:
    """A dataclass field with its default and a one-line doc.

    verl: the verl key this setting corresponds to (shown in the docs and used to suggest our name
    when someone writes verl's). choices: the allowed string values, checked by `validate_config`
    (names that live in an `algo/` registry are checked against the registry instead).
    """
    metadata = {"doc": doc, "verl": verl, "choices": tuple(choices)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def section(cls: type, doc: str) -> Any:
    """A nested group of settings (a config dataclass) with a one-line doc."""
    return field(default_factory=cls, metadata={"doc": doc, "verl": "", "choices": ()})


@dataclass(frozen=True)
class SettingInfo:
    """One leaf setting of the schema, as found by `walk_settings`."""

    key: str  # dotted, e.g. "rollout.val_kwargs.temperature"
    type: Any  # the resolved annotation, e.g. int, list[str], float | None
    default: Any
    doc: str
    verl: str
    choices: tuple[str, ...]

    @property
    def accepts_any_subkey(self) -> bool:
        """True for free-form dict settings (e.g. reward.function_kwargs), whose keys are the user's."""
        return typing.get_origin(self.type) is dict


@dataclass(frozen=True)
class SectionInfo:
    """One group of settings (a config dataclass) in the schema."""

    key: str  # dotted, "" for the root
    cls: type
    doc: str


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def walk_settings(cls: type, prefix: str = "") -> Iterator[SettingInfo | SectionInfo]:
    """Every section and leaf setting of config dataclass `cls`, depth first, in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        doc = f.metadata.get("doc", "")
        annotation = hints[f.name]
        if dataclasses.is_dataclass(annotation):
            yield SectionInfo(key=key, cls=annotation, doc=doc)
            yield from walk_settings(annotation, prefix=f"{key}.")
        else:
            yield SettingInfo(
                key=key,
                type=annotation,
                default=_default_of(f),
                doc=doc,
                verl=f.metadata.get("verl", ""),
                choices=f.metadata.get("choices", ()),
            )


@functools.cache
def leaf_settings(cls: type) -> dict[str, SettingInfo]:
    """Dotted key -> SettingInfo for every leaf setting of `cls` (cached: do not modify)."""
    return {info.key: info for info in walk_settings(cls) if isinstance(info, SettingInfo)}


@functools.cache
def section_keys(cls: type) -> frozenset[str]:
    """Dotted keys of every nested section of `cls` (e.g. "rollout", "rollout.val_kwargs")."""
    return frozenset(info.key for info in walk_settings(cls) if isinstance(info, SectionInfo))


def type_name(annotation: Any) -> str:
    """A short readable name for an annotation: int, list[str], float | None."""
    if isinstance(annotation, type) and typing.get_origin(annotation) is None:
        return annotation.__name__
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else type_name(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    return str(annotation).replace("typing.", "")


def value_matches_type(value: Any, annotation: Any) -> bool:
    """True when `value` fits a setting's annotation (an int is a float; a bool is not an int)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(value_matches_type(value, arg) for arg in args)
    if annotation is Any:
        return True
    if annotation is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(value_matches_type(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict)
    if isinstance(value, bool):
        return annotation is bool
    if annotation is float:
        return isinstance(value, (int, float))
    return isinstance(value, annotation)


def get_by_key(obj: Any, key: str) -> Any:
    """The value at dotted `key` in a config object (dataclass instance)."""
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj
