"""Cross-cutting: the doctor's checks of the reward, the task and the update — one function per failure class.

A check reads the `RunView` (metrics, trace, config, hang reports) and the findings of the checks
before it (to defer: "reward always 0" already explains "no group has signal"), and returns
`Finding`s with evidence and the next thing to try. Thresholds are named constants.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from stratarl.observe.doctor.view import COMPUTE, CONFIG, RL_MATH, Finding, RunView

TRUNCATED_PROBLEM, TRUNCATED_WARNING = 0.5, 0.2  # share of responses at the length cap
FAILURE_PROBLEM, FAILURE_WARNING = 0.5, 0.1  # share of scorer calls that failed / tool calls unparsed
SIGNAL_WARNING = 0.1  # share of prompt groups whose rewards differ
LOW_SIGNAL_STEPS = 0.3  # ... below it on this share of the steps is weak, whatever the run's mean
ZERO_ADVANTAGE = 1e-6  # |advantage| below this: 0 up to the estimator's ε (std + 1e-6 in the division)
TOOL_FAILS_PROBLEM, TOOL_FAILS_WARNING = 0.9, 0.5  # share of tool calls that returned an error
GATEWAY_SPLIT_WARNING = 0.5  # share of agent-program episodes split into one row per call (not_a_prefix)
ENTROPY_FLOOR = 0.05  # nats per action token: below it sampling is (nearly) greedy
ENTROPY_DROP = 0.1  # ... or it fell below this share of its first value
RATIO_EPS = 1e-6  # |ratio − 1| below this on every token: the policy did not move
Check = Callable[[RunView, list[Finding]], list[Finding]]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _late(series: list[tuple[int, float]]) -> list[float]:
    """The values of the later half of the run (what the run converged to)."""
    return [v for _, v in series[len(series) // 2 :]]


def _steps(series: list[tuple[int, float]]) -> str:
    return f"steps {series[0][0]}..{series[-1][0]}" if series else "no step"


def _had(earlier: list[Finding], key: str) -> bool:
    return any(f.key == key for f in earlier)


# --- compute & environment: the reward and the task -----------------------------------------------
def check_reward_constant(view: RunView, earlier: list[Finding]) -> list[Finding]:
    low, high = view.series("critic/score/min"), view.series("critic/score/max")
    if len(high) < 2 or len(low) != len(high):
        return []
    values = {v for _, v in low} | {v for _, v in high}
    if len(values) != 1:
        return []
    value = values.pop()
    if _had(earlier, "tokenizer_mismatch"):
        return []  # a model reading another tokenizer's ids answers noise: that finding says why
    rows = view.trace_rows()
    evidence = [f"critic/score/min = critic/score/max = {value:g} on every step ({_steps(high)})"]
    if rows:
        row = rows[-1]
        evidence.append(
            f"e.g. trajectory {row.get('trajectory_id')}: response {str(row.get('response_text'))[:80]!r}, "
            f"ground truth {row.get('ground_truth')}, extras {row.get('reward_extras')}"
        )
    truncated = _late(view.series("response_length/clip_ratio"))
    if truncated and _mean(truncated) >= TRUNCATED_PROBLEM:
        evidence.append(f"{_mean(truncated):.0%} of responses end at the length cap: answers may be cut off")
    what = "always 0" if value == 0 else f"always {value:g}"
    return [
        Finding(
            "problem",
            COMPUTE,
            f"no learning signal: the reward is {what} for every trajectory",
            evidence,
            "compare a response with its ground truth (`stratarl trace RUN --worst`): does the scorer for "
            "this data_source accept the model's answer format (reward.custom_function_path, the prompt's "
            "instruction), and does the model finish its answer within rollout.max_response_tokens?",
            key="reward_constant",
        )
    ]


def check_scorer_failures(view: RunView, earlier: list[Finding]) -> list[Finding]:
    failures = view.series("reward/failures/total")
    if not failures:
        return []
    per_step = (view.setting("data.prompts_per_step") or 0) * (view.setting("rollout.n") or 0)
    total = sum(v for _, v in failures)
    calls = per_step * len(failures) if per_step else 0
    share = total / calls if calls else 0.0
    if share < FAILURE_WARNING:
        return []
    reasons = {}
    for r in view.train:
        for key, value in r.items():
            if key.startswith("reward/failures/") and key != "reward/failures/total":
                reasons[key.removeprefix("reward/failures/")] = (
                    reasons.get(key.removeprefix("reward/failures/"), 0) + value
                )
    top = ", ".join(f"{k}: {int(v)}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:4])
    return [
        Finding(
            "problem" if share >= FAILURE_PROBLEM else "warning",
            COMPUTE,
            f"the reward function fails on {share:.0%} of trajectories (scored 0)",
            [
                f"reward/failures/total: {int(total)} over {len(failures)} steps of ~{per_step} trajectories",
                f"reasons: {top}",
            ],
            "the scorer raises or times out on these responses: run it on one (`stratarl trace RUN --worst`, "
            "its response_text and ground truth) and read the run log's 'reward failures' line; raise "
            "reward.timeout_s if the reason is timeout",
            key="scorer_failures",
        )
    ]


def check_parse_failures(view: RunView, earlier: list[Finding]) -> list[Finding]:
    parse = view.series("agent/parse_failures/total")
    if not parse:
        return []
    failed = sum(v for _, v in parse)
    called = sum(v for _, v in view.series("agent/tool_calls/total"))
    attempts = failed + called
    share = failed / attempts if attempts else 0.0
    if attempts == 0 or share < FAILURE_WARNING:
        return []
    stopped = _mean([v for _, v in view.series("agent/stop_reason/parse_error")])
    return [
        Finding(
            "problem" if share >= FAILURE_PROBLEM else "warning",
            COMPUTE,
            f"tool calls do not parse: {share:.0%} of {int(attempts)} attempted calls were malformed",
            [
                f"agent/parse_failures/total {int(failed)}, agent/tool_calls/total {int(called)} "
                f"({_steps(parse)})",
                f"{stopped:.0%} of episodes ended with stop_reason parse_error",
            ],
            "the model's tool-call format and the parser disagree: see a failing turn with "
            "`stratarl trace RUN --where 'parse_failures > 0'`; set agent.tool_format to the format the "
            "model writes, or teach it the format (SFT on demonstrations)",
            key="parse_failures",
        )
    ]


def check_tool_failures(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """Tool calls that parse but return an error (the tool raised, timed out, or is missing)."""
    errors, calls = view.series("agent/tool_errors/total"), view.series("agent/tool_calls/total")
    failed, called = sum(v for _, v in errors), sum(v for _, v in calls)
    share = failed / called if called else 0.0
    if not called or share < TOOL_FAILS_WARNING:
        return []
    reasons: dict[str, float] = {}
    for r in view.train:
        for key, value in r.items():
            if (
                key.startswith("agent/failures/")
                and key != "agent/failures/total"
                and isinstance(value, int | float)
            ):
                reasons[key.removeprefix("agent/failures/")] = (
                    reasons.get(key.removeprefix("agent/failures/"), 0) + value
                )
    top = ", ".join(f"{k}: {int(v)}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:4])
    example = next((r for r in reversed(view.trace_rows()) if (r.get("tool_errors") or 0) > 0), None)
    evidence = [
        f"agent/tool_errors/total {int(failed)} of agent/tool_calls/total {int(called)} ({_steps(calls)})"
    ]
    if top:
        evidence.append(f"reasons: {top}")
    if example:
        evidence.append(
            f"e.g. trajectory {example.get('trajectory_id')} (its interaction answer shows the call)"
        )
    return [
        Finding(
            "problem" if share >= TOOL_FAILS_PROBLEM else "warning",
            COMPUTE,
            f"a tool that fails: {share:.0%} of {int(called)} tool calls returned an error",
            evidence,
            "run the tool by hand with a traced call's arguments (`stratarl trace RUN --where 'tool_errors "
            "> 0'`): is it installed and reachable from the tool workers (agent.tool_config_path), does it "
            "finish within agent.tool_timeout_s?",
            key="tool_failures",
        )
    ]


def check_gateway_splits(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """Most agent-program episodes (agent.gateway) split into one row per call because a later
    call's prompt did not begin with the earlier call's prompt + sampled ids (`not_a_prefix`)."""
    split = sum(v for _, v in view.series("agent/gateway_split/not_a_prefix"))
    merged = sum(v for _, v in view.series("agent/gateway_rows_merged"))
    budget = sum(v for _, v in view.series("agent/gateway_split/over_budget"))
    episodes = split + merged + budget  # the episodes that became rows
    if not episodes or split / episodes <= GATEWAY_SPLIT_WARNING:
        return []
    evidence = [
        f"agent/gateway_split/not_a_prefix {int(split)} of {int(episodes)} episodes that became rows "
        f"({int(merged)} merged, {int(budget)} over budget; {_steps(view.series('agent/gateway_rows'))})"
    ]
    example = _departed_call(view.trace_rows())
    if example is not None:
        row, call = example
        evidence.append(
            f"e.g. trajectory {row.get('trajectory_id')}: call {call['call']}'s prompt departs from call "
            f"{call['call'] - 1}'s prompt + response at token {call['diverges_at']} (ids {call['found_ids']} "
            f"where extending needed {call['expected_ids']})"
        )
    return [
        Finding(
            "warning",
            COMPUTE,
            f"agent episodes split: {split / episodes:.0%} of {int(episodes)} became one row per call",
            evidence,
            "the agent re-sends text that the chat template re-tokenizes into other ids than the model "
            "sampled, or rewrites its history: send each assistant message back unchanged (the content and "
            "tool_calls as the API returned them), only append to the messages, and see where the ids part "
            "(`stratarl trace RUN` lists each gateway call; docs/agent_gateway.md, 'One row or one row per "
            "call'). Split episodes still train, each call a row, but an episode of k calls weighs k rows",
            key="gateway_splits",
        )
    ]


def _departed_call(rows: list[dict]) -> tuple[dict, dict] | None:
    """The latest traced row with a gateway call that did not extend the call before, and that call."""
    for row in reversed(rows):
        calls = row.get("gateway_calls")
        for call in json.loads(calls) if isinstance(calls, str) else calls or []:
            if call.get("extends_previous") is False:
                return row, call
    return None


def check_truncation(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """Responses cut at the cap, unless a misconfigured EOS, a broken policy or a reward that pays
    for length explains it (their findings say so: raising the cap would not help there)."""
    if any(_had(earlier, key) for key in ("eos", "policy_broken", "length_hacking")):
        return []
    clip = view.series("response_length/clip_ratio")
    late = _late(clip)
    if not late or _mean(late) < TRUNCATED_WARNING:
        return []
    share = _mean(late)
    cap = view.setting("rollout.max_response_tokens")
    lengths = _late(view.series("response_length/mean"))
    rows = view.trace_rows()
    by_length = sum(r.get("finish_reason") == "length" for r in rows) / len(rows) if rows else None
    evidence = [f"response_length/clip_ratio {share:.0%} over the later half ({_steps(clip)})"]
    evidence.append(f"response_length/mean {_mean(lengths):.1f} of rollout.max_response_tokens = {cap}")
    if by_length is not None:
        evidence.append(f"traced trajectories with finish_reason 'length': {by_length:.0%}")
    return [
        Finding(
            "problem" if share >= TRUNCATED_PROBLEM else "warning",
            CONFIG,
            f"responses are truncated: {share:.0%} stop at the length cap ({cap} tokens) instead of EOS",
            evidence,
            f"raise rollout.max_response_tokens (now {cap}) if answers need more room, or penalise overlong "
            "responses; a model that never emits EOS needs SFT on answers that end",
            key="truncation",
        )
    ]


def check_group_signal(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """No signal: every advantage is 0 (up to ε) on most steps. Weak signal: fewer than
    SIGNAL_WARNING of the groups have rewards that differ, over the later half on average OR on
    LOW_SIGNAL_STEPS of the steps (a run average can hide many empty steps). Silent where a cause
    upstream was named: a constant reward, sampling too cold, a collapse, a tokenizer not of the model."""
    causes = (
        "reward_constant", "cold_sampling", "negative_entropy_bonus", "policy_broken", "eos",
        "tokenizer_mismatch",
    )  # fmt: skip
    if any(_had(earlier, key) for key in causes):
        return []
    signal = view.series("batch/groups_with_signal")
    adv_high, adv_low = view.series("critic/advantages/max"), view.series("critic/advantages/min")
    zero_adv = [
        s
        for (s, hi), (_, lo) in zip(adv_high, adv_low, strict=False)
        if abs(hi) < ZERO_ADVANTAGE and abs(lo) < ZERO_ADVANTAGE
    ]
    low_steps = [(s, v) for s, v in signal if v < SIGNAL_WARNING]
    if adv_high and len(zero_adv) >= 0.8 * len(adv_high):
        return [
            Finding(
                "problem",
                COMPUTE if signal and _mean([v for _, v in signal]) < SIGNAL_WARNING else RL_MATH,
                f"no learning signal: every advantage is 0 on {len(zero_adv)} of {len(adv_high)} steps",
                [f"|critic/advantages/max|, |min| < {ZERO_ADVANTAGE:g} ({_steps(adv_high)})"]
                + ([f"batch/groups_with_signal mean {_mean([v for _, v in signal]):.0%}"] if signal else []),
                "group-relative advantages are 0 when a prompt's n rewards are equal: raise rollout.n, use "
                "prompts the model solves sometimes, or a denser reward",
                key="no_signal",
            )
        ]
    late = _mean(_late(signal)) if signal else 1.0
    if not signal or (late >= SIGNAL_WARNING and len(low_steps) < LOW_SIGNAL_STEPS * len(signal)):
        return []
    return [
        Finding(
            "warning",
            COMPUTE,
            f"weak learning signal: under {SIGNAL_WARNING:.0%} of prompt groups have rewards that differ "
            f"on {len(low_steps)} of {len(signal)} steps",
            [
                f"batch/groups_with_signal {late:.0%} over the later half ({_steps(signal)}); under "
                f"{SIGNAL_WARNING:.0%} on steps {[s for s, _ in low_steps][:10]}",
                "the groups' responses differ (else sampling is too cold): the prompts are too easy or "
                "too hard for the model",
            ],
            "most groups are all right or all wrong (too easy or too hard): dynamic sampling "
            "(algorithm.filter_groups.enable), a larger rollout.n, or data of the right difficulty",
            key="weak_signal",
        )
    ]


# --- config and RL math: does the update move the policy? ------------------------------------------
def check_policy_moves(view: RunView, earlier: list[Finding]) -> list[Finding]:
    lr = view.series("actor/lr")
    if lr and all(v == 0 for _, v in lr):
        return [
            Finding(
                "problem",
                CONFIG,
                "the policy cannot move: the actor's learning rate is 0 on every step",
                [
                    f"actor/lr = 0 ({_steps(lr)}); actor.lr = {view.setting('actor.lr')}, "
                    f"actor.lr_schedule = {view.setting('actor.lr_schedule')}, "
                    f"actor.warmup_steps = {view.setting('actor.warmup_steps')}"
                ],
                "set actor.lr > 0 (the recipes use 1e-6..3e-4); with warm-up the first steps' lr is small, "
                "never 0 for long",
                key="flat_loss",
            )
        ]
    grad = view.series("actor/grad_norm")
    if (
        grad
        and all(v == 0 for _, v in grad)
        and not _had(earlier, "reward_constant")
        and not _had(earlier, "no_signal")
    ):
        return [
            Finding(
                "problem",
                RL_MATH,
                "the loss has no gradient: actor/grad_norm is 0 on every step",
                [f"actor/grad_norm = 0 ({_steps(grad)})"],
                "zero advantages or an empty loss mask: check `stratarl trace RUN --field advantages` and "
                "the mask spans of a trajectory",
                key="flat_loss",
            )
        ]
    return _unmoved_ratio(view, earlier)


def _unmoved_ratio(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """With several optimizer steps per update, later mini-batches see a moved policy: ratio ≠ 1."""
    per_step = view.setting("data.prompts_per_step") or 0
    mini = view.setting("actor.prompts_per_mini_batch") or 0
    epochs = view.setting("actor.ppo_epochs") or 1
    optimizer_steps = (per_step // mini if mini else 1) * epochs
    rows = [r for r in view.trace_rows() if r.get("ratio_max") is not None]
    moving = [r for r in rows if (r.get("advantage") or 0) != 0]
    if optimizer_steps < 2 or not moving or _had(earlier, "no_signal") or _had(earlier, "cold_sampling"):
        return []  # near temperature 0 the tempered log-probs are ≈ 0 and barely move with the weights
    spread = max(max(abs(r["ratio_max"] - 1), abs(r["ratio_min"] - 1)) for r in moving)
    if spread >= RATIO_EPS:
        return []
    return [
        Finding(
            "problem",
            CONFIG,
            "the update does not change the policy: π_θ/π_old ≡ 1 on every token of every mini-batch",
            [
                f"{optimizer_steps} optimizer steps per update, {len(moving)} traced trajectories with a "
                f"nonzero advantage, max |ratio − 1| = {spread:.2g}"
            ],
            "the optimizer step changes nothing: a learning rate of 0, frozen parameters, or a gradient "
            "clip of 0 (actor.lr, actor.grad_clip, LoRA's target modules)",
            key="flat_loss",
        )
    ]


def check_entropy(view: RunView, earlier: list[Finding]) -> list[Finding]:
    if _had(earlier, "negative_entropy_bonus") or _had(earlier, "cold_sampling"):
        return []  # their findings name the cause of the collapse
    entropy = view.series("actor/entropy")
    if len(entropy) < 3:
        return []
    first, last = entropy[0][1], _mean(_late(entropy)[-3:])
    fell_below_floor = last < ENTROPY_FLOOR <= first / 2  # a policy that starts near greedy did not fall
    if not fell_below_floor and (first <= 0 or last >= ENTROPY_DROP * first):
        return []
    return [
        Finding(
            "warning",
            RL_MATH,
            f"entropy collapse: the policy's entropy fell from {first:.3g} to {last:.3g} nats per token",
            [f"actor/entropy {_steps(entropy)}: first {first:.3g}, last {last:.3g}"],
            "sampling has become (nearly) deterministic, so groups stop differing: lower actor.lr, add "
            "actor.entropy_coeff, raise clip_ratio_high (clip-higher), or stop earlier",
            key="entropy",
        )
    ]
