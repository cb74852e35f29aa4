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

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from stratarl.engine.actor import Actor, LossFn, Reference
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


class PolicyWorker:
    """Actor + rollout engine (+ frozen reference) over one model directory."""

    def __init__(
        self,
        *,
        model_path: str | Path,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        actor_kwargs: dict,
        dtype: str = "float32",
        rollout_dtype: str = "float32",
        with_reference: bool = False,
        rollout_seed: int = 0,
        max_num_seqs: int = 256,
    ):
        model = load_causal_lm(model_path, dtype)
        self.actor = Actor(model, **actor_kwargs)
        # The rollout engine serves its own copy, so a generation never sees half-updated weights and
        # may run in a lower precision than training.
        rollout_model = copy.deepcopy(model).to(DTYPES[rollout_dtype]).eval().requires_grad_(False)
        self.rollout = TorchRolloutEngine(
            rollout_model,
            eos_token_ids=list(eos_token_ids),
            pad_token_id=pad_token_id,
            seed=rollout_seed,
            max_num_seqs=max_num_seqs,
        )
        self.pad_token_id = pad_token_id
        self.reference = (
            Reference.copy_of(
                model, micro_batch_size=self.actor.micro_batch_size, temperature=self.actor.temperature
            )
            if with_reference
            else None
        )

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
        return DataProto.from_dict(
            tensors, {"finish_reason": np.array(columns["finish_reason"], dtype=object)}
        )

    def sync_weights(self) -> WeightLoadReport:
        """Push the actor's weights into the rollout engine as version + 1, and check they arrived."""
        return self.rollout.load_weights(self.actor.export_weights(), self.rollout.weight_version + 1)

    @property
    def weight_version(self) -> int:
        return self.rollout.weight_version

    # --- actor / reference ---------------------------------------------------------------------
    def compute_log_prob(self, batch: DataProto, *, with_entropy: bool = False) -> DataProto:
        log_prob, entropy = self.actor.compute_log_prob(batch, with_entropy=with_entropy)
        columns = {"old_log_probs": log_prob} | ({"entropys": entropy} if entropy is not None else {})
        return DataProto.from_dict(columns)

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

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """The actor's weights as an HF directory (loadable with `from_pretrained`)."""
        out_dir = Path(out_dir)
        self.actor.model.save_pretrained(out_dir)
        return out_dir
