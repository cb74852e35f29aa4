"""Layer 2, control flow: the metrics one RL step logs, merged from its phases' own.

`step_metrics` joins the phases' metric dicts (earlier parts win on equal names: the phases'
own, e.g. bypass mode's `rollout_corr/*`, over the trace's), then adds what only the whole batch
knows: verl's batch statistics (`observe.data_metrics`), the actor's entropy, the critic's explained
variance, the share of groups with reward signal (warned about below 10 %), timing and throughput,
and the bytes that crossed process boundaries through the controller.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console

from stratarl.algo.aggregation import aggregate_loss
from stratarl.algo.groups import group_ids_from_uids
from stratarl.algo.value_loss import explained_variance
from stratarl.cluster.handles import CriticHandle, PolicyHandle
from stratarl.config import RunConfig
from stratarl.observe.data_metrics import data_metrics, group_signal_share, throughput_metrics
from stratarl.observe.timing import timing_metrics
from stratarl.transport.data_proto import DataProto

LOW_SIGNAL_SHARE = 0.1  # warn when fewer groups than this carry any reward variance


def step_metrics(
    step: int,
    batch: DataProto,
    timings: dict[str, float],
    parts: Sequence[dict[str, float]],
    *,
    cfg: RunConfig,
    worker: PolicyHandle,
    critic: CriticHandle | None,
    console: Console,
) -> dict[str, float]:
    mask = batch["response_mask"]
    metrics: dict[str, float] = {"training/global_step": float(step)}
    for part in parts:
        metrics |= part
    metrics |= data_metrics(batch, max_prompt_tokens=cfg.data.max_prompt_tokens)
    if "entropys" in batch:  # bypass mode runs no actor forward before the update
        metrics["actor/entropy"] = aggregate_loss(batch["entropys"], mask, cfg.actor.loss_agg_mode).item()
    if "values" in batch:
        metrics["critic/vf_explained_var"] = explained_variance(batch["returns"], batch["values"], mask)
    share = group_signal_share(batch["token_level_scores"].sum(-1), group_ids_from_uids(batch["uid"]))
    metrics["batch/groups_with_signal"] = share
    if share < LOW_SIGNAL_SHARE:
        console.print(
            f"[yellow]warning: only {share:.0%} of groups have any reward variance; group-relative "
            "advantages are 0 for the rest, so the policy barely moves (reward too sparse or too easy?)"
        )
    metrics |= timing_metrics(timings, int(mask.sum()), int(batch["attention_mask"].sum()))
    metrics |= throughput_metrics(batch, timings["step"])
    traffic = worker.controller_bytes()  # what crossed process boundaries via the controller
    if critic is not None:  # the critic's ranks are processes too
        critic_traffic = critic.controller_bytes()
        traffic = {key: value + critic_traffic.get(key, 0.0) for key, value in traffic.items()}
    return metrics | traffic
