"""Layer 5, training engine: the update mechanics shared by the trained roles (actor, critic).

The engine knows no RL algorithm. `update` receives a batch and a `loss_fn` (built by the trainer
from `algo/`) and does the mechanics: mini-batches, micro-batches with gradient accumulation,
gradient clipping, the optimizer and LR schedule, data-parallel reductions, MFU and memory metrics.

Accumulation is normalised globally: the loss_fn receives the token and sequence totals of the
whole mini-batch over all ranks (`BatchTotals`), so the micro-batch losses add up to the mini-batch
loss, a k-way micro-batch split gives the gradient of one pass, and — FSDP2 averaging gradients
over D ranks, the losses carrying the factor D — D ranks give the gradient of one rank.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from stratarl.engine.data_parallel import DTYPES, DataParallel, clip_grad_norm
from stratarl.engine.micro_batches import MicroBatching, model_device, model_inputs, plan_micro_batches
from stratarl.engine.offload import move_optimizer_state
from stratarl.engine.optim import build_lr_schedule, build_optimizer
from stratarl.engine.packing import ModelInputs, padding_share
from stratarl.engine.perf import ModelFlops, default_peak_flops, memory_metrics, mfu
from stratarl.engine.requests import UpdateRequest
from stratarl.transport.data_proto import DataProto
from stratarl.transport.fields import ROW_ID


@dataclass(frozen=True)
class BatchTotals:
    """Totals of the mini-batch a micro-batch belongs to: the global normalisers of `aggregate_loss`."""

    num_tokens: int  # Σ response_mask over the mini-batch (all ranks)
    num_sequences: int  # rows of the mini-batch with at least one response token (all ranks)
    dp_size: int = 1


class LossFn(Protocol):
    """(micro-batch loss, metrics) from the micro-batch, its scores (`ResponseScores` for the actor,
    `ValueScores` for the critic) and the mini-batch `totals`.

    The loss is normalised by the global totals and multiplied by totals.dp_size (as
    `aggregate_loss(..., dp_size=D, global_num_tokens=...)` does). The engine sums each metric over a
    rank's micro-batches and averages it over ranks, so a metric is the micro-batch's share of the
    mini-batch value times dp_size (e.g. value · local_tokens · D / num_tokens); with D = 1 a share.

    When the batch carries a `row_id` column (the trainer is tracing), the engine also calls
    `loss_fn.row_statistics(micro, scores)` -> {name: [m] tensor} after each micro-batch's backward,
    one value per row, including `tokens` (rows with 0 tokens are zero-weight pad rows, dropped)."""

    def __call__(
        self, micro: DataProto, scores: Any, totals: BatchTotals
    ) -> tuple[Tensor, dict[str, float]]: ...


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW and its LR schedule (optim.py), and the gradient-norm clip."""

    lr: float
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1
    min_lr_ratio: float = 0.0
    adamw_impl: str = "auto"  # optim.ADAMW_IMPLS: which kernel computes the AdamW step


