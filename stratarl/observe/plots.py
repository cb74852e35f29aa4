"""Cross-cutting: the PNG of a run's learning curves (training reward and validation accuracy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on training machines
import matplotlib.pyplot as plt


def plot_learning_curves(
    records: Sequence[dict[str, Any]],
    out_path: str | Path,
    *,
    train_key: str = "critic/score/mean",
    val_prefix: str = "val-core/",
) -> Path:
    """Training `train_key` over steps and every `val-core/...` metric over steps, one figure."""
    fig, ax = plt.subplots(figsize=(7, 4))
    train = [(r["step"], r[train_key]) for r in records if r.get("phase") == "train" and train_key in r]
    if train:
        ax.plot(*zip(*train, strict=True), label=f"train {train_key}", alpha=0.8)
    val_keys = sorted({k for r in records if r.get("phase") == "val" for k in r if k.startswith(val_prefix)})
    for key in val_keys:
        points = [(r["step"], r[key]) for r in records if r.get("phase") == "val" and key in r]
        ax.plot(*zip(*points, strict=True), marker="o", label=key)
    ax.set_xlabel("training step")
    ax.set_ylabel("reward / accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
