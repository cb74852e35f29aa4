"""Cross-cutting: the ten questions of docs/design.md answered from one trace row, and choosing that row.

`ten_answers(row)` gives each question as (label, value) lines — the same answers the terminal
view (`trace_view`) and the HTML page (`trace_html`) show. `select_row` picks the trajectory of
`stratarl trace`: by uid and sample, by position, the worst or best reward, or the first row a
`--where` expression holds for (comparisons over the row's columns, e.g.
`reward == 0 and finish_reason == 'length'`).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

QUESTIONS = (
    "source",
    "prompt",
    "expansion",
    "generation",
    "interaction",
    "masks",
    "reward",
    "advantage",
    "optimization",
    "loop closure",
)


@dataclass(frozen=True)
class Answer:
    number: int
    question: str
    lines: list[tuple[str, str]]


def _load(value: Any, default: Any) -> Any:
    if value is None:
        return default
    return json.loads(value) if isinstance(value, str) else value


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _ids(ids: Sequence[int] | None, shown: int = 24) -> str:
    ids = list(ids or [])
    head = ", ".join(str(i) for i in ids[:shown])
    return f"{len(ids)} tokens [{head}{', …' if len(ids) > shown else ''}]"


def mask_spans(row: dict[str, Any]) -> list[tuple[str, int, int]]:
    return [(kind, int(a), int(b)) for kind, a, b in _load(row.get("mask_spans"), [])]


def ten_answers(row: dict[str, Any]) -> list[Answer]:
    """The answers to the ten questions for one trajectory's trace row."""
    turns = _load(row.get("turns"), [])
    spans = mask_spans(row)
    answers = [
        [
            (
                "split / row",
                f"{row.get('source_split')} / row {row.get('source_row')} of {row.get('source_file')}",
            ),
            ("data_source", str(row.get("data_source"))),
        ],
        [
            *[(f"message ({m['role']})", str(m.get("content"))) for m in _load(row.get("messages"), [])],
            ("chat-templated text", str(row.get("prompt_text"))),
            ("token ids", _ids(row.get("prompt_ids"))),
        ],
        [
            (
                "uid (group)",
                f"{row.get('uid')}  — {row.get('group_size') or row.get('samples_per_prompt')} trajectories",
            ),
            ("sample", f"{row.get('sample_index')} of rollout.n = {row.get('samples_per_prompt')}"),
            ("trajectory id", str(row.get("trajectory_id"))),
        ],
        [
            ("replica", _num(row.get("replica"))),
            ("sampling", _sampling_text(row.get("sampling"))),
            ("seed", _num(row.get("seed"))),
            ("weight version", _num(row.get("weight_version"))),
            ("finish reason", f"{row.get('finish_reason')} (episode: {row.get('stop_reason')})"),
            ("response", f"{row.get('response_tokens')} tokens, {row.get('action_tokens')} of them sampled"),
        ],
        _turn_lines(turns, row),
        [(kind, f"[{a}, {b})  {b - a} tokens") for kind, a, b in spans]
        + [("response_mask", "1 on action tokens only; observations and padding are 0")],
        [
            ("source", str(row.get("reward_source"))),
            ("value", _num(row.get("reward"))),
            ("extras", _extras_text(row.get("reward_extras"))),
            ("ground truth", str(_load(row.get("ground_truth"), None))),
            ("on token", f"response position {row.get('reward_token')} (the last action token)"),
            *_failure_lines(row),
        ],
        _advantage_lines(row),
        _optimization_lines(row),
        _closure_lines(row),
    ]
    return [Answer(i + 1, QUESTIONS[i], lines) for i, lines in enumerate(answers)]


def _sampling_text(value: Any) -> str:
    params = _load(value, {})
    shown = {k: v for k, v in params.items() if k not in ("seed", "stop", "stop_token_ids") or v}
    return ", ".join(f"{k}={v}" for k, v in shown.items()) or "—"


def _extras_text(value: Any) -> str:
    extras = _load(value, {})
    return ", ".join(f"{k}={_num(v)}" for k, v in extras.items()) or "—"


