"""Cross-cutting: where a run's metrics go besides metrics.jsonl — TensorBoard and Weights & Biases.

`trainer.logger` names the sinks. metrics.jsonl is the run's own record (resume cuts it back, the
summary, the plots and the doctor read it), so it is always written; the sinks here mirror it,
keyed by the same global step, validation metrics included (under their own `val-*` names), and
receive the run's curves at the end. W&B runs offline only: an `offline-run-*` directory under
<run_dir>/wandb that `wandb sync` uploads later; nothing here touches the network.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

SINK_NAMES = ("tensorboard", "wandb")  # console and jsonl are RunLog's own


def metric_tag(name: str, phase: str) -> str:
    """The tag a metric is logged under: train and validation names as they are (verl's `val-core/…`
    names are already distinct), any other phase under its own prefix (`sft/loss`)."""
    if phase in ("train", "val") or name.startswith(f"{phase}/"):
        return name
    return f"{phase}/{name}"


class MetricSink(Protocol):
    def log(self, step: int, metrics: Mapping[str, float], phase: str) -> None: ...

    def log_image(self, tag: str, png_path: Path, step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """Event files under <run_dir>/tensorboard (`tensorboard --logdir <run_dir>/tensorboard`).

    resumed_after: the step a resume continues after; events of later steps written before the
    interruption are purged when TensorBoard reads the directory, so the curves show one lineage.
    """

    def __init__(self, run_dir: Path, *, resumed_after: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        purge = None if resumed_after is None else resumed_after + 1
        self.log_dir = run_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge)

    def log(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        for name, value in metrics.items():
            if isinstance(value, int | float):
                self.writer.add_scalar(metric_tag(name, phase), float(value), global_step=step)
        self.writer.flush()

    def log_image(self, tag: str, png_path: Path, step: int) -> None:
        import matplotlib.image

        image = matplotlib.image.imread(str(png_path))  # [H, W, C] floats in [0, 1]
        self.writer.add_image(tag, image[..., :3], global_step=step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """One offline W&B run under <run_dir>/wandb, named after the experiment and grouped by it (a
    resumed run starts a new offline run in the same group, whose steps continue the old ones)."""

    def __init__(self, run_dir: Path, *, project: str, experiment: str, config: Mapping[str, Any]):
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self.run = wandb.init(
            mode="offline",
            dir=str(run_dir),
            project=project,
            name=experiment,
            group=experiment,
            config=dict(config),
            settings=wandb.Settings(console="off", x_disable_stats=True),
            reinit="create_new",
        )

    def log(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        scalars = {metric_tag(k, phase): float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        self.run.log(scalars, step=step)

    def log_image(self, tag: str, png_path: Path, step: int) -> None:
        import wandb

        self.run.log({tag: wandb.Image(str(png_path))}, step=step)

    def close(self) -> None:
        self.run.finish()


def make_sinks(
    names: Sequence[str],
    run_dir: str | Path,
    *,
    project: str,
    experiment: str,
    config: Mapping[str, Any],
    resumed_after: int | None = None,
) -> list[MetricSink]:
    """The sinks `trainer.logger` names (console and jsonl are not sinks: RunLog writes them)."""
    run_dir = Path(run_dir)
    sinks: list[MetricSink] = []
    if "tensorboard" in names:
        sinks.append(TensorBoardSink(run_dir, resumed_after=resumed_after))
    if "wandb" in names:
        sinks.append(WandbSink(run_dir, project=project, experiment=experiment, config=config))
    return sinks
