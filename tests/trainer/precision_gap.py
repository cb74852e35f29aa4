"""The gap between the rollout's log-probs and the actor's on the same sampled tokens, for a precision
recipe on a device: what the tests of bf16 rollout on CPU and on CUDA (tests/gpu) bound."""

from __future__ import annotations

import dataclasses

import torch
from transformers import AutoTokenizer

from stratarl.assembly import roles
from stratarl.cluster.policy_worker import PolicyWorker
from tests.trainer.test_engine_settings import sampled_batch
from tests.trainer.test_rl_trainer import small_config


def rollout_training_gap(task, device: str, *overrides: str) -> dict[str, float]:
    """|rollout_log_probs − old_log_probs| over the response tokens of 8 sampled trajectories of the
    tiny task model on `device` ("cpu" or "cuda"), under config `overrides`: mean and max, in nats."""
    tokenizer = AutoTokenizer.from_pretrained(task["model"])
    spec = roles.policy_spec(small_config(task, *overrides), tokenizer, total_steps=1)
    worker = PolicyWorker(dataclasses.replace(spec, model=dataclasses.replace(spec.model, device=device)))
    batch = sampled_batch(worker, task, tokenizer)
    training = worker.compute_log_prob(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    gap = (training[mask] - batch["rollout_log_probs"][mask]).abs()
    return {"mean": float(gap.mean()), "max": float(gap.max()), "tokens": int(mask.sum())}


BF16 = ("rollout.dtype=bfloat16", "actor.fsdp.param_dtype=bfloat16")


def served_dtype(worker: PolicyWorker) -> torch.dtype:
    return next(worker.rollout.model.parameters()).dtype
