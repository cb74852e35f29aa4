"""Layer 1, config: how verl's reward keys — `custom_reward_function.*` and its newer twin
`reward.custom_reward_function.*`, the scoring function's `reward_kwargs`, DAPO's overlong buffer,
the reward model — translate to ours (`verl_rules`); what of `reward*` has no effect or is refused
is in `verl_table_run`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stratarl.config.verl_args import VerlArgs
from stratarl.config.verl_rules import RefusedValue, Translation


def _t(ours: str, *reads: str, compute: Any = None, how: str = "", back: Any = None) -> Translation:
    return Translation(ours, reads, compute, how, back=back)


def _either(legacy: str, current: str, empty: Any = "") -> Any:
    """A verl key with a legacy twin (custom_reward_function.* and reward.custom_reward_function.*)."""

    def value(args: VerlArgs) -> Any:
        chosen = args.value(legacy) if args.value(legacy) is not None else args.value(current)
        return empty if chosen is None else chosen

    return value


REWARD_KWARGS = ("custom_reward_function.reward_kwargs", "reward.reward_kwargs")
OVERLONG = "overlong_buffer_cfg"  # DAPO's scripts: +reward.reward_kwargs.overlong_buffer_cfg.enable=True


def _reward_kwargs(args: VerlArgs) -> dict:
    """The scoring function's keyword arguments; DAPO's overlong buffer is not one (it is ours:
    reward.overlong_buffer.*)."""
    flat = args.subtree(REWARD_KWARGS[0]) | args.subtree(REWARD_KWARGS[1])
    tree: dict = {}
    for key, value in flat.items():
        if key.split(".")[0] == OVERLONG:
            continue
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


OVERLONG_KEY = f"{REWARD_KWARGS[1]}.{OVERLONG}"


def _overlong_back(enable: bool, cfg: Any) -> dict[str, Any]:
    """The whole overlong_buffer_cfg, as verl's DAPO reward manager reads every field of it."""
    if not enable:
        return {f"{OVERLONG_KEY}.enable": False}
    o = cfg.reward.overlong_buffer
    return {
        f"{OVERLONG_KEY}.enable": True,
        f"{OVERLONG_KEY}.len": o.len,
        f"{OVERLONG_KEY}.penalty_factor": o.penalty_factor,
        f"{OVERLONG_KEY}.max_resp_len": cfg.rollout.max_response_tokens,
        f"{OVERLONG_KEY}.log": False,
    }


def _overlong_leaf_back(leaf: str) -> Callable[[Any, Any], dict[str, Any]]:
    return lambda value, cfg: {f"{OVERLONG_KEY}.{leaf}": value}


def _flat(tree: dict, prefix: str) -> dict[str, Any]:
    """A nested dict as dotted leaves under `prefix` (the way back of `_reward_kwargs`)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat |= _flat(value, f"{prefix}.{key}")
        else:
            flat[f"{prefix}.{key}"] = value
    return flat


def _overlong(leaf: str, default: Any) -> Callable[[VerlArgs], Any]:
    """One leaf of DAPO's overlong_buffer_cfg, under either reward_kwargs prefix."""

    def value(args: VerlArgs) -> Any:
        for prefix in REWARD_KWARGS:
            found = args.value(f"{prefix}.{OVERLONG}.{leaf}")
            if found is not None:
                return found
        return default

    return value


def _overlong_enable(args: VerlArgs) -> bool:
    """overlong_buffer_cfg.enable; its max_resp_len must be the response budget, as ours always is
    (rollout.max_response_tokens, from data.max_response_length)."""
    budget, cap = _overlong("max_resp_len", None)(args), args.value("data.max_response_length")
    if budget is not None and int(budget) != int(cap):
        raise RefusedValue(
            f"{OVERLONG}.max_resp_len={budget} differs from data.max_response_length={cap}; here the "
            "penalty always counts against the response budget",
            "set max_resp_len to data.max_response_length (or leave it out)",
        )
    return bool(_overlong("enable", False)(args))


TRANSLATIONS = [
    _t(
        "reward.custom_function_path",
        "custom_reward_function.path",
        "reward.custom_reward_function.path",
        compute=_either("custom_reward_function.path", "reward.custom_reward_function.path"),
    ),
    _t(
        "reward.custom_function_name",
        "custom_reward_function.name",
        "reward.custom_reward_function.name",
        compute=_either("custom_reward_function.name", "reward.custom_reward_function.name"),
    ),
    Translation(
        "reward.function_kwargs",
        (),
        _reward_kwargs,
        "the keyword arguments of the scoring function",
        subtrees=REWARD_KWARGS,
        back=lambda kwargs, cfg: _flat(kwargs, REWARD_KWARGS[1]),
    ),
    *(
        Translation(
            f"reward.overlong_buffer.{leaf}",
            (),
            compute,
            f"reward_kwargs.{OVERLONG}.{leaf}" + note,
            subtrees=tuple(f"{prefix}.{OVERLONG}" for prefix in REWARD_KWARGS),
            back=_overlong_back if leaf == "enable" else _overlong_leaf_back(leaf),
        )
        for leaf, compute, note in (
            ("enable", _overlong_enable, "; a max_resp_len given must be data.max_response_length"),
            ("len", _overlong("len", 0), ""),
            ("penalty_factor", _overlong("penalty_factor", 1.0), ""),
        )
    ),
    _t("reward.num_workers", "reward.num_workers", how="scoring processes"),
    _t(
        "reward.model.enable",
        "reward_model.enable",
        "reward.reward_model.enable",
        compute=_either("reward_model.enable", "reward.reward_model.enable", False),
    ),
    _t(
        "reward.model.path",
        "reward_model.model.path",
        "reward.reward_model.model_path",
        compute=_either("reward_model.model.path", "reward.reward_model.model_path"),
    ),
]
