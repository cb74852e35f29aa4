"""Cross-cutting: the doctor's checks of a policy the update breaks — a learning rate too high, a
negative entropy bonus, responses that degenerate into repetition.

These run before the truncation and signal checks, which defer to them: a broken policy runs to the
length cap and its groups stop differing, but raising max_response_tokens or rollout.n would not
help. What tells the causes apart:

    learning rate too high     reward falls after the first steps, entropy RISES (or spikes and
                               falls back), responses turn to garbage, repeat one token or shrink to
                               nothing (the turn ends at once), the clip ratio climbs
    negative entropy bonus     actor.entropy_coeff < 0: entropy FALLS toward 0, groups become identical
    eos misconfigured          (sampling)     truncated from step 1, before any update
    answers need more room     (truncation) truncated from step 1, reward never there to fall
"""

from __future__ import annotations

from stratarl.observe.doctor.checks import _had, _mean, _steps
from stratarl.observe.doctor.reward import LENGTH_GROWTH, TRAIN_RISE, _early_late
from stratarl.observe.doctor.view import CONFIG, Finding, RunView

REWARD_FALL = 0.5  # the later third's reward below this share of the early peak ...
REWARD_FALL_MIN = 0.1  # ... and at least this much lower in absolute terms
ENTROPY_RISE = 1.5  # later entropy above this multiple of the first step's: the policy is spreading out
ENTROPY_RISE_ALONE = 2.0  # ... a rise this large is a collapse sign even when the reward was never there
ENTROPY_RISE_FLOOR = 0.1  # ... counted only when entropy ends above this (nats/token): from a nearly
# deterministic policy (a solved task, 0.003 → 0.007 on sort_numbers) a doubling is noise, not a collapse
ENTROPY_SPIKE = 3.0  # entropy's peak above this multiple of the first step's, even if it fell back
# (an EPYC's lr=3e-2 run: 0.30 → 1.42 at step 2 → 0.36; healthy 8-step runs peak at ≤ 1.6×)
LENGTH_COLLAPSE = 0.5  # the later third's mean response length below this share of the first step's
LENGTH_COLLAPSE_FROM = 2.0  # ... judged when the first step's responses had at least this many tokens
CLIP_RISE = 0.3  # the share at the length cap grew by this much since the first step
GRAD_SPIKE = 10.0  # actor/grad_norm above this multiple of its first value
REPEAT_SHARE = 0.5  # a response is repetitive when this share of its tokens repeat the token(s) before
REPEAT_MIN_TOKENS = 8  # shorter responses are not judged
REPEAT_ROWS = 0.3  # share of the later traced responses that are repetitive
ENTROPY_COLLAPSED = 0.5  # entropy fell below this share of its first value


