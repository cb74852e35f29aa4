"""Layer 1, config: Hydra's override grammar, as verl's command lines write it (no Hydra needed).

    key=value     change a key the config has        +key=value   add a key it lacks
    ++key=value   add or change                      ~key / ~key=value   delete a key

Values follow Hydra's rules, not YAML's: `1e-6` is a float, `null`/`true`/`False` are what they say,
`[a,b]` and `{k: v}` nest, 'quoted' and "quoted" text is a string whatever it holds, and anything else
(`~/data/train.parquet`, `Qwen/Qwen2.5-0.5B`) is a plain string. verl's example scripts pass lists as
`data.train_files="['$a', '$b']"`, which the shell turns into `data.train_files=['/x/a', '/x/b']`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SET, ADD, FORCE_ADD, DELETE = "set", "add", "force_add", "delete"
_PREFIXES = (("++", FORCE_ADD), ("+", ADD), ("~", DELETE))
_KEY = re.compile(r"^[A-Za-z_][\w\-]*(\.[\w\-]+)*$")
_INT = re.compile(r"^[+-]?\d[\d_]*$")
_FLOAT = re.compile(r"^[+-]?((\d[\d_]*)?\.\d+|\d[\d_]*\.?)([eE][+-]?\d+)?$|^[+-]?(inf|nan)$", re.I)
_CLOSING = {"[": "]", "{": "}"}


class OverrideSyntaxError(ValueError):
    """An override that Hydra would not parse; the message says what is wrong with it."""


@dataclass(frozen=True)
class Override:
    """One parsed override: what it does (SET, ADD, FORCE_ADD, DELETE), to which dotted key."""

    op: str
    key: str
    value: Any  # None for a DELETE without a value
    text: str  # as written, for messages


def parse_override(text: str) -> Override:
    """`key=value`, `+key=value`, `++key=value`, `~key` or `~key=value` as an Override."""
    op, body = SET, text
    for prefix, name in _PREFIXES:
        if text.startswith(prefix):
            op, body = name, text[len(prefix) :]
            break
    key, sep, raw = body.partition("=")
    key = key.strip()
    if not _KEY.match(key):
        raise OverrideSyntaxError(
            f"{text!r}: not a dotted key (write key=value, e.g. data.train_batch_size=8)"
        )
    if not sep and op != DELETE:
        raise OverrideSyntaxError(f"{text!r}: an override reads key=value (or ~key to delete)")
    return Override(op, key, parse_value(raw) if sep else None, text)


def parse_value(text: str) -> Any:
    """One Hydra value: a quoted string, a list, a dict, or a scalar."""
    value, rest = _parse_element(text.strip(), 0)
    if rest != len(text.strip()):
        raise OverrideSyntaxError(f"cannot parse the value {text!r}: unexpected {text.strip()[rest:]!r}")
    return value


def _parse_element(text: str, pos: int) -> tuple[Any, int]:
    """The value starting at `pos` of `text`, and the position after it (inside a list: up to , or ])."""
    while pos < len(text) and text[pos] == " ":
        pos += 1
    if pos < len(text) and text[pos] in "'\"":
        end = _closing_quote(text, pos)
        return text[pos + 1 : end].replace(f"\\{text[pos]}", text[pos]), end + 1
    if pos < len(text) and text[pos] in _CLOSING:
        return _parse_container(text, pos)
    end = pos
    depth = 0
    while end < len(text) and not (depth == 0 and text[end] in ",]}"):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    return _scalar(text[pos:end].strip()), end


def _closing_quote(text: str, start: int) -> int:
    quote, pos = text[start], start + 1
    while pos < len(text):
        if text[pos] == "\\":
            pos += 2
            continue
        if text[pos] == quote:
            return pos
        pos += 1
    raise OverrideSyntaxError(f"unclosed quote in {text!r}")


def _parse_container(text: str, pos: int) -> tuple[Any, int]:
    """A `[...]` list or `{k: v, ...}` dict starting at `pos`."""
    closing, is_dict = _CLOSING[text[pos]], text[pos] == "{"
    items: list[Any] = []
    mapping: dict[str, Any] = {}
    pos += 1
    while True:
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos < len(text) and text[pos] == closing:
            return (mapping if is_dict else items), pos + 1
        if is_dict:
            key, colon, _ = text[pos:].partition(":")
            if not colon:
                raise OverrideSyntaxError(f"a dict entry needs key: value in {text!r}")
            pos += len(key) + 1
            mapping[key.strip().strip("'\"")], pos = _parse_element(text, pos)
        else:
            item, pos = _parse_element(text, pos)
            items.append(item)
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos >= len(text):
            raise OverrideSyntaxError(f"missing {closing!r} in {text!r}")
        if text[pos] == ",":
            pos += 1
        elif text[pos] != closing:
            raise OverrideSyntaxError(f"expected ',' or {closing!r} in {text!r} at {text[pos:]!r}")


def _scalar(word: str) -> Any:
    """Hydra's primitive: null, a bool (any case), an int, a float, else the string itself."""
    lowered = word.lower()
    if lowered == "null":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if _INT.match(word):
        return int(word.replace("_", ""))
    if _FLOAT.match(word):
        return float(word.replace("_", ""))
    return word


_BARE = re.compile(r"^[\w\-./+@%]+$")  # a plain string that Hydra reads back as itself


def format_value(value: Any) -> str:
    """`value` as override text that `parse_value` (and Hydra) reads back as the same value: the
    inverse of `parse_value`, used to write a verl command line (`stratarl config RUN --as-verl`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _BARE.match(text) and _scalar(text) == text:
        return text
    return "'" + text.replace("'", "\\'") + "'"
