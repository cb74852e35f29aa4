"""Cross-cutting: PNG pictures of a run from its metrics.jsonl records.

`plot_learning_curves` is the run's one-glance curve (training reward and validation accuracy,
`curves.png`). `plot_run` writes one picture per question a debugging user asks, under
<run_dir>/plots: reward and accuracy, KL, entropy, response length and clipping, the phase time
breakdown of each step, and staleness with the rollout/training log-prob mismatch. The end of every
run writes them; `stratarl plot RUN` writes them for any run, finished or live. An SFT run gets
`plot_sft` (its loss and held-out accuracy) instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on training machines
import matplotlib.pyplot as plt

Records = Sequence[dict[str, Any]]


def plot_learning_curves(
    records: Records,
    out_path: str | Path,
    *,
    train_key: str = "critic/score/mean",
    val_prefix: str = "val-core/",
) -> Path:
    """Training `train_key` over steps and every `val-core/...` metric over steps, one figure."""
    fig, ax = plt.subplots(figsize=(7, 4))
    train = _series(records, train_key)
    if train:
        ax.plot(*zip(*train, strict=True), label=f"train {train_key}", alpha=0.8)
    for key in _keys(records, val_prefix, phase="val"):
        ax.plot(*zip(*_series(records, key, phase="val"), strict=True), marker="o", label=key)
    ax.set_xlabel("training step")
    ax.set_ylabel("reward / accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def _series(records: Records, key: str, phase: str = "train") -> list[tuple[int, float]]:
    return [
        (r["step"], float(r[key]))
        for r in records
        if r.get("phase") == phase and isinstance(r.get(key), int | float)
    ]


def _keys(records: Records, prefix: str, phase: str = "train") -> list[str]:
    return sorted({k for r in records if r.get("phase") == phase for k in r if k.startswith(prefix)})


def _curves(ax: Any, records: Records, keys: Sequence[str], *, phase: str = "train", marker: str = "") -> int:
    """Plot each key that has values; returns how many were drawn."""
    drawn = 0
    for key in keys:
        points = _series(records, key, phase)
        if points:
            ax.plot(*zip(*points, strict=True), marker=marker, label=key, alpha=0.85)
            drawn += 1
    return drawn


def _finish(fig: Any, axes: Sequence[Any], out_path: Path, title: str) -> Path:
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not recorded in this run", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def plot_reward(records: Records, out_path: Path) -> Path:
    fig, (train, val) = plt.subplots(1, 2, figsize=(11, 4))
    _curves(train, records, ["critic/score/mean", "critic/score/max", "critic/score/min", "reward/acc/mean"])
    _curves(train, records, ["batch/groups_with_signal"])
    train.set_title("training reward (per step)")
    _curves(val, records, _keys(records, "val-core/", phase="val"), phase="val", marker="o")
    val.set_title("validation accuracy")
    return _finish(fig, (train, val), out_path, "reward and accuracy")


def plot_kl(records: Records, out_path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    keys = [
        "actor/ppo_kl",
        "actor/kl_loss",
        "actor/reward_kl_penalty",
        "rollout_corr/kl",
        "rollout_corr/k3_kl",
    ]
    _curves(ax, records, keys)
    ax.set_title("KL: update (ppo_kl), to the reference, rollout vs training")
    return _finish(fig, [ax], out_path, "KL")


def plot_entropy(records: Records, out_path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    _curves(ax, records, ["actor/entropy"])
    ax.set_ylabel("nats per action token")
    return _finish(fig, [ax], out_path, "policy entropy")


def plot_lengths(records: Records, out_path: Path) -> Path:
    fig, (lengths, shares) = plt.subplots(1, 2, figsize=(11, 4))
    _curves(lengths, records, ["response_length/mean", "response_length/max", "response_length/min"])
    lengths.set_ylabel("tokens")
    lengths.set_title("response length")
    _curves(shares, records, ["response_length/clip_ratio", "actor/pg_clipfrac", "actor/pg_clipfrac_lower"])
    shares.set_ylabel("share")
    shares.set_title("responses at the length cap; tokens clipped by PPO")
    return _finish(fig, (lengths, shares), out_path, "response length and clipping")


def plot_phase_times(records: Records, out_path: Path) -> Path:
    """Stacked seconds per phase of every step, and the time of the step outside any phase."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    train = [r for r in records if r.get("phase") == "train" and "timing_s/step" in r]
    phases = [k for k in _keys(records, "timing_s/") if k != "timing_s/step"]
    steps = [r["step"] for r in train]
    bottom = [0.0] * len(train)
    for key in phases:
        values = [float(r.get(key, 0.0)) for r in train]
        ax.bar(steps, values, bottom=bottom, label=key.removeprefix("timing_s/"), width=0.8)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    idle = [max(0.0, float(r["timing_s/step"]) - b) for r, b in zip(train, bottom, strict=True)]
    if train:
        ax.bar(steps, idle, bottom=bottom, label="outside phases", width=0.8, color="lightgrey")
    ax.set_ylabel("seconds")
    return _finish(fig, [ax], out_path, "where each step's time goes")


def plot_staleness(records: Records, out_path: Path) -> Path:
    fig, (stale, mismatch) = plt.subplots(1, 2, figsize=(11, 4))
    _curves(stale, records, ["rollout/staleness/mean", "rollout/staleness/max"])
    stale.set_ylabel("weight versions")
    stale.set_title("staleness: trained version − generating version")
    _curves(mismatch, records, ["rollout_corr/log_ppl_abs_diff", "rollout_corr/kl"])
    mismatch.set_title("rollout vs training log-probs")
    return _finish(fig, (stale, mismatch), out_path, "staleness and log-prob mismatch")


PLOTS = {
    "reward_accuracy.png": plot_reward,
    "kl.png": plot_kl,
    "entropy.png": plot_entropy,
    "response_length_clip.png": plot_lengths,
    "phase_times.png": plot_phase_times,
    "staleness.png": plot_staleness,
}


def plot_sft(records: Records, out_path: str | Path) -> Path:
    """An SFT run (`stratarl sft`): the NLL per step, and held-out accuracy at each evaluation (step 0
    is the model before training)."""
    fig, (loss, val) = plt.subplots(1, 2, figsize=(11, 4))
    _curves(loss, records, ["sft/loss"], phase="sft")
    loss.set_title("SFT loss (token-mean NLL of the reference answer)")
    _curves(val, records, _keys(records, "val-core/", phase="val"), phase="val", marker="o")
    val.set_title("held-out accuracy")
    return _finish(fig, (loss, val), Path(out_path), "supervised fine-tuning")


def is_sft_run(records: Records) -> bool:
    return any(r.get("phase") == "sft" for r in records)


def plot_run(records: Records, out_dir: str | Path) -> list[Path]:
    """Every picture of `PLOTS` into `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [plot(records, out_dir / name) for name, plot in PLOTS.items()]


def plot_run_dir(run: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """`stratarl plot RUN`: curves.png and every picture of `PLOTS` for a run directory (its own
    plots/ folder unless `out_dir`)."""
    from stratarl.observe.run_records import read_metrics_tolerant, resolve_run_dir

    run_dir = resolve_run_dir(run)
    records = read_metrics_tolerant(run_dir / "metrics.jsonl")
    out = Path(out_dir) if out_dir else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    if is_sft_run(records):
        return [plot_sft(records, out / "curves.png"), plot_sft(records, out / "sft.png")]
    return [plot_learning_curves(records, out / "curves.png"), *plot_run(records, out)]