def _failure_lines(row: dict[str, Any]) -> list[tuple[str, str]]:
    """Why the scorer failed on this row (its reason and message); nothing when it scored."""
    reason = row.get("reward_failure")
    if not reason:
        return []
    message = row.get("reward_failure_message") or ""
    return [("scorer failed", f"{reason}: {message}" if message else str(reason))]


def _turn_lines(turns: list[dict[str, Any]], row: dict[str, Any]) -> list[tuple[str, str]]:
    lines = []
    for i, turn in enumerate(turns):
        a, b = turn["span"]
        label = f"turn {i + 1} {turn['role']}"
        text = turn.get("text")
        lines.append((label, f"[{a}, {b})" + (f"  {text!r}" if text is not None else "")))
        for call in turn.get("tool_calls", []):
            outcome = f"error: {call['error']}" if call.get("error") else f"→ {call.get('result')!r}"
            latency = f"{1000 * float(call.get('duration_s') or 0):.1f} ms"
            lines.append(
                ("  tool call", f"{call['name']}({json.dumps(call.get('arguments'))}) {outcome} ({latency})")
            )
        for error in turn.get("parse_errors", []):
            lines.append(("  parse error", str(error)))
    lines += [("failure", str(failure)) for failure in _load(row.get("tool_failures"), [])]
    lines += _gateway_call_lines(_load(row.get("gateway_calls"), []))
    summary = f"{row.get('tool_calls', 0)} tool calls, {row.get('tool_errors', 0)} failed, "
    summary += f"{row.get('parse_failures', 0)} parse failures; num_turns {row.get('num_turns')}"
    return [*lines, ("summary", summary)]


