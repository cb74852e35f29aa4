"""Layer 1, config: a verl command line as our RunConfig (`stratarl verl`). Every verl key is
classified by the tables (`verl_table_policy`, `verl_table_run`, `verl_table_reward`,
`verl_table_distillation`): translated
keys set our settings (verl's defaults included, so where verl's default differs from ours the run
uses verl's), no-effect keys are accepted, refused keys stop the run unless they hold verl's
default. Torch-free.

Problems name the verl key and ours, all at once, before any model loads: unknown verl keys (with the
nearest), refused values (the reason and our nearest way), and our validation, in verl's names.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratarl.config import verl_table_distillation, verl_table_policy, verl_table_reward, verl_table_run
from stratarl.config.errors import ConfigError, ConfigProblem
from stratarl.config.loading import load_config_data
from stratarl.config.schema_run import RunConfig
from stratarl.config.validation import validate_config
from stratarl.config.verl_args import VerlArgs, read_verl_args
from stratarl.config.verl_rules import (
    NO_EFFECT,
    REFUSED,
    TRANSLATED,
    NoEffect,
    Refused,
    RefusedValue,
    Translation,
    matches,
)

TRANSLATIONS: list[Translation] = [
    *verl_table_policy.TRANSLATIONS,
    *verl_table_run.TRANSLATIONS,
    *verl_table_reward.TRANSLATIONS,
    *verl_table_distillation.TRANSLATIONS,
]
NO_EFFECTS: list[NoEffect] = [
    *verl_table_policy.NO_EFFECT,
    *verl_table_run.NO_EFFECT,
    *verl_table_distillation.NO_EFFECT,
]
REFUSALS: list[Refused] = [
    *verl_table_policy.REFUSED,
    *verl_table_run.REFUSED,
    *verl_table_distillation.REFUSED,
]
RECORD_FILE = "verl_translation.json"


def classify(key: str) -> tuple[str, Translation | NoEffect | Refused] | None:
    """The class of verl key `key` and its rule: a translation that reads it by name, else the first
    no-effect rule, else a translation that reads its whole subtree, else the first refusal whose
    patterns match; None for a key no rule covers."""
    for rule in TRANSLATIONS:
        if key in rule.reads:
            return TRANSLATED, rule
    for rule in NO_EFFECTS:
        if matches(key, rule.patterns):
            return NO_EFFECT, rule
    for rule in TRANSLATIONS:
        if any(key.startswith(f"{prefix}.") for prefix in rule.subtrees):
            return TRANSLATED, rule
    for rule in REFUSALS:
        if matches(key, rule.patterns):
            return REFUSED, rule
    return None


@dataclass(frozen=True)
class VerlTranslation:
    """Our settings as nested data, and one record per verl key that mattered (RUN/verl_translation.json)."""

    settings: dict[str, Any]
    records: list[dict[str, Any]]

    def lines(self) -> list[str]:
        """The keys the command line gave, one line each: the verl value, then ours or the reason."""
        lines = ["verl key = value  ->  our key = value (or why it changes nothing here)"]
        for r in self.records:
            if r["given"] == "verl default":
                continue
            after = (
                f"{r['ours']} = {r['our_value']!r}"
                if r["class"] == TRANSLATED
                else f"{r['class']}: {r['reason']}"
            )
            lines.append(f"  {r['verl_key']} = {r['verl_value']!r}  ->  {after}")
        defaulted = sum(r["given"] == "verl default" for r in self.records)
        lines.append(f"  ... and {defaulted} translated keys at verl's defaults (all in RUN/{RECORD_FILE})")
        return lines

    def write(self, run_dir: str | Path, argv: list[str]) -> Path:
        path = Path(run_dir) / RECORD_FILE
        counts = {
            kind: sum(r["class"] == kind for r in self.records) for kind in (TRANSLATED, NO_EFFECT, REFUSED)
        }
        body = {"verl_command_line": argv, "counts": counts, "keys": self.records}
        path.write_text(json.dumps(body, indent=1, default=str) + "\n")
        return path


def translate(args: VerlArgs) -> VerlTranslation:
    """Our settings for `args`; every unknown or refused key and untranslatable value raised at once."""
    problems = _unknown_keys(args) + _refusals(args)
    settings: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    for rule in TRANSLATIONS:
        try:
            value = rule.value(args)
        except RefusedValue as err:
            key = rule.reads[0] if rule.reads else rule.subtrees[0]
            problems.append(_refusal_problem(key, args.value(key), err.reason, err.our_way))
            continue
        except (TypeError, ValueError) as err:
            key = rule.reads[0] if rule.reads else rule.subtrees[0]
            problems.append(ConfigProblem((key, rule.ours), f"cannot translate {args.value(key)!r}: {err}"))
            continue
        _put(settings, rule.ours, value)
        subtree = [k for p in rule.subtrees for k in args.values if k.startswith(f"{p}.")]
        read = [*rule.reads, *(k for k in subtree if classify(k) == (TRANSLATED, rule))]
        records += [
            _record(args, key, TRANSLATED, ours=rule.ours, our_value=value, how=rule.how) for key in read
        ]
    for key in args.given:
        found = classify(key)
        if found and found[0] != TRANSLATED:
            records.append(_record(args, key, found[0], reason=found[1].reason))
    if problems:
        raise ConfigError(problems)
    return VerlTranslation(settings, records)


def load_verl_config(
    overrides: list[str], *, config_path: str | None = None, config_name: str | None = None
) -> tuple[RunConfig, VerlTranslation]:
    """A verl command line as a validated RunConfig; every problem in verl's names and ours."""
    translation = translate(read_verl_args(overrides, config_path=config_path, config_name=config_name))
    try:
        cfg = load_config_data(translation.settings)
        validate_config(cfg)
    except ConfigError as err:
        raise in_verl_names(err) from err
    return cfg, translation


def in_verl_names(err: ConfigError) -> ConfigError:
    """`err` with each of our keys named after the verl keys it was translated from."""
    verl_of = {rule.ours: rule.reads or rule.subtrees for rule in TRANSLATIONS}

    def named(key: str) -> str:
        verl = " / ".join(verl_of.get(key, ()))
        return key if verl in ("", key) else f"{verl} (our {key})"

    return ConfigError(ConfigProblem(tuple(named(k) for k in p.keys), p.message) for p in err.problems)


def _unknown_keys(args: VerlArgs) -> list[ConfigProblem]:
    known = list(args.defaults)
    problems = []
    for key in args.values:
        if classify(key) is None:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.7)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(
                ConfigProblem((key,), f"not a key of verl 0.9.1's config, nor one translated here{hint}")
            )
    return problems


def _refusals(args: VerlArgs) -> list[ConfigProblem]:
    problems = []
    for key, value in args.values.items():
        found = classify(key)
        if found and found[0] == REFUSED and args.differs(key) and value not in found[1].allowed:
            problems.append(_refusal_problem(key, value, found[1].reason, found[1].our_way))
    return problems


def _refusal_problem(key: str, value: Any, reason: str, our_way: str) -> ConfigProblem:
    return ConfigProblem((key,), f"{value!r} is refused here: {reason}. Our way: {our_way}")


def _record(args: VerlArgs, key: str, kind: str, **extra: Any) -> dict[str, Any]:
    given = args.given.get(key, "")
    return {
        "verl_key": key,
        "verl_value": args.value(key),
        "given": given or "verl default",
        "class": kind,
        **extra,
    }


def _put(tree: dict, key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value