def _thirds(series: list[tuple[int, float]]) -> tuple[list[float], list[float]]:
    """(the first third, the last third) of a series' values, at least one step each."""
    k = max(1, len(series) // 3)
    return [v for _, v in series[:k]], [v for _, v in series[-k:]]


def repeated_share(ids: list[int]) -> float:
    """The largest share, over n = 1..4, of tokens equal to the token n places before: 'a a a a' and
    'a b a b' give ≈ 1, ordinary text stays near 0."""
    if len(ids) < 2:
        return 0.0
    return max(sum(ids[i] == ids[i - n] for i in range(n, len(ids))) / len(ids) for n in range(1, 5))


def repetitive_rows(view: RunView) -> tuple[list[dict], int]:
    """(the repetitive responses, how many were judged) among the traced rows of the later half."""
    steps = sorted(view.traces)
    late = [r for s in steps[len(steps) // 2 :] for r in view.traces[s]]
    judged = [r for r in late if len(r.get("response_ids") or []) >= REPEAT_MIN_TOKENS]
    return [r for r in judged if repeated_share(list(r["response_ids"])) >= REPEAT_SHARE], len(judged)


def check_negative_entropy_bonus(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """actor.entropy_coeff < 0: the loss −c·H with c < 0 rewards *lower* entropy, so the update
    drives the policy toward one answer per prompt and its groups stop differing."""
    coeff = view.setting("actor.entropy_coeff")
    if not isinstance(coeff, int | float) or coeff >= 0:
        return []
    entropy, signal = view.series("actor/entropy"), view.series("batch/groups_with_signal")
    fell = len(entropy) >= 2 and entropy[-1][1] < ENTROPY_COLLAPSED * entropy[0][1]
    evidence = [f"actor.entropy_coeff = {coeff:g} (the loss subtracts entropy_coeff × entropy)"]
    if entropy:
        evidence.append(
            f"actor/entropy {entropy[0][1]:.3g} at step {entropy[0][0]} → {entropy[-1][1]:.3g} "
            f"at step {entropy[-1][0]}"
        )
    if signal:
        evidence.append(f"batch/groups_with_signal {signal[0][1]:.0%} → {signal[-1][1]:.0%}")
    evidence.append("entropy falls here; a learning rate too high makes it rise instead")
    return [
        Finding(
            "problem" if fell else "warning",
            CONFIG,
            "a negative entropy bonus pushes the policy to collapse"
            + (f": entropy fell to {entropy[-1][1] / entropy[0][1]:.0%} of its first value" if fell else ""),
            evidence,
            f"set actor.entropy_coeff ≥ 0 (now {coeff:g}; 0 is the default, a bonus is a small positive "
            "number such as 1e-3)",
            key="negative_entropy_bonus",
        )
    ]


def broken_distribution_signs(view: RunView) -> tuple[list[str], float]:
    """The signs of a broken distribution, as evidence lines, and entropy's last/first ratio: entropy
    rising or spiking, responses shrinking to nothing, the length cap reached more and more, a
    gradient-norm spike, repetitive responses."""
    signs = []
    entropy = view.series("actor/entropy")
    rise = entropy[-1][1] / entropy[0][1] if len(entropy) >= 2 and entropy[0][1] > 0 else 1.0
    if entropy and entropy[-1][1] < ENTROPY_RISE_FLOOR:
        rise = 1.0
    if rise >= ENTROPY_RISE:
        signs.append(f"actor/entropy rose {rise:.1f}× ({entropy[0][1]:.3g} → {entropy[-1][1]:.3g})")
    elif len(entropy) >= 3 and entropy[0][1] > 0:
        step, peak = max(entropy, key=lambda sv: sv[1])
        if peak >= ENTROPY_SPIKE * entropy[0][1] and peak >= ENTROPY_RISE_FLOOR:
            signs.append(
                f"actor/entropy spiked {peak / entropy[0][1]:.1f}× at step {step} ({entropy[0][1]:.3g} → "
                f"{peak:.3g}) before falling to {entropy[-1][1]:.3g}"
            )
    lengths = view.series("response_length/mean")
    if len(lengths) >= 3 and lengths[0][1] >= LENGTH_COLLAPSE_FROM:
        late = _mean(_thirds(lengths)[1])
        if late <= LENGTH_COLLAPSE * lengths[0][1]:
            signs.append(
                f"response_length/mean {lengths[0][1]:.3g} tokens at step {lengths[0][0]} → {late:.3g} over "
                "the last third: the policy ends its turn at once"
            )
    clip = view.series("response_length/clip_ratio")
    if len(clip) >= 2 and _mean(_thirds(clip)[1]) - clip[0][1] >= CLIP_RISE:
        signs.append(
            f"response_length/clip_ratio {clip[0][1]:.0%} at step {clip[0][0]} → "
            f"{_mean(_thirds(clip)[1]):.0%}: responses run to the cap once the policy broke"
        )
    grad = view.series("actor/grad_norm")
    if len(grad) >= 2 and grad[0][1] > 0 and max(v for _, v in grad) >= GRAD_SPIKE * grad[0][1]:
        step, top = max(grad, key=lambda sv: sv[1])
        signs.append(f"actor/grad_norm {grad[0][1]:.3g} at step {grad[0][0]}, {top:.3g} at step {step}")
    repetitive, judged = repetitive_rows(view)
    if judged and len(repetitive) / judged >= REPEAT_ROWS:
        row = repetitive[-1]
        signs.append(
            f"{len(repetitive) / judged:.0%} of later traced responses repeat themselves, e.g. "
            f"trajectory {row.get('trajectory_id')}: {str(row.get('response_text'))[:60]!r}"
        )
    return signs, rise


def bought_with_length(view: RunView) -> bool:
    """The training reward rose while responses grew several-fold (reward.py's lines): a policy
    that spreads out to write more is paid for it, not broken by its update."""
    lengths, score = view.series("response_length/mean"), view.series("critic/score/mean")
    if len(lengths) < 4 or len(score) < 4:
        return False
    (l0, l1), (s0, s1) = _early_late(lengths), _early_late(score)
    return l1 >= LENGTH_GROWTH * max(l0, 1e-9) and s1 - s0 >= TRAIN_RISE


def check_policy_broken(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """The update wrecked the policy (most often actor.lr far too high): the reward it had falls away
    after the first steps with at least one sign of a broken distribution, or entropy more than
    doubled with another sign besides."""
    score = view.series("critic/score/mean")
    if len(score) < 4 or _had(earlier, "negative_entropy_bonus"):
        return []
    early, late = _thirds(score)
    peak, now = max(early), _mean(late)
    fell = peak > 0 and now <= REWARD_FALL * peak and peak - now >= REWARD_FALL_MIN
    signs, rise = broken_distribution_signs(view)
    if not (fell and signs) and not (rise >= ENTROPY_RISE_ALONE and len(signs) >= 2):
        return []
    if not fell and bought_with_length(view):
        return []  # the reward pays for the spreading, longer text: hacking by length says so
    lr = view.setting("actor.lr")
    evidence = [f"critic/score/mean {peak:.3g} early → {now:.3g} over the last third ({_steps(score)})"]
    evidence = (evidence if fell else []) + signs
    evidence.append(f"actor.lr = {lr}; the truncation and missing signal that follow are symptoms")
    return [
        Finding(
            "problem",
            CONFIG,
            "the update breaks the policy (learning rate too high): "
            + ("the reward falls away after the first steps" if fell else f"entropy rose {rise:.1f}×"),
            evidence,
            f"lower actor.lr (now {lr}; try a tenth) and check actor/grad_norm against actor.grad_clip; "
            "start again from the model (the broken weights do not recover), or from a checkpoint before "
            "the fall",
            key="policy_broken",
        )
    ]


def check_repetition(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """Responses that degenerate into repeating a token or a short phrase, when no broken update
    explains them (that finding lists them as evidence)."""
    if _had(earlier, "policy_broken") or _had(earlier, "eos"):
        return []  # a broken policy repeats itself; past a missed EOS the model rambles on
    repetitive, judged = repetitive_rows(view)
    if not judged or len(repetitive) / judged < REPEAT_ROWS:
        return []
    row = repetitive[-1]
    return [
        Finding(
            "warning",
            CONFIG,
            f"degenerate repetition: {len(repetitive) / judged:.0%} of later traced responses repeat a "
            "token or phrase",
            [
                f"{len(repetitive)} of {judged} later traced responses of ≥ {REPEAT_MIN_TOKENS} tokens "
                f"have ≥ {REPEAT_SHARE:.0%} of their tokens repeating the ones before",
                f"e.g. trajectory {row.get('trajectory_id')}: {str(row.get('response_text'))[:80]!r} "
                f"(`stratarl trace RUN --uid {row.get('trajectory_id')}`)",
            ],
            "a policy pushed too far too fast, or a reward that does not mind repetition: lower actor.lr, "
            "keep rollout.temperature near 1, and check that the reward of such a response is low",
            key="repetition",
        )
    ]
