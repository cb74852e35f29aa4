"""Cross-cutting: the doctor's check of a distillation teacher against the task reward.

With distillation.use_task_rewards=true the actor follows two signals at once, L_task + c·L_distill.
When the teacher does not prefer the responses the reward pays for, the two pull apart: the
distillation term teaches what the reward punishes. The trace tells: within a prompt's group,
of two responses with different rewards, which one the teacher gives the higher mean log-prob
(`teacher_log_prob_mean`). A teacher that knows the task agrees with the reward in most such
pairs; one that does not sits at chance (50%) or below.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations

from stratarl.observe.doctor.checks import _mean
from stratarl.observe.doctor.view import CONFIG, Finding, RunView

MIN_PAIRS = 16  # within-group pairs of different reward (and teacher log-prob) needed to judge
Z_ABOVE_CHANCE = 1.64  # the agreement must clear 50% by this many standard errors (one-sided 5%)


def teacher_pairs(view: RunView) -> list[tuple[dict, dict]]:
    """(the higher-reward row, the lower-reward row) for every pair of traced rows of one step's
    prompt group whose rewards and teacher log-prob means differ."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for step, rows in view.traces.items():
        for row in rows:
            if isinstance(row.get("teacher_log_prob_mean"), float) and row.get("reward") is not None:
                groups[(step, row.get("uid"))].append(row)
    pairs = []
    for rows in groups.values():
        for a, b in combinations(rows, 2):
            high, low = (a, b) if a["reward"] > b["reward"] else (b, a)
            if high["reward"] != low["reward"] and a["teacher_log_prob_mean"] != b["teacher_log_prob_mean"]:
                pairs.append((high, low))
    return pairs


def check_teacher_against_reward(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """A teacher that does not prefer what the reward pays for, while both are in the loss."""
    if not view.setting("distillation.enabled") or not view.setting("distillation.use_task_rewards"):
        return []
    pairs = teacher_pairs(view)
    if len(pairs) < MIN_PAIRS:
        return []
    agreeing = [(h, lo) for h, lo in pairs if h["teacher_log_prob_mean"] > lo["teacher_log_prob_mean"]]
    agreement = len(agreeing) / len(pairs)
    if agreement >= 0.5 + Z_ABOVE_CHANCE * (0.25 / len(pairs)) ** 0.5:
        return []
    high, low = next(
        ((h, lo) for h, lo in reversed(pairs) if h["teacher_log_prob_mean"] < lo["teacher_log_prob_mean"]),
        pairs[-1],
    )
    evidence = [
        f"in {agreement:.0%} of {len(pairs)} traced pairs of one prompt's responses with different rewards "
        f"the teacher gives the higher-reward one the higher mean log-prob (chance: 50%)",
        f"e.g. trajectory {low.get('trajectory_id')} (reward {low['reward']:.3g}) has teacher log-prob "
        f"{low['teacher_log_prob_mean']:.4g}, {high.get('trajectory_id')} (reward {high['reward']:.3g}) "
        f"{high['teacher_log_prob_mean']:.4g}",
    ]
    rows = view.trace_rows()
    teacher = [r["teacher_log_prob_mean"] for r in rows if isinstance(r.get("teacher_log_prob_mean"), float)]
    student = [r["old_log_prob_mean"] for r in rows if isinstance(r.get("old_log_prob_mean"), float)]
    if teacher and student:  # a teacher far below the student on its own tokens may not know the task
        evidence.append(
            f"mean log-prob of the traced responses: teacher {_mean(teacher):.3g}, the student's own "
            f"(π_old) {_mean(student):.3g}"
        )
    coef = view.setting("distillation.distillation_loss_coef")
    losses = [v for _, v in view.series("distillation/loss")]
    if losses:
        evidence.append(
            f"distillation/loss {losses[0]:.3g} → {losses[-1]:.3g} with distillation_loss_coef={coef}, "
            f"critic/score/mean {_mean([v for _, v in view.series('critic/score/mean')]):.3g} on average"
        )
    opposed = agreement < 0.5
    return [
        Finding(
            "warning",
            CONFIG,
            "the distillation teacher prefers the responses the reward scores low"
            if opposed
            else "the distillation teacher does not prefer the responses the reward pays for (chance level)",
            evidence,
            "check the teacher: is distillation.teacher_model_path the model you meant (trained on this "
            "task, stronger than the student)? Compare it on a low- and a high-reward response "
            "(`stratarl trace RUN --worst` / `--best`: teacher log-prob, distillation ℓ_t). If the "
            "teacher is right and the reward wrong, fix the reward; otherwise lower "
            "distillation.distillation_loss_coef so the reward leads, or use another teacher",
            key="teacher_disagrees",
        )
    ]
