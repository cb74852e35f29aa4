"""Cross-cutting: the doctor's checks of what the reward teaches — a reward whose sign or meaning is
wrong, held-out accuracy that does not move, reward hacked by length or by a shortcut (the same
answer whatever the prompt), a format reward that saturates.

Several share one symptom: the training reward rises while validation falls or stays flat. What
tells them apart is in the run's records:

    sign or meaning wrong      rewarded traced responses miss the ground truth, unrewarded ones hold it
    hacked by length           response_length/mean grows with the reward
    a shortcut                 one answer for most prompts although the ground truths differ
    format reward saturates    the format term is (nearly) always earned; the accuracy term does not move

Validation is `val-core/<data_source>/<acc or reward>/mean@n` (the greedy held-out score).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter

from stratarl.observe.doctor.checks import _had, _mean, _steps
from stratarl.observe.doctor.view import COMPUTE, Finding, RunView

TRAIN_RISE = 0.1  # the training reward's later half above its first steps by this much
VAL_FALL = 0.1  # the last validation below the first by this much (absolute)
VAL_FLAT = 0.02  # every validation within this of the first: flat
VAL_POINTS = 3  # validations needed to judge a trend
INVERTED_GAP = 0.5  # P(ground truth in response | unrewarded) − P(... | rewarded) at least this
INVERTED_ROWS = 8  # traced rows needed on each side
LENGTH_GROWTH = 2.0  # response_length/mean, later half over the first steps
SHORTCUT_SHARE = 0.8  # one answer in at least this share of the later traced responses ...
SHORTCUT_TRUTH = 0.5  # ... while the commonest ground truth is at most this share
SHORTCUT_PROMPTS = 5  # distinct prompt groups needed
FORMAT_SATURATED = 0.95  # a format extra's later mean at or above this
ACCURACY_STILL = 0.05  # the accuracy extra moved less than this ...
FORMAT_JUDGE_STEPS = 20  # ... over at least this many steps when no flat validation says the run is stuck


def val_series(view: RunView) -> tuple[str | None, list[tuple[int, float]]]:
    """(the held-out core metric's name, its (step, value) series); acc preferred over reward."""
    keys = sorted(
        {
            k
            for r in view.val
            for k in r
            if k.startswith("val-core/") and "/mean@" in k and not k.startswith("val-core/agent/")
        }
    )
    key = next((k for k in keys if "/acc/" in k), keys[0] if keys else None)
    if key is None:
        return None, []
    return key, [(int(r["step"]), float(r[key])) for r in view.val if isinstance(r.get(key), int | float)]


def _flat(val: list[tuple[int, float]]) -> bool:
    """Enough held-out points to judge, and every one within VAL_FLAT of the first."""
    return len(val) >= VAL_POINTS and max(abs(v - val[0][1]) for _, v in val) <= VAL_FLAT


def _early_late(series: list[tuple[int, float]]) -> tuple[float, float]:
    """(the mean of the first quarter, at least one step; the mean of the later half)."""
    k = max(1, len(series) // 4)
    return _mean([v for _, v in series[:k]]), _mean([v for _, v in series[len(series) // 2 :]])


def _truth_in(row: dict) -> bool | None:
    """Whether the response holds its ground truth as a whole word; None when either is missing."""
    truth, text = row.get("ground_truth"), row.get("response_text")
    with contextlib.suppress(json.JSONDecodeError):  # the trace stores it JSON-encoded
        truth = json.loads(truth) if isinstance(truth, str) else truth
    if not isinstance(truth, str | int | float) or not isinstance(text, str) or str(truth) == "":
        return None
    return re.search(rf"(?<![\w.]){re.escape(str(truth))}(?![\w.])", text) is not None


def reward_inverted(view: RunView) -> tuple[float, float, list[dict], int] | None:
    """(P(truth | unrewarded), P(truth | rewarded), the rewarded rows, how many unrewarded) over the
    traced rows of the later half, split at their mean reward; None without enough rows each side."""
    steps = sorted(view.traces)
    rows = [r for s in steps[len(steps) // 2 :] for r in view.traces[s] if _truth_in(r) is not None]
    if not rows:
        return None
    middle = _mean([float(r.get("reward") or 0) for r in rows])
    high = [r for r in rows if float(r.get("reward") or 0) > middle]
    low = [r for r in rows if float(r.get("reward") or 0) <= middle]
    if len(high) < INVERTED_ROWS or len(low) < INVERTED_ROWS:
        return None
    share = lambda group: sum(bool(_truth_in(r)) for r in group) / len(group)  # noqa: E731
    return share(low), share(high), high, len(low)


def check_reward_sign(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """The run learns to be wrong: the reward pays for responses without the ground truth, or the
    held-out score falls while the training reward rises."""
    score = view.series("critic/score/mean")
    key, val = val_series(view)
    inverted = reward_inverted(view)
    rises = len(score) >= 4 and _early_late(score)[1] - _early_late(score)[0] >= TRAIN_RISE
    falls = len(val) >= VAL_POINTS and val[0][1] - val[-1][1] >= VAL_FALL
    evidence = []
    if rises:
        early, late = _early_late(score)
        evidence.append(
            f"critic/score/mean {early:.3g} early → {late:.3g} over the later half ({_steps(score)})"
        )
    if falls:
        evidence.append(f"{key}: " + ", ".join(f"step {s} {v:.3g}" for s, v in val))
    is_inverted = inverted is not None and inverted[0] - inverted[1] >= INVERTED_GAP
    if is_inverted:
        in_low, in_high, high, low = inverted
        wrong = next((r for r in reversed(high) if not _truth_in(r)), high[-1])
        evidence.append(
            f"later traced rows: the ground truth is in {in_low:.0%} of {low} low-reward responses and "
            f"{in_high:.0%} of {len(high)} high-reward ones, e.g. trajectory {wrong.get('trajectory_id')}: "
            f"{str(wrong.get('response_text'))[:60]!r} rewarded {wrong.get('reward')}, ground truth "
            f"{wrong.get('ground_truth')}"
        )
    if not is_inverted and not (rises and falls):
        return []
    if not is_inverted:
        lengths = view.series("response_length/mean")
        grew = len(lengths) >= 4 and _early_late(lengths)[1] >= LENGTH_GROWTH * max(
            _early_late(lengths)[0], 1e-9
        )
        if grew or _had(earlier, "shortcut"):
            return []  # hacking by length or a shortcut explains it (their own findings)
        evidence.append(
            "responses did not grow and no shortcut answer dominates: not hacking by length "
            "or shortcut; the reward's meaning is the suspect"
        )
    return [
        Finding(
            "problem" if is_inverted else "warning",
            COMPUTE,
            "the reward's sign or meaning is wrong: the run learns to be wrong"
            if is_inverted
            else "validation falls while the training reward rises",
            evidence,
            "check the reward's sign on the reference answers: score each ground truth as the response "
            "(it must get the top reward) and a wrong answer (the bottom); see a rewarded trajectory with "
            "`stratarl trace RUN --best` (reward.custom_function_path, the scorer for its data_source)",
            key="reward_sign",
        )
    ]


NAMED_CAUSES = (  # findings that explain a flat held-out score themselves
    "policy_broken", "reward_sign", "reward_constant", "no_signal", "weak_signal", "cold_sampling",
    "flat_loss", "eos", "negative_entropy_bonus", "shortcut", "length_hacking", "format_saturated",
)  # fmt: skip


def check_flat_validation(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """Held-out score that does not move over the run, when no more specific finding named why (a
    broken policy, a wrong reward, hacking, no signal, a saturated format reward)."""
    key, val = val_series(view)
    if not _flat(val):
        return []
    if any(_had(earlier, key) for key in NAMED_CAUSES):
        return []
    score = view.series("critic/score/mean")
    train_rises = len(score) >= 4 and _early_late(score)[1] - _early_late(score)[0] >= TRAIN_RISE
    evidence = [f"{key}: " + ", ".join(f"step {s} {v:.3g}" for s, v in val)]
    if score:
        evidence.append(f"critic/score/mean {_early_late(score)[0]:.3g} early → {_early_late(score)[1]:.3g}")
    return [
        Finding(
            "warning",
            COMPUTE,
            "held-out score does not move: "
            + (
                "the training reward rises without it (the reward or "
                "the training data is not the held-out task)"
                if train_rises
                else "the run is not learning the task"
            ),
            evidence,
            "compare a training and a validation trajectory (`stratarl trace RUN --best`, val_generations/"
            "folder): do both come from the same task and scorer? If the training reward rises alone, look "
            "for hacking (length, one answer); if neither moves: more steps, a larger actor.lr, easier data",
            key="flat_validation",
        )
    ]


def check_length_hacking(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """Reward bought with length: responses grow several-fold with the training reward while the
    held-out score does not follow."""
    lengths, score = view.series("response_length/mean"), view.series("critic/score/mean")
    key, val = val_series(view)
    if len(lengths) < 4 or len(score) < 4 or _had(earlier, "policy_broken"):
        return []
    (l0, l1), (s0, s1) = _early_late(lengths), _early_late(score)
    val_follows = len(val) >= 2 and val[-1][1] - val[0][1] >= TRAIN_RISE / 2
    if l1 < LENGTH_GROWTH * max(l0, 1e-9) or s1 - s0 < TRAIN_RISE or val_follows:
        return []
    evidence = [f"response_length/mean {l0:.1f} → {l1:.1f} tokens; critic/score/mean {s0:.3g} → {s1:.3g}"]
    evidence.append(f"{key}: {val[0][1]:.3g} → {val[-1][1]:.3g}" if val else "no validation to confirm")
    return [
        Finding(
            "warning",
            COMPUTE,
            f"reward hacking by length: responses grew {l1 / max(l0, 1e-9):.1f}× with the reward, "
            "held-out score did not follow",
            evidence,
            "score a short and a long response of equal correctness: if the long one gets more, the reward "
            "pays for length; penalise it (reward.overlong_buffer), cap rollout.max_response_tokens, or "
            "use a per-sequence loss aggregation (actor.loss_agg_mode=seq-mean-token-mean)",
            key="length_hacking",
        )
    ]


def _answer(text: object) -> str | None:
    """The last word of a response, special tokens removed: the answer a reader would grade."""
    if not isinstance(text, str):
        return None
    words = re.findall(r"[-+]?\w+", re.sub(r"<[^<>\s]{1,40}>", " ", text))
    return words[-1].lower() if words else None


def check_shortcut(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """The same answer whatever the prompt: the policy found an answer the reward (or the data's
    label balance) pays for without reading the question."""
    steps = sorted(view.traces)
    rows = [r for s in steps[len(steps) // 2 :] for r in view.traces[s]]
    answers = [a for a in (_answer(r.get("response_text")) for r in rows) if a is not None]
    prompts = {r.get("uid") for r in rows}
    truths = Counter(str(r.get("ground_truth")) for r in rows if r.get("ground_truth") is not None)
    if len(prompts) < SHORTCUT_PROMPTS or not answers or not truths:
        return []
    answer, count = Counter(answers).most_common(1)[0]
    share, truth_share = count / len(answers), truths.most_common(1)[0][1] / sum(truths.values())
    if share < SHORTCUT_SHARE or truth_share > SHORTCUT_TRUTH:
        return []
    key, val = val_series(view)
    example = next(r for r in reversed(rows) if _answer(r.get("response_text")) == answer)
    evidence = [
        f"{share:.0%} of {len(answers)} later traced responses over {len(prompts)} prompts answer "
        f"{answer!r}; "
        f"the commonest ground truth is {truth_share:.0%} of them ({len(truths)} distinct)",
        f"e.g. trajectory {example.get('trajectory_id')}: {str(example.get('response_text'))[:60]!r}, ground "
        f"truth {example.get('ground_truth')}",
    ]
    if val:
        evidence.append(f"{key}: {val[0][1]:.3g} → {val[-1][1]:.3g}")
    return [
        Finding(
            "warning",
            COMPUTE,
            f"a shortcut: the same answer {answer!r} whatever the prompt",
            evidence,
            "the reward pays for an answer without its question: check how often that answer is right in "
            "the training data (label balance), and whether the scorer accepts it for prompts whose truth "
            "differs; balance the labels or shuffle answer positions",
            key="shortcut",
        )
    ]


def check_format_saturation(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """A format term (`reward/<name with format>/mean`) earned by (nearly) every response while the
    accuracy term stays where it was: the reward left is the format's, and it no longer differs."""
    names = sorted(
        {
            k
            for r in view.train
            for k in r
            if k.startswith("reward/") and "format" in k and k.endswith("/mean")
        }
    )
    accuracy = view.series("reward/acc/mean")
    if not names or len(accuracy) < 4:
        return []
    fmt = view.series(names[0])
    late_fmt = _mean([v for _, v in fmt[len(fmt) // 2 :]])
    a0, a1 = _early_late(accuracy)
    if late_fmt < FORMAT_SATURATED or abs(a1 - a0) >= ACCURACY_STILL:
        return []
    # A format learned in SFT saturates from step 1 of a healthy run; it costs something only when the
    # run is stuck: a flat held-out score, or (without one) a flat accuracy over many steps.
    _, val = val_series(view)
    if not _flat(val) and len(accuracy) < FORMAT_JUDGE_STEPS:
        return []
    return [
        Finding(
            "warning",
            COMPUTE,
            f"the format reward saturates: {names[0]} is {late_fmt:.0%}, reward/acc/mean stays at {a1:.2g}",
            [
                f"{names[0]} later half {late_fmt:.0%}; reward/acc/mean {a0:.3g} → {a1:.3g} "
                f"({_steps(accuracy)})"
            ],
            "every response earns the format term, so it no longer tells samples apart: weight the accuracy "
            "term up, pay the format term only with a correct answer, or drop it once it is learned",
            key="format_saturated",
        )
    ]