class TrainingEngine:
    """A scorer module under training. Subclasses define `_forward` (what the loss_fn scores) and
    `role` (the metric suffix of perf/mfu/<role>)."""

    role = "model"

    def __init__(
        self,
        module: nn.Module,
        *,
        optim: OptimizerSettings,
        batching: MicroBatching,
        dp: DataParallel,
        flops: ModelFlops | None = None,
        peak_flops: float | None = None,
    ):
        self.module = module  # the root: already sharded when dp has a mesh
        self.batching = batching
        self.dp = dp
        self.grad_clip = optim.grad_clip
        self.optimizer = build_optimizer(
            module.parameters(),
            lr=optim.lr,
            weight_decay=optim.weight_decay,
            betas=optim.betas,
            adamw_impl=optim.adamw_impl,
        )
        self.lr_schedule = build_lr_schedule(
            self.optimizer,
            schedule=optim.lr_schedule,
            warmup_steps=optim.warmup_steps,
            total_steps=optim.total_steps,
            min_lr_ratio=optim.min_lr_ratio,
        )
        self.flops = flops
        self.peak_flops = peak_flops
        self.device = dp.compute_device(module)  # micro-batches and the loss's columns go there
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite gradient norm
        # Per-row statistics of the last update ({} unless its batch had `row_id`): `row_id` [R] and
        # one [R] tensor per statistic, each row's last pass (its latest epoch).
        self.last_row_statistics: dict[str, Tensor] = {}

    def _forward(self, inputs: ModelInputs, *, with_entropy: bool) -> Any:
        raise NotImplementedError

    def _zero_weight_pass(self, scores: Any) -> Tensor:
        """A loss of exactly 0 that still runs the backward (and its collectives)."""
        raise NotImplementedError

    @property
    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def update(self, batch: DataProto, loss_fn: LossFn, request: UpdateRequest) -> dict[str, float]:
        """One training step: `request.epochs` passes over mini-batches of `request.mini_batch_size`
        rows (this rank's), one optimizer step per mini-batch, then one LR-schedule step. Returns
        metrics summed over micro-batches, averaged over optimizer steps and ranks, plus grad_norm,
        lr, skipped_steps and perf/* (MFU, padding share computed, memory)."""
        self._check_equal_shards(len(batch))
        self.module.train()
        start = time.perf_counter()
        collected: dict[str, list[float]] = defaultdict(list)
        work = {"flops": 0.0, "computed": 0, "real": 0}
        row_stats: list[dict[str, Tensor]] = []  # per-row statistics of each micro-batch, in order
        r = request
        for mini in batch.make_iterator(r.mini_batch_size, epochs=r.epochs, seed=r.shuffle_seed):
            for name, value in self._optimizer_step(mini, loss_fn, r, work, row_stats).items():
                collected[name].append(value)
        self.last_row_statistics = latest_per_row(row_stats)
        metrics = self.dp.mean({name: sum(values) / len(values) for name, values in collected.items()})
        elapsed = time.perf_counter() - start
        metrics |= self._perf_metrics(work, elapsed)
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        metrics["skipped_steps"] = float(self.skipped_steps)
        self.lr_schedule.step()
        return metrics

    def _check_equal_shards(self, rows: int) -> None:
        low, high = self.dp.reduce([rows, -rows], "min")
        if low != -high:
            raise ValueError(f"data-parallel ranks hold {int(low)}..{int(-high)} rows; they must be equal")

    def _optimizer_step(
        self,
        mini: DataProto,
        loss_fn: LossFn,
        request: UpdateRequest,
        work: dict[str, float],
        row_stats: list[dict[str, Tensor]],
    ) -> dict[str, float]:
        mask = mini["response_mask"]
        num_tokens, num_seqs = self.dp.reduce([mask.sum(), (mask.sum(-1) > 0).sum()], "sum")
        totals = BatchTotals(num_tokens=int(num_tokens), num_sequences=int(num_seqs), dp_size=self.dp.size)
        self.optimizer.zero_grad(set_to_none=True)
        micro_metrics: dict[str, float] = defaultdict(float)
        for group in plan_micro_batches(mini, self.batching, self.dp):
            inputs = model_inputs(mini, group or [0], self.batching.layout, self.device)
            if request.score_at_ids is not None:
                inputs = _scoring_at_ids(inputs, mini[request.score_at_ids], group or [0])
            scores = self._forward(inputs, with_entropy=request.with_entropy)
            if not group:
                self._zero_weight_pass(scores).backward()
                continue
            micro = mini.take(group)
            if micro["response_mask"].device != self.device:
                micro = micro.to(self.device)
            loss, metrics = loss_fn(micro, scores, totals)
            loss.backward()  # micro losses are globally normalised: their sum is the mini-batch loss
            for name, value in metrics.items():
                micro_metrics[name] += float(value)
            if ROW_ID in micro.columns:  # tracing: this pass's statistics of each row
                row_stats.append({ROW_ID: micro[ROW_ID], **loss_fn.row_statistics(micro, scores)})
            self._count_work(inputs, work)
        grad_norm = clip_grad_norm(self.trainable_parameters, self.grad_clip)
        if math.isfinite(grad_norm):  # the norm is global, so every rank takes the same branch
            self.optimizer.step()
        else:
            self.skipped_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
        return {**micro_metrics, "grad_norm": grad_norm}

    def _count_work(self, inputs: ModelInputs, work: dict[str, float]) -> None:
        work["computed"] += inputs.computed_tokens
        work["real"] += inputs.real_tokens
        if self.flops is not None:
            seq_lens = inputs.sequence_lengths.tolist()
            work["flops"] += self.flops.train_flops(seq_lens, scored_tokens=int(inputs.labels.numel()))

    def _perf_metrics(self, work: dict[str, float], seconds: float) -> dict[str, float]:
        share = padding_share(int(work["computed"]), int(work["real"]))
        local = {f"perf/padding_share/{self.role}": share}
        if self.flops is not None:
            peak = self.peak_flops or default_peak_flops(_compute_dtype(self.module, self.dp), self.device)
            local[f"perf/mfu/{self.role}"] = mfu(work["flops"], seconds, peak)
        return self.dp.mean(local) | memory_metrics(self.device)

    # --- the colocated memory hand-off (engine.offload) ------------------------------------------
    def offload_optimizer(self) -> int:
        """The optimizer state into CPU memory until the next update; the bytes moved (0 on CPU)."""
        return move_optimizer_state(self.optimizer, "cpu")

    def free_gradients(self) -> None:
        """Drop the last update's gradients (the next update starts from none anyway)."""
        self.optimizer.zero_grad(set_to_none=True)

    def reload_optimizer(self) -> int:
        """The optimizer state back beside the parameters it updates; the bytes moved."""
        return move_optimizer_state(self.optimizer, model_device(self.module))

    # --- checkpoints ---------------------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        """Full (unsharded) model, optimizer and schedule states; tensors on rank 0 only when sharded."""
        return {
            "model": self.dp.full_model_state(self.module),
            "optimizer": self.dp.full_optimizer_state(self.module, self.optimizer),
            "extra": {"lr_schedule": self.lr_schedule.state_dict(), "skipped_steps": self.skipped_steps},
        }

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore `checkpoint_state()`; with a mesh, rank 0's tensors are broadcast to the others."""
        self.dp.load_full_model_state(self.module, state["model"])
        self.dp.load_full_optimizer_state(self.module, self.optimizer, state["optimizer"])
        self.lr_schedule.load_state_dict(state["extra"]["lr_schedule"])
        self.skipped_steps = state["extra"]["skipped_steps"]


