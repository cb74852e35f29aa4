"""Cross-cutting: the doctor's checks of the loss terms besides the policy gradient — a KL-to-reference
term that outweighs the policy loss, and a critic (PPO) that does not learn its values.
"""

from __future__ import annotations

from stratarl.observe.doctor.checks import _mean, _steps
from stratarl.observe.doctor.view import CONFIG, RL_MATH, Finding, RunView

KL_DOMINATES = 1.0  # kl_coef·kl_loss over |pg_loss|, later half (the quickstart with the KL loss: 0.02)
EXPLAINED_FLOOR = 0.0  # critic/vf_explained_var below this: the values explain none of the returns
EXPLAINED_GAIN = 0.1  # ... and it rose less than this from the first third to the last
CRITIC_MIN_STEPS = 5  # a critic is not judged on fewer steps


def _half(series: list[tuple[int, float]]) -> list[float]:
    return [v for _, v in series[len(series) // 2 :]]


def check_kl_loss(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """With actor.use_kl_loss the loss is pg_loss + β·KL(π_θ‖π_ref). When β·KL outweighs |pg_loss|
    the update mostly pulls the policy back to the reference instead of toward reward. |pg_loss| is
    itself small (advantages centre on 0), so the line is a ratio of later-half means, not a step's."""
    kl, pg = view.series("actor/kl_loss"), view.series("actor/pg_loss")
    if len(kl) < 2 or len(pg) < 2:
        return []
    coef = view.series("actor/kl_coef")
    beta = _mean(_half(coef)) if coef else float(view.setting("actor.kl_loss_coef") or 0.0)
    term, policy = beta * _mean(_half(kl)), _mean([abs(v) for v in _half(pg)])
    if term <= 0 or term < KL_DOMINATES * max(policy, 1e-12):
        return []
    grew = kl[-1][1] >= 4 * max(kl[0][1], 1e-12)
    return [
        Finding(
            "warning",
            CONFIG,
            f"the KL loss outweighs the policy loss {term / max(policy, 1e-12):.1f}×: the update mostly "
            "pulls the policy back to the reference",
            [
                f"actor/kl_loss {kl[0][1]:.3g} → {kl[-1][1]:.3g} ({_steps(kl)}), coefficient {beta:.3g}",
                f"later half: β·kl_loss {term:.3g} against mean |actor/pg_loss| {policy:.3g}",
                "the KL itself grew several-fold: the policy drifts fast (actor.lr)"
                if grew
                else "the KL stayed small: the coefficient, not the drift, makes it large",
            ],
            f"lower actor.kl_loss_coef (now {view.setting('actor.kl_loss_coef')})"
            + (" or actor.lr, which drives the drift" if grew else "")
            + "; GRPO recipes use 1e-3",
            key="kl_dominates",
        )
    ]


def check_critic(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """PPO's critic learns when its values explain the returns: explained variance
    1 − Var(R − V)/Var(R) climbs toward 1. One that stays at or below 0 predicts no better than a
    constant, so GAE's advantages are noise."""
    explained, loss = view.series("critic/vf_explained_var"), view.series("critic/vf_loss")
    if len(explained) < CRITIC_MIN_STEPS:
        return []
    k = max(1, len(explained) // 3)
    first, last = _mean([v for _, v in explained[:k]]), _mean([v for _, v in explained[-k:]])
    if last >= EXPLAINED_FLOOR or last - first >= EXPLAINED_GAIN:
        return []
    evidence = [
        f"critic/vf_explained_var {first:.3g} over the first third → {last:.3g} over the last "
        f"({_steps(explained)})"
    ]
    if loss:
        evidence.append(f"critic/vf_loss {loss[0][1]:.3g} → {loss[-1][1]:.3g}")
    return [
        Finding(
            "warning",
            RL_MATH,
            f"the critic does not learn: its values explain none of the returns (explained var {last:.2g})",
            evidence,
            f"raise critic.lr (now {view.setting('critic.lr')}) or give it critic.warmup_training_steps "
            "before the actor trains; check the returns' scale (critic/returns/*) and critic.grad_clip",
            key="critic",
        )
    ]
