"""Cross-cutting: the doctor on a `stratarl sft` run — did the loss fall, what did held-out accuracy do,
and is the model ready for GRPO.

An SFT run has `sft` records (the NLL per step) and `val` records (held-out accuracy at each
evaluation), and its summary.json (`accuracy_by_step`, `stopped_on_plateau`). GRPO learns only from
groups whose n samples do not all score alike; at accuracy p that is 1 − pⁿ − (1 − p)ⁿ of them (the
same line `stratarl train` warns at: `algo.groups.share_of_groups_with_signal`, which this layer
may not import).
"""

from __future__ import annotations

from stratarl.observe.doctor.checks import _mean
from stratarl.observe.doctor.view import CONFIG, Finding, RunView, read_json_file

LOSS_FALL = 0.9  # the last third's mean NLL above this share of the first third's: the loss did not fall
LOW_SIGNAL_SHARE = 0.5  # stratarl train's warning line (trainer/sft.py)


def sft_records(view: RunView) -> list[dict]:
    return [r for r in view.records if r.get("phase") == "sft"]


def is_sft_run(view: RunView) -> bool:
    return bool(sft_records(view)) and not view.train


def check_sft(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """An SFT run: its loss and held-out accuracy (info), a loss that did not fall (warning: the
    learning rate, or answers the model cannot fit), and an accuracy too low (or too high) for GRPO
    to find signal at the configured rollout.n (warning)."""
    records = sft_records(view)
    if not is_sft_run(view):
        return []
    losses = [float(r["sft/loss"]) for r in records if isinstance(r.get("sft/loss"), int | float)]
    summary = read_json_file(view.run_dir / "summary.json") or {}
    by_step = summary.get("accuracy_by_step") or {}
    curve = ", ".join(f"{float(a):.1%} at step {s}" for s, a in by_step.items())
    evidence = (
        [f"sft/loss {losses[0]:.3f} at step 1 → {losses[-1]:.3f} at step {len(losses)}"] if losses else []
    )
    if curve:
        stop = (
            "stopped on a plateau (sft.stop_on_plateau)"
            if summary.get("stopped_on_plateau")
            else "ran every step"
        )
        evidence.append(f"held-out accuracy: {curve}; {stop}")
    findings = [Finding("info", CONFIG, "an SFT run", evidence, key="sft")]
    third = max(1, len(losses) // 3)
    if len(losses) >= 6 and _mean(losses[-third:]) > LOSS_FALL * _mean(losses[:third]):
        findings.append(
            Finding(
                "warning", CONFIG, "the SFT loss did not fall",
                [f"mean sft/loss {_mean(losses[:third]):.3f} over the first third, "
                 f"{_mean(losses[-third:]):.3f} over the last"],
                "check sft.lr (a random-init model wants ~1e-3, a pretrained one ~1e-5) and that "
                "sft.max_tokens holds the reference answers",
                key="sft_loss_flat",
            )
        )  # fmt: skip
    accuracy, n = summary.get("accuracy_after"), int(view.setting("rollout.n") or 1)
    if isinstance(accuracy, int | float) and accuracy == accuracy:  # not NaN (no validation files)
        share = 1.0 - accuracy**n - (1.0 - accuracy) ** n
        low = accuracy < 0.5  # the share is symmetric: nearly all right leaves as few groups as all wrong
        if share < LOW_SIGNAL_SHARE:
            findings.append(
                Finding(
                    "warning", CONFIG,
                    f"held-out accuracy too {'low' if low else 'high'} for GRPO to find signal",
                    [f"accuracy {accuracy:.1%} after {summary.get('steps')} steps: with rollout.n={n} "
                     f"about {share:.0%} of groups would have any reward difference (1 − pⁿ − (1 − p)ⁿ)"],
                    "train SFT longer (sft.total_steps, or sft.test_freq with sft.stop_on_plateau), grow the "
                    "model, or raise rollout.n before stratarl train"
                    if low
                    else "most groups would be all right: GRPO has little left to learn on these prompts "
                    "(harder prompts, or raise rollout.n); more SFT makes it fewer",
                    key="sft_accuracy_low" if low else "sft_accuracy_high",
                )
            )  # fmt: skip
    return findings