def _scoring_at_ids(inputs: ModelInputs, ids: Tensor, rows: list[int]) -> ModelInputs:
    """`inputs` that also score log π at `ids` [N, T, k] of the micro-batch's `rows`: [K, k] at the
    scored positions."""
    at = ids[torch.as_tensor(rows, dtype=torch.long)][inputs.rows.cpu(), inputs.cols.cpu()]  # [K, k]
    return replace(inputs, score_at_ids=at.to(inputs.labels.device))


def latest_per_row(parts: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The per-row statistics of micro-batches in update order as one table: rows without tokens
    (zero-weight pad rows) dropped, and each `row_id` once, with its last pass. {} for no parts."""
    if not parts:
        return {}
    table = {name: torch.cat([part[name].detach().cpu() for part in parts]) for name in parts[0]}
    latest: dict[int, int] = {}  # row id -> position of its last pass with tokens
    for position, (row, tokens) in enumerate(
        zip(table[ROW_ID].tolist(), table["tokens"].tolist(), strict=True)
    ):
        if tokens > 0:
            latest[int(row)] = position
    keep = torch.tensor(sorted(latest.values()), dtype=torch.long)
    return {name: values[keep] for name, values in table.items()}


def _compute_dtype(module: nn.Module, dp: DataParallel) -> torch.dtype:
    if dp.param_dtype:
        return DTYPES[dp.param_dtype]
    return next(module.parameters()).dtype


def block_class_names(model: nn.Module) -> Sequence[str]:
    """The classes FSDP2 shards one by one: HF's `_no_split_modules` (the decoder block)."""
    names = getattr(model, "_no_split_modules", None)
    if not names:
        raise ValueError(f"{type(model).__name__} declares no _no_split_modules; cannot choose FSDP units")
    return list(names)


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in the backward (non-reentrant torch.utils.checkpoint);
    `activation_checkpointing_enable` in transformers ≥ 5.2x, `gradient_checkpointing_enable` before."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
