"""Layer 2, control flow: the metrics one RL step logs, gathered from its phases.

Each phase's metrics are added under the phase's name (`StepMetrics.add`); two phases writing one
name is a bug and fails loudly, naming both, instead of the later one silently winning. The trace's
diagnostics fill only names no phase wrote (`add_missing`: e.g. bypass mode's loss computes its own
`rollout_corr/*`); the one name the whole batch supersedes is said where it does (`replace`:
`actor/entropy`, the batch's under π_old rather than the update's mini-batch mean). `finish` then
adds what only the whole batch knows: verl's batch statistics (`observe.data_metrics`), the actor's
entropy, the critic's explained variance, the share of groups
with reward signal (warned about below 10 %), timing and throughput, and the bytes that crossed
process boundaries through the controller.
"""

from __future__ import annotations

from rich.console import Console

from stratarl.algo.aggregation import aggregate_loss
from stratarl.algo.groups import group_ids_from_uids
from stratarl.algo.value_loss import explained_variance
from stratarl.observe.data_metrics import data_metrics, group_signal_share, throughput_metrics
from stratarl.observe.timing import timing_metrics
from stratarl.trainer.step_settings import StepSettings
from stratarl.transport.data_proto import DataProto

LOW_SIGNAL_SHARE = 0.1  # warn when fewer groups than this carry any reward variance


class MetricClash(RuntimeError):
    """Two phases of a step wrote a metric of the same name."""


class StepMetrics:
    """The step's metrics, each name written by one phase."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.writer: dict[str, str] = {}  # name -> the phase that wrote it

    def add(self, phase: str, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            if name in self.writer and self.writer[name] != phase:
                raise MetricClash(f"metric {name!r} is written by both {self.writer[name]!r} and {phase!r}")
            self.values[name], self.writer[name] = value, phase

    def replace(self, phase: str, metrics: dict[str, float]) -> None:
        """Names a phase wrote that the whole batch's value supersedes (said at the call)."""
        for name, value in metrics.items():
            self.values[name], self.writer[name] = value, phase

    def add_missing(self, metrics: dict[str, float]) -> None:
        """Diagnostics a phase may have computed itself: only the names no phase wrote."""
        for name, value in metrics.items():
            if name not in self.values:
                self.values[name], self.writer[name] = value, "diagnostics"

    def finish(
        self,
        step: int,
        batch: DataProto,
        timings: dict[str, float],
        settings: StepSettings,
        *,
        traffic: dict[str, float],
        console: Console | None = None,
    ) -> dict[str, float]:
        """The step's metrics with the whole batch's statistics, timing and controller traffic."""
        mask = batch["response_mask"]
        self.add("step", {"training/global_step": float(step)})
        self.add("batch", data_metrics(batch, max_prompt_tokens=settings.max_prompt_tokens))
        if "entropys" in batch:  # bypass mode runs no actor forward before the update
            # verl's actor/entropy: the whole batch's under π_old, over the update's mini-batch mean
            entropy = aggregate_loss(batch["entropys"], mask, settings.loss_agg_mode).item()
            self.replace("batch", {"actor/entropy": entropy})
        if "values" in batch:
            self.add(
                "batch",
                {"critic/vf_explained_var": explained_variance(batch["returns"], batch["values"], mask)},
            )
        share = group_signal_share(batch["token_level_scores"].sum(-1), group_ids_from_uids(batch["uid"]))
        self.add("batch", {"batch/groups_with_signal": share})
        if share < LOW_SIGNAL_SHARE and console is not None:
            console.print(
                f"[yellow]warning: only {share:.0%} of groups have any reward variance; group-relative "
                "advantages are 0 for the rest, so the policy barely moves (reward too sparse or too easy?)"
            )
        self.add("timing", timing_metrics(timings, int(mask.sum()), int(batch["attention_mask"].sum())))
        self.add("timing", throughput_metrics(batch, timings["step"]))
        self.add("traffic", traffic)
        return dict(self.values)
