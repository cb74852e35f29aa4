"""Layer 5, training engine: the `Actor` (the policy being trained) and the frozen `Reference`.

The engine knows no RL algorithm. `Actor.update` receives a batch and a `loss_fn` (built by the
trainer from `algo/`) and does the mechanics: mini-batches, micro-batches with gradient
accumulation, gradient clipping, the optimizer and LR schedule. Accumulation is normalised
globally: the loss_fn receives the token and sequence totals of the whole mini-batch, so the
micro-batch losses add up to the mini-batch loss and a k-way split gives the same gradient as one
pass (tests/engine/test_actor.py checks it).
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from stratarl.engine.forward import ResponseScores, score_responses, score_responses_no_grad
from stratarl.engine.optim import build_lr_schedule, build_optimizer
from stratarl.transport.data_proto import DataProto

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


@dataclass(frozen=True)
class BatchTotals:
    """Totals of the mini-batch a micro-batch belongs to: the global normalisers of `aggregate_loss`."""

    num_tokens: int  # Σ response_mask over the mini-batch (all ranks)
    num_sequences: int  # rows of the mini-batch with at least one response token
    dp_size: int = 1


class LossFn(Protocol):
    """(micro-batch loss, metrics). The loss is normalised by the mini-batch `totals`, and each metric
    is the micro-batch's share of the mini-batch value: the engine adds both up over micro-batches."""

    def __call__(
        self, micro: DataProto, scores: ResponseScores, totals: BatchTotals
    ) -> tuple[Tensor, dict[str, float]]: ...


def _score(model: nn.Module, batch: DataProto, temperature: float, with_entropy: bool, grad: bool):
    scorer = score_responses if grad else score_responses_no_grad
    return scorer(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        batch["position_ids"],
        batch["responses"].shape[1],
        temperature=temperature,
        with_entropy=with_entropy,
    )


def compute_log_probs(
    model: nn.Module,
    batch: DataProto,
    *,
    micro_batch_size: int,
    temperature: float,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """[N, T] log-probs (and entropies) of the responses, in micro-batches, without gradients."""
    was_training = model.training
    model.eval()
    log_probs, entropies = [], []
    for micro in batch.select(list(MODEL_INPUTS)).split(micro_batch_size):
        scores = _score(model, micro, temperature, with_entropy, grad=False)
        log_probs.append(scores.log_prob)
        entropies.append(scores.entropy)
    model.train(was_training)
    mask = batch["response_mask"].to(torch.float32)
    log_prob = torch.cat(log_probs) * mask  # padding positions hold 0, not garbage
    entropy = torch.cat(entropies) * mask if with_entropy else None
    return log_prob, entropy


class Reference:
    """A frozen copy of a policy: log π_ref for KL terms. Holds no optimizer and never trains."""

    def __init__(self, model: nn.Module, *, micro_batch_size: int, temperature: float = 1.0):
        self.model = model.eval().requires_grad_(False)
        self.micro_batch_size = micro_batch_size
        self.temperature = temperature

    @classmethod
    def copy_of(cls, model: nn.Module, **kwargs) -> Reference:
        return cls(copy.deepcopy(model), **kwargs)

    def compute_log_prob(self, batch: DataProto) -> Tensor:
        log_prob, _ = compute_log_probs(
            self.model, batch, micro_batch_size=self.micro_batch_size, temperature=self.temperature
        )
        return log_prob


class Actor:
    """The trained policy: scores responses and applies updates from a loss_fn."""

    def __init__(
        self,
        model: nn.Module,
        *,
        lr: float,
        micro_batch_size: int,
        temperature: float = 1.0,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        grad_clip: float = 1.0,
        lr_schedule: str = "constant",
        warmup_steps: int = 0,
        total_steps: int = 1,
        min_lr_ratio: float = 0.0,
    ):
        self.model = model
        self.micro_batch_size = micro_batch_size
        self.temperature = temperature
        self.grad_clip = grad_clip
        self.optimizer = build_optimizer(model.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)
        self.lr_schedule = build_lr_schedule(
            self.optimizer,
            schedule=lr_schedule,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            min_lr_ratio=min_lr_ratio,
        )
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite gradient norm

    def compute_log_prob(
        self, batch: DataProto, *, with_entropy: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        return compute_log_probs(
            self.model,
            batch,
            micro_batch_size=self.micro_batch_size,
            temperature=self.temperature,
            with_entropy=with_entropy,
        )

    def update(
        self,
        batch: DataProto,
        loss_fn: LossFn,
        *,
        mini_batch_size: int,
        epochs: int = 1,
        shuffle_seed: int | None = None,
        with_entropy: bool = False,
    ) -> dict[str, float]:
        """One training step: `epochs` passes over mini-batches of `mini_batch_size` rows, one optimizer
        step per mini-batch, then one LR-schedule step. Returns metrics summed over micro-batches
        (loss_fn's shares) and averaged over optimizer steps, plus `lr` and the skipped-step count."""
        self.model.train()
        collected: dict[str, list[float]] = defaultdict(list)
        for mini in batch.make_iterator(mini_batch_size, epochs=epochs, seed=shuffle_seed):
            for name, value in self._optimizer_step(mini, loss_fn, with_entropy).items():
                collected[name].append(value)
        metrics = {name: sum(values) / len(values) for name, values in collected.items()}
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        metrics["skipped_steps"] = float(self.skipped_steps)
        self.lr_schedule.step()
        return metrics

    def _optimizer_step(self, mini: DataProto, loss_fn: LossFn, with_entropy: bool) -> dict[str, float]:
        mask = mini["response_mask"]
        totals = BatchTotals(num_tokens=int(mask.sum()), num_sequences=int((mask.sum(-1) > 0).sum()))
        self.optimizer.zero_grad(set_to_none=True)
        micro_metrics: dict[str, list[float]] = defaultdict(list)
        for micro in mini.split(self.micro_batch_size):
            scores = _score(self.model, micro, self.temperature, with_entropy, grad=True)
            loss, metrics = loss_fn(micro, scores, totals)
            loss.backward()  # micro losses are globally normalised: their sum is the mini-batch loss
            for name, value in metrics.items():
                micro_metrics[name].append(float(value))
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            self.skipped_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
        out = {name: sum(values) for name, values in micro_metrics.items()}
        out["grad_norm"] = grad_norm
        return out

    def export_weights(self) -> dict[str, Tensor]:
        """The full state dict, for the rollout engine's `load_weights` and for saving."""
        return {name: tensor.detach() for name, tensor in self.model.state_dict().items()}
