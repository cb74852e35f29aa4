"""Layer 3, orchestration: the colocated policy worker — actor, rollout and reference in one process.

A worker hosts roles; this one hosts the three that share the policy's weights, switching between
phases on the same device (verl's `ActorRolloutRefWorker`, as data rather than flags: the roles are
separate objects). The trainer calls it through these methods only; each body shows where the
batch goes. Issue-8 worker groups put several of these behind the same methods, one per rank.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from stratarl.engine.actor import Actor, LossFn, Reference
from stratarl.engine.checkpoint import CheckpointManager, LoadedCheckpoint
from stratarl.engine.lora import apply_lora, base_state, is_lora, strip_prefix
from stratarl.rollout.batch_layout import results_to_batch
from stratarl.rollout.interface import GenerationRequest, SamplingParams
from stratarl.rollout.torch_engine import TorchRolloutEngine
from stratarl.rollout.weight_sync import WeightLoadReport
from stratarl.transport.data_proto import DataProto

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_causal_lm(path: str | Path, dtype: str = "float32") -> torch.nn.Module:
    """Any local HF causal-LM directory."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {sorted(DTYPES)}")
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])


def lora_base_weights(actor: Actor) -> dict[str, torch.Tensor]:
    """The frozen base weights under a LoRA actor, plain HF names: the first sync to the rollout."""
    return base_state(strip_prefix(actor.dp.full_model_state(actor.module), "lm."))


def lora_reference_batching(reference_kwargs: dict | None) -> dict:
    """The reference.* settings a LoRA actor's base reference honours: its micro-batching. (It scores
    through the actor's module, so reference.logit_chunk_size does not apply.)"""
    keys = ("micro_batch_size", "max_tokens_per_micro_batch", "layout")
    return {k: v for k, v in (reference_kwargs or {}).items() if k in keys}