def _gateway_call_lines(calls: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The agent program's model calls of this row's episode (agent.gateway): what each call was and
    the row it became — one row for the episode (merged) or one per call, and why."""
    lines = []
    for call in calls:
        how = "merged" if call["merged"] else f"split: {call['split_reason']}"
        text = (
            f"prompt {call['prompt_tokens']} tokens, sampled {call['sampled_tokens']}, "
            f"weight version {call['weight_version']}, finish {call['finish_reason']} "
            f"→ row {call['row']} ({how})"
        )
        if call.get("extends_previous") is False:
            text += (
                f"; its prompt departs from call {call['call'] - 1}'s prompt + response at token "
                f"{call['diverges_at']}: ids {call['found_ids']} where extending needed "
                f"{call['expected_ids']}"
            )
        lines.append((f"gateway call {call['call']}", text))
    return lines


def _advantage_lines(row: dict[str, Any]) -> list[tuple[str, str]]:
    if row.get("estimator") is None:
        return [
            ("not trained", "the trajectory left the batch before the advantage phase (dynamic sampling)")
        ]
    lines = [
        ("estimator", str(row.get("estimator"))),
        (
            "advantage",
            f"{_num(row.get('advantage'))} at the first action token, mean {_num(row.get('advantage_mean'))}",
        ),
        (
            "group",
            f"{row.get('group_size')} trajectories, reward mean {_num(row.get('group_reward_mean'))}, "
            f"std {_num(row.get('group_reward_std'))} (unbiased, n−1)"
            + ("" if row.get("group_has_signal") else " — no variance: a group-relative advantage is 0"),
        ),
        *_estimator_lines(row),
        ("reward after shaping", _num(row.get("reward_shaped"))),
        ("return (mean)", _num(row.get("return_mean"))),
    ]
    if row.get("value_mean") is not None:
        lines.append(("value (mean)", _num(row.get("value_mean"))))
    return lines


def _estimator_lines(row: dict[str, Any]) -> list[tuple[str, str]]:
    """The arithmetic the estimator did, with the numbers it used (7 significant digits: enough to
    redo it by hand to float32 precision); nothing for an estimator that does not report them."""
    if row.get("advantage_baseline") is None:
        return []
    score, mean = _num(row.get("advantage_score"), 7), _num(row.get("advantage_baseline"), 7)
    advantage = _num(row.get("advantage"), 7)
    if not row.get("advantage_std_normalized"):
        return [("computed as", f"R − μ = {score} − {mean} = {advantage} (not divided by the std)")]
    std, eps = _num(row.get("advantage_std"), 7), _num(row.get("advantage_eps"), 3)
    return [
        ("computed as", f"(R − μ) / (σ + ε) = ({score} − {mean}) / ({std} + {eps}) = {advantage}"),
        (
            "statistics",
            "R: the score after shaping; μ, σ: its group's mean and unbiased std (n−1; alone: 0, 1)",
        ),
    ]


def _optimization_lines(row: dict[str, Any]) -> list[tuple[str, str]]:
    lines = [
        ("old log-prob (mean)", _num(row.get("old_log_prob_mean"))),
        (
            "rollout log-prob (mean)",
            f"{_num(row.get('rollout_log_prob_mean'))}  "
            f"|old − rollout| = {_num(row.get('old_rollout_abs_diff'))}",
        ),
        (
            "ref log-prob (mean)",
            _num(row.get("ref_log_prob_mean"))
            + (f"  old − ref = {_num(row.get('old_ref_kl'))}" if row.get("old_ref_kl") is not None else ""),
        ),
        ("entropy (mean)", _num(row.get("entropy_mean"))),
        *_distillation_lines(row),
    ]
    if row.get("new_log_prob_mean") is None:
        return [*lines, ("new log-prob", "— (not in an actor update: critic warm-up, or untraced update)")]
    low, high = row.get("clip_bounds") or (None, None)
    return [
        *lines,
        (
            "new log-prob (mean)",
            f"{_num(row.get('new_log_prob_mean'))} (the update's own forward, last pass)",
        ),
        (
            "ratio π_θ/π_old",
            f"mean {_num(row.get('ratio_mean'))}, min {_num(row.get('ratio_min'))}, "
            f"max {_num(row.get('ratio_max'))}",
        ),
        (
            "clipped share",
            f"{_num(row.get('clipped_share'))} of {row.get('update_tokens')} action tokens "
            f"(bounds 1−{low}, 1+{high})",
        ),
    ]


def _distillation_lines(row: dict[str, Any]) -> list[tuple[str, str]]:
    """The teacher's log-prob of this trajectory and the distillation term ℓ_t the update's forward
    computed from it (nothing without a teacher): means over the action tokens, and the token where
    the teacher disagrees most."""
    if row.get("teacher_log_prob_mean") is None:
        return []
    gap = ""
    if row.get("old_log_prob_mean") is not None:
        gap = f"  old − teacher = {_num(row['old_log_prob_mean'] - row['teacher_log_prob_mean'])}"
    lines = [("teacher log-prob (mean)", _num(row.get("teacher_log_prob_mean")) + gap)]
    losses = row.get("distillation_losses")
    if row.get("distillation_loss_mean") is None or not losses:
        untrained = "— (not in an actor update: critic warm-up, or untraced update)"
        return [*lines, ("distillation term", untrained)]
    actions = [t for kind, a, b in mask_spans(row) if kind == "action" for t in range(a, min(b, len(losses)))]
    worst = max(actions or range(len(losses)), key=lambda t: losses[t])
    teacher = list(row.get("teacher_log_probs") or [])
    ids = list(row.get("response_ids") or [])
    at = f"token {ids[worst]}" if worst < len(ids) else "a token"
    teacher_there = f", teacher log-prob {_num(teacher[worst])}" if worst < len(teacher) else ""
    return [
        *lines,
        (
            f"distillation ℓ_t ({row.get('distillation_loss_mode')})",
            f"mean {_num(row.get('distillation_loss_mean'))} over the action tokens (the update's forward, "
            f"last pass); largest {_num(losses[worst])} at response position {worst} ({at}{teacher_there})",
        ),
    ]


def _closure_lines(row: dict[str, Any]) -> list[tuple[str, str]]:
    if not row.get("trained"):
        return [("not trained", "this trajectory did not reach an actor update")]
    return [
        ("generated by", f"weight version {row.get('weight_version')}"),
        (
            "trained at",
            f"weight version {row.get('trained_version')} (the actor's weights the update started from)",
        ),
        (
            "staleness",
            f"{row.get('staleness')} version(s); the sync after this step serves "
            f"{int(row.get('trained_version') or 0) + 1}",
        ),
    ]


# --- choosing a row -------------------------------------------------------------------------------
_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare, ast.Eq,
    ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot, ast.Name, ast.Load,
    ast.Constant, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Mod, ast.Tuple, ast.List,
)  # fmt: skip


def compile_where(expression: str) -> Any:
    """A `--where` expression as code: comparisons, and/or/not, arithmetic, constants and column
    names only (no calls, no attributes); ValueError naming what is not allowed."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as error:
        raise ValueError(f"--where {expression!r} is not an expression: {error.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ValueError(
                f"--where {expression!r}: {type(node).__name__} is not allowed (use comparisons of "
                "columns and constants, e.g. \"reward == 0 and finish_reason == 'length'\")"
            )
    return compile(tree, "<--where>", "eval")


def select_row(
    rows: Sequence[dict[str, Any]],
    *,
    uid: str | None = None,
    sample: int | None = None,
    worst: bool = False,
    best: bool = False,
    where: str | None = None,
) -> dict[str, Any]:
    """The one trajectory `stratarl trace` shows; LookupError saying why none matched."""
    if not rows:
        raise LookupError("the step has no traced trajectories")
    candidates = list(rows)
    if uid is not None:
        candidates = [r for r in candidates if uid in (r.get("uid"), r.get("trajectory_id"))]
        if not candidates:
            uids = sorted({str(r.get("uid")) for r in rows})
            raise LookupError(f"no trajectory with uid {uid!r} in this step; uids: {uids[:12]}")
        if sample is not None:
            candidates = [r for r in candidates if r.get("sample_index") == sample]
    elif sample is not None:
        if not 0 <= sample < len(rows):
            raise LookupError(
                f"--sample {sample}: this step traced {len(rows)} trajectories (0..{len(rows) - 1})"
            )
        candidates = [rows[sample]]
    if where is not None:
        code = compile_where(where)
        candidates = [r for r in candidates if _holds(code, r, where)]
    if not candidates:
        raise LookupError("no traced trajectory of this step matches")
    if worst or best:
        ordered = sorted(candidates, key=lambda r: (r.get("reward") or 0.0, r.get("advantage") or 0.0))
        return ordered[0] if worst else ordered[-1]
    return candidates[0]


def _holds(code: Any, row: dict[str, Any], expression: str) -> bool:
    try:
        return bool(eval(code, {"__builtins__": {}}, dict(row)))  # names: the row's columns only
    except NameError as error:
        raise ValueError(f"--where {expression!r}: {error}; columns: {sorted(row)}") from None
    except TypeError:
        return False  # e.g. None < 1 for a row without that value


# --- tokens, coloured by mask ---------------------------------------------------------------------
@dataclass(frozen=True)
class TokenPiece:
    text: str
    kind: str  # prompt | action | observation | padding
    token_id: int
    is_reward: bool = False


def token_pieces(row: dict[str, Any], tokenizer: Any | None) -> list[TokenPiece]:
    """Every prompt and response token of the trajectory with its mask kind; the reward's token is
    marked. Without a tokenizer each token shows as its id."""
    prompt, response = list(row.get("prompt_ids") or []), list(row.get("response_ids") or [])

    def text(ids: list[int]) -> list[str]:
        if tokenizer is None:
            return [f"⟨{i}⟩" for i in ids]
        return tokenizer.batch_decode([[i] for i in ids])

    kinds = ["padding"] * len(response)
    for kind, a, b in mask_spans(row):
        for t in range(a, min(b, len(response))):
            kinds[t] = kind
    reward_token = row.get("reward_token")
    pieces = [TokenPiece(s, "prompt", i) for s, i in zip(text(prompt), prompt, strict=True)]
    pieces += [
        TokenPiece(s, kinds[t], i, is_reward=t == reward_token)
        for t, (s, i) in enumerate(zip(text(response), response, strict=True))
    ]
    return pieces
