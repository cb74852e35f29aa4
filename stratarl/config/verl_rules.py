"""Layer 1, config: the three kinds of rule that classify every verl key, and the value converters
the translation tables share (verl's dtype names, paths given as one string, per-GPU batch sizes).

    Translation  our key computed from one or more verl keys (the unit mapping in `how`)
    NoEffect     accepted, changes nothing here (GPU-memory, kernel, offload, profiling knobs)
    Refused      accepted only at verl's default; another value stops the run, naming our nearest way

Patterns are `fnmatch` patterns over dotted keys (`*` crosses dots): `actor_rollout_ref.*.profiler.*`.

A translation also knows the way back (`verl_values`): the verl keys that give one of our values,
which `stratarl config RUN --as-verl` writes as a verl command line (`verl_way_back`).
"""

from __future__ import annotations

import fnmatch
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stratarl.config.verl_args import VerlArgs

TRANSLATED, NO_EFFECT, REFUSED = "translated", "no effect", "refused"


class RefusedValue(ValueError):
    """A translated verl key holds a value with no counterpart here."""

    def __init__(self, reason: str, our_way: str):
        super().__init__(reason)
        self.reason, self.our_way = reason, our_way


@dataclass(frozen=True)
class Translation:
    """Our key `ours`, computed from the verl keys it `reads` (default: the first one's value); `back`
    gives the verl keys and values for one of our values (default: the first key takes it)."""

    ours: str
    reads: tuple[str, ...]
    compute: Callable[[VerlArgs], Any] | None = None
    how: str = ""  # the value mapping, where it is not the identity
    subtrees: tuple[str, ...] = ()  # verl prefixes whose every leaf it reads (free-form kwargs)
    back: Callable[[Any, Any], dict[str, Any]] | None = None  # (our value, our whole RunConfig)

    def value(self, args: VerlArgs) -> Any:
        return self.compute(args) if self.compute else args.value(self.reads[0])

    def verl_values(self, ours: Any, cfg: Any) -> dict[str, Any]:
        """verl keys and values that translate to `ours` (our setting in RunConfig `cfg`); NoVerlForm
        where verl cannot say it."""
        return self.back(ours, cfg) if self.back else {self.reads[0]: ours}


class NoVerlForm(ValueError):
    """One of our values that no verl setting gives (the reason is the message)."""


@dataclass(frozen=True)
class NoEffect:
    patterns: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Refused:
    patterns: tuple[str, ...]
    reason: str
    our_way: str
    allowed: tuple[Any, ...] = ()  # values accepted besides verl's default


def matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)


# ---- value converters shared by the tables ----

_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}
_DTYPES |= {"fp16": "float16", "float16": "float16"}


def dtype_name(value: Any) -> str:
    """verl's dtype spellings (fp32, bf16, bfloat16, ...) as ours."""
    if str(value) not in _DTYPES:
        raise RefusedValue(f"dtype {value!r} is unknown here", "one of fp32, bf16, fp16")
    return _DTYPES[str(value)]


def mixed_dtype(value: Any) -> str | None:
    """A compute dtype: fp32 means no mixed precision (our null)."""
    name = dtype_name(value)
    return None if name == "float32" else name


_VERL_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def dtype_back(key: str) -> Callable[[Any, Any], dict[str, Any]]:
    """Our dtype name (null: no mixed precision, fp32) as verl spells it."""
    return lambda name, cfg: {key: _VERL_DTYPES[name or "float32"]}


def none_if_empty(key: str) -> Callable[[Any, Any], dict[str, Any]]:
    """The way back of `text_or_empty`: our empty string is verl's null."""
    return lambda text, cfg: {key: text or None}


def key_value(key: str) -> Callable[[VerlArgs], Any]:
    return lambda args: args.value(key)


def text_or_empty(key: str) -> Callable[[VerlArgs], str]:
    """verl's null path is our empty string."""
    return lambda args: "" if args.value(key) is None else str(args.value(key))


def file_list(key: str) -> Callable[[VerlArgs], list[str]]:
    """verl takes one file or a list; ours is always a list."""

    def files(args: VerlArgs) -> list[str]:
        value = args.value(key)
        if value is None:
            return []
        return [str(v) for v in value] if isinstance(value, list) else [str(value)]

    return files


def world_size(args: VerlArgs) -> int:
    """verl's training GPUs: trainer.n_gpus_per_node × trainer.nnodes."""
    return int(args.value("trainer.n_gpus_per_node")) * int(args.value("trainer.nnodes"))


def micro_batch(role: str, mini_key: str, per_gpu: str, global_key: str) -> Callable[[VerlArgs], int]:
    """Trajectories per micro-batch per worker: verl's *_per_gpu as it is; the deprecated global size
    divided by the world size; neither (verl requires one): the worker's whole mini-batch."""

    def size(args: VerlArgs) -> int:
        if args.value(per_gpu) is not None:
            return int(args.value(per_gpu))
        if args.value(global_key) is not None:
            return max(1, int(args.value(global_key)) // world_size(args))
        n = int(args.value("actor_rollout_ref.rollout.n"))
        return max(1, int(args.value(mini_key)) * n // world_size(args))

    return size


def token_budget(dynamic_key: str, budget_key: str) -> Callable[[VerlArgs], int | None]:
    """verl's token budget counts only under use_dynamic_bsz; ours is null when rows decide."""
    return lambda args: int(args.value(budget_key)) if args.value(dynamic_key) else None


def layout(key: str) -> Callable[[VerlArgs], str]:
    return lambda args: "packed" if args.value(key) else "padded"


def layout_back(*keys: str) -> Callable[[Any, Any], dict[str, Any]]:
    return lambda name, cfg: {key: name == "packed" for key in keys}


def token_budget_back(dynamic_key: str, budget_key: str) -> Callable[[Any, Any], dict[str, Any]]:
    """null (rows decide) → use_dynamic_bsz=false; a budget → use_dynamic_bsz=true and the budget."""

    def back(budget: int | None, cfg: Any) -> dict[str, Any]:
        return {dynamic_key: False} if budget is None else {dynamic_key: True, budget_key: budget}

    return back


def warmup_steps(steps_key: str, ratio_key: str) -> Callable[[VerlArgs], int]:
    """lr_warmup_steps (training steps; -1: use the ratio of trainer.total_training_steps)."""

    def steps(args: VerlArgs) -> int:
        if int(args.value(steps_key)) >= 0:
            return int(args.value(steps_key))
        ratio, total = float(args.value(ratio_key)), args.value("trainer.total_training_steps")
        if ratio <= 0:
            return 0
        if total is None:
            raise RefusedValue(
                f"{ratio_key}={ratio} needs the number of steps, which here is known only from the data",
                f"give trainer.total_training_steps, or {steps_key}=<steps>",
            )
        return int(ratio * int(total))

    return steps


def scheduler(type_key: str, style_key: str) -> Callable[[VerlArgs], str]:
    """lr_scheduler_type (or the deprecated warmup_style where given): constant or cosine."""

    def name(args: VerlArgs) -> str:
        value = args.value(style_key) if args.value(style_key) is not None else args.value(type_key)
        if value not in ("constant", "cosine"):
            raise RefusedValue(f"LR schedule {value!r} is not built here", f"{type_key}=constant or cosine")
        return str(value)

    return name


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None