class PolicyWorker:
    """Actor + rollout engine (+ frozen reference) over one model directory."""

    def __init__(
        self,
        *,
        model_path: str | Path,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        actor_kwargs: dict,
        reference_kwargs: dict | None = None,
        lora: dict | None = None,
        dtype: str = "float32",
        rollout_dtype: str = "float32",
        with_reference: bool = False,
        rollout_seed: int = 0,
        max_num_seqs: int = 256,
    ):
        model = load_causal_lm(model_path, dtype)
        # The rollout engine serves its own copy, so a generation never sees half-updated weights and
        # may run in a lower precision than training. Copied before peft injects adapters in place.
        rollout_model = copy.deepcopy(model).to(DTYPES[rollout_dtype]).eval().requires_grad_(False)
        if lora:  # {rank, alpha, target_modules}: only the adapters train
            model = apply_lora(model, **lora)
        self.actor = Actor(model, **actor_kwargs)
        self.rollout = TorchRolloutEngine(
            rollout_model,
            eos_token_ids=list(eos_token_ids),
            pad_token_id=pad_token_id,
            seed=rollout_seed,
            max_num_seqs=max_num_seqs,
        )
        self.pad_token_id = pad_token_id
        self.reference = None
        if with_reference and lora:  # the base under the adapter: the actor's weights, no copy
            self.reference = Reference.base_of(self.actor, **lora_reference_batching(reference_kwargs))
        elif with_reference:
            settings = {"micro_batch_size": self.actor.micro_batch_size} | (reference_kwargs or {})
            self.reference = Reference.copy_of(model, temperature=self.actor.temperature, **settings)
        self._base_synced = False  # LoRA: the rollout holds the base weights after the first sync

    # --- rollout -------------------------------------------------------------------------------
    def generate(self, prompts: DataProto, sampling: SamplingParams, *, seed: int | None = None) -> DataProto:
        """One response per row of `prompts` (already repeated n times). Reads `raw_prompt_ids`;
        returns the batch-edge layout (DESIGN.md §5) plus `rollout_log_probs` and `weight_version`.
        With a seed, row i samples with seed + i: reproducible, and distinct across the n copies."""
        requests = [
            GenerationRequest(
                request_id=str(i),
                prompt_ids=list(ids),
                sampling=sampling if seed is None else dataclasses.replace(sampling, seed=seed + i),
            )
            for i, ids in enumerate(prompts["raw_prompt_ids"])
        ]
        results = self.rollout.generate(requests)
        columns = results_to_batch(
            results, pad_token_id=self.pad_token_id, max_response_len=sampling.max_tokens
        )
        tensors = {k: v for k, v in columns.items() if isinstance(v, torch.Tensor)}
        provenance = {name: np.array(columns[name], dtype=object) for name in ("finish_reason", "replica_id")}
        return DataProto.from_dict(tensors, provenance)

    def sync_weights(self, version: int | None = None) -> WeightLoadReport:
        """Push the actor's weights into the rollout engine as version + 1, and check they arrived.
        A LoRA actor sends its base weights and adapter the first time, then the adapter alone;
        the report's num_bytes counts what moved."""
        version = self.rollout.weight_version + 1 if version is None else version  # a resume sets it
        if not is_lora(self.actor.model):
            return self.rollout.load_weights(self.actor.export_weights(), version)
        base = None if self._base_synced else lora_base_weights(self.actor)
        report = self.rollout.load_adapter(self.actor.export_adapter(), version, base=base)
        self._base_synced = True
        return report

    @property
    def weight_version(self) -> int:
        return self.rollout.weight_version

    # --- actor / reference ---------------------------------------------------------------------
    def compute_log_prob(
        self, batch: DataProto, *, with_entropy: bool = False, with_sum_pi_squared: bool = False
    ) -> DataProto:
        """`old_log_probs` (+ `entropys`, + `sum_pi_squared` for the OTB estimators), one forward."""
        out = self.actor.score_responses(
            batch, with_entropy=with_entropy, with_sum_pi_squared=with_sum_pi_squared
        )
        names = {"log_prob": "old_log_probs", "entropy": "entropys", "sum_pi_squared": "sum_pi_squared"}
        return DataProto.from_dict({names[name]: column for name, column in out.items()})

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        if self.reference is None:
            raise RuntimeError("this worker was built without a reference model (with_reference=False)")
        return DataProto.from_dict({"ref_log_prob": self.reference.compute_log_prob(batch)})

    def update_actor(
        self,
        batch: DataProto,
        loss_fn: LossFn,
        *,
        mini_batch_size: int,
        epochs: int = 1,
        shuffle_seed: int | None = None,
        with_entropy: bool = False,
    ) -> dict[str, float]:
        return self.actor.update(
            batch,
            loss_fn,
            mini_batch_size=mini_batch_size,
            epochs=epochs,
            shuffle_seed=shuffle_seed,
            with_entropy=with_entropy,
        )

    def update_row_statistics(self) -> dict[str, torch.Tensor]:
        """The last actor update's per-row statistics (`row_id` [R], new log-prob, ratio, clipped
        share, …; `engine.training`): {} unless that update's batch carried `row_id`."""
        return dict(self.actor.last_row_statistics)

    # --- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(
        self,
        root: str | Path,
        step: int,
        *,
        extra_roles: dict[str, Any] | None = None,
        tokenizer: Any = None,
        trainer_state: dict[str, Any] | None = None,
        max_to_keep: int | None = None,
        staged_roles: Sequence[str] = (),
    ) -> Path:
        """root/global_step_{step}: the actor (+ extra_roles, e.g. an in-process critic), RNG, the HF
        export and the trainer's state, atomically (`engine.checkpoint`). A collective with ranks.
        staged_roles: roles their own workers staged for this step (a critic's), moved in with it."""
        manager = CheckpointManager(root, max_to_keep=max_to_keep, dp=self.actor.dp)
        roles = {"actor": self.actor} | (extra_roles or {})
        state, staged = trainer_state, staged_roles
        return manager.save(
            step, roles, hf_policy=self.actor, tokenizer=tokenizer, trainer_state=state, staged=staged
        )

    def load_checkpoint(
        self, root: str | Path, *, step: int | None = None, extra_roles: dict[str, Any] | None = None
    ) -> LoadedCheckpoint | None:
        """Restore the newest complete checkpoint under root (or `step`) into the actor (+ extra_roles)
        and the RNG states; None when there is none."""
        manager = CheckpointManager(root, dp=self.actor.dp)
        return manager.load({"actor": self.actor} | (extra_roles or {}), step=step)

    # --- the worker as a group of one (the interface `worker_group.PolicyWorkerGroup` shares) -------
    def controller_bytes(self) -> dict[str, float]:
        """Bytes between the controller and other processes: none, everything is in this one."""
        return {"controller/sent_bytes": 0.0, "controller/received_bytes": 0.0}

    def clear_queue(self) -> None:
        """Nothing to clear: in one process the batch is the only copy of the step's rows."""

    def arm_stack_dumps(self, folder: str | Path) -> list[str]:
        """Nothing to arm: this worker is the controller's process, which the watchdog dumps itself."""
        return []

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]:
        return []

    def shutdown(self) -> None:
        """Nothing to stop: the models live as long as this process holds them."""

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """The actor's weights as an HF directory (loadable with `from_pretrained`; LoRA merged)."""
        return self.actor.save_hf(out_dir)
