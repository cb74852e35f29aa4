"""Layer 1, config: the way back — a RunConfig as the verl command line that trains the same run
(`stratarl config RUN --as-verl`), so a run debugged here can be launched on a verl GPU cluster.

    1. start from verl's defaults, translated as `stratarl verl` translates them;
    2. for every translation whose value differs from ours, set the verl keys its `verl_values` names;
    3. read those overrides as verl would (interpolations resolved), translate them again, and repeat
       2 for what still differs (a micro-batch size follows the mini-batch, rollout.n and the GPUs);
    4. what comes out different after that is listed as not carried, with the reason — never dropped.

Our nulls that name another setting (rollout.dtype: model.dtype; trainer.run_dir: output_root/
project/experiment) are made explicit first: the line says what the run did.

Settings of ours that no verl key sets are listed too, where they differ from our defaults: verl
runs them its own way. Torch-free.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass, field
from typing import Any

from stratarl.config.hydra_overrides import format_value
from stratarl.config.schema_run import RunConfig
from stratarl.config.setting import get_by_key, leaf_settings
from stratarl.config.verl_args import VerlArgs, read_verl_args, verl_leaf_keys
from stratarl.config.verl_rules import NoVerlForm, RefusedValue, Translation
from stratarl.config.verl_translation import TRANSLATIONS

VERL_PROGRAM = "python3 -m verl.trainer.main_ppo"
NOT_MAIN_PPO = ("sft.",)  # verl's SFT is another program (sft_trainer.yaml): not part of this line
ROUNDS = 3  # passes of step 2-3; one more found nothing in any recipe or verl example here


@dataclass(frozen=True)
class VerlCommandLine:
    """verl overrides (dotted key -> value, in table order) and what they do not carry."""

    overrides: dict[str, Any]
    known: frozenset[str]  # every leaf key of verl's config: the others need Hydra's `+`
    not_carried: list[tuple[str, Any, str]] = field(default_factory=list)  # our key, value, why

    def arguments(self) -> list[str]:
        """The overrides as `key=value` words (`+key=value` for a key verl's config lacks)."""
        return [
            f"{'' if key in self.known else '+'}{key}={format_value(value)}"
            for key, value in self.overrides.items()
        ]

    def text(self) -> str:
        """A shell command line, one override per line, then what it does not carry as comments."""
        words = [shlex.quote(word) for word in self.arguments()]
        lines = [VERL_PROGRAM + (" \\" if words else "")]
        lines += [f"    {word} \\" for word in words[:-1]] + [f"    {word}" for word in words[-1:]]
        if self.not_carried:
            lines.append("# not carried to verl (it runs these its own way):")
            lines += [f"#   {key}={format_value(value)}: {why}" for key, value, why in self.not_carried]
        return "\n".join(lines)


def as_verl(cfg: RunConfig) -> VerlCommandLine:
    """The verl command line of `cfg`: the fewest overrides of verl's defaults that translate back
    to `cfg`'s translated settings, and every setting they do not carry."""
    cfg = _explicit(cfg)
    base, known = read_verl_args([]), frozenset(verl_leaf_keys())
    overrides: dict[str, Any] = {}
    refusals: dict[str, str] = {}
    args = base
    for _ in range(ROUNDS):
        differ = [
            r
            for r in TRANSLATIONS
            if r.ours not in refusals
            and (not _same(_value(r, args), _ours(cfg, r)) or _mandatory(r, base) - overrides.keys())
        ]
        if not differ:
            break
        for rule in differ:
            try:
                overrides |= rule.verl_values(_ours(cfg, rule), cfg)
            except NoVerlForm as err:
                refusals[rule.ours] = str(err)
        args = read_verl_args(VerlCommandLine(overrides, known).arguments())
    not_carried = [(key, get_by_key(cfg, key), why) for key, why in refusals.items()]
    for rule in TRANSLATIONS:
        ours = _ours(cfg, rule)
        if rule.ours not in refusals and not _same(found := _value(rule, args), ours):
            not_carried.append((rule.ours, ours, f"verl's nearest gives {format_value(found)} ({rule.how})"))
    return VerlCommandLine(overrides, known, not_carried + _untranslated(cfg))


def _explicit(cfg: RunConfig) -> RunConfig:
    """`cfg` with the nulls that stand for another setting replaced by what they stand for."""
    cfg = copy.deepcopy(cfg)
    if cfg.rollout.dtype is None:
        cfg.rollout.dtype = cfg.model.dtype
    t = cfg.trainer
    if not t.run_dir:
        t.run_dir = f"{t.output_root}/{t.project_name}/{t.experiment_name}"
    return cfg


def _mandatory(rule: Translation, base: VerlArgs) -> set[str]:
    """The verl keys `rule` reads that verl's config leaves mandatory (`???`: a line must set them)."""
    return {key for key in rule.reads[:1] if key not in base.defaults}


def _ours(cfg: RunConfig, rule: Translation) -> Any:
    return get_by_key(cfg, rule.ours)


def _untranslated(cfg: RunConfig) -> list[tuple[str, Any, str]]:
    """Our settings that no verl key sets, where this run changes them from our defaults."""
    translated = {rule.ours for rule in TRANSLATIONS}
    default = RunConfig()
    return [
        (key, get_by_key(cfg, key), "no verl key sets it")
        for key in leaf_settings(RunConfig)
        if key not in translated
        and not key.startswith(NOT_MAIN_PPO)
        and not _same(get_by_key(cfg, key), get_by_key(default, key))
    ]


def _value(rule: Translation, args: VerlArgs) -> Any:
    try:
        return rule.value(args)
    except (RefusedValue, TypeError, ValueError) as err:
        return f"<refused: {err}>"


def _same(a: Any, b: Any) -> bool:
    """Equal as config values: a tuple is a list, 1 is 1.0."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b
