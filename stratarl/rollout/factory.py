"""Layer 5, rollout: the one place a generation backend is chosen — `ROLLOUT_BACKENDS`, keyed by name.

`RolloutEngineSpec` says which backend serves a policy and how (dtype, seed, batch and context
limits); `build_rollout_engine` makes that engine for a model directory. Every placement builds its
engines here: the colocated policy worker (in one process and on each Ray rank) and the rollout
replicas of the split plan. A new backend is one function in `ROLLOUT_BACKENDS` (and its name among
the choices of `rollout.backend`, which a test keeps equal to this table).

source_model: a model already loaded in this process (the policy's, before it is wrapped or
sharded). The torch backend serves a copy of it, or the model itself with `share_weights`; vLLM
loads the directory itself.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import nn

from stratarl.engine.hf_models import DTYPES, ModelSpec, load_causal_lm
from stratarl.rollout.interface import RolloutEngine

UNBOUNDED_SEQS = 1_000_000  # "no bound" for the torch engine's running batch


@dataclass(frozen=True)
class RolloutEngineSpec:
    """How a policy's weights are served for generation.

    backend: a key of `ROLLOUT_BACKENDS`. dtype: of the served weights (None: the model's).
    seed: of the engine's shared generator (replica r uses seed + r). max_num_seqs: sequences decoded
    together (None: the torch engine takes all at once; vLLM, which preallocates per sequence, keeps
    `VllmRolloutEngine`'s default of 256). max_model_len: prompt + response tokens a sequence may
    reach (vLLM sizes its KV cache by it; the torch engine caps responses at the model's context).
    free_cache_engine: a colocated worker releases the engine's KV cache when it starts a training
    phase on the same GPU (`release_memory`). partial_rollout: what a weight load does to the
    requests running (`torch_engine`: finish or continue; vLLM always finishes them).
    share_weights: the torch engine serves `source_model` itself, not a copy, so the trainer's
    in-place optimizer step is what it serves next (`rollout.weight_sharing`; config/rollout_weights.py
    says when that is safe). The model then keeps its dtype, mode and requires_grad.
    decode_step: what computes the torch engine's decode steps (`fused_decode`: fused, hf or auto).
    """

    backend: str = "torch"
    dtype: str | None = None
    seed: int = 0
    max_num_seqs: int | None = 256
    max_model_len: int = 2048
    free_cache_engine: bool = True
    partial_rollout: str = "finish"
    share_weights: bool = False
    decode_step: str = "auto"

    def __post_init__(self) -> None:
        if self.backend not in ROLLOUT_BACKENDS:
            raise ValueError(f"unknown rollout backend {self.backend!r}; valid: {sorted(ROLLOUT_BACKENDS)}")
        if self.share_weights and self.backend != "torch":
            raise ValueError(f"share_weights is built for the torch backend, not {self.backend!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"unknown rollout dtype {self.dtype!r}; valid: {sorted(DTYPES)}")


@dataclass(frozen=True)
class ReplicaSetup:
    """What one engine is built from beside its spec and model: the model already loaded in this
    process (`source_model`, or None), the tokens that end a response and pad a row, its index."""

    source_model: nn.Module | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    replica_id: int


def build_torch_engine(spec: RolloutEngineSpec, model: ModelSpec, replica: ReplicaSetup) -> RolloutEngine:
    """`TorchRolloutEngine` over its own copy of the weights (a generation never sees a half-updated
    model, and may run in another dtype than training), or over `source_model` itself when
    `spec.share_weights` (the caller guarantees no update overlaps a generation)."""
    from stratarl.rollout.torch_engine import TorchRolloutEngine

    source_model, replica_id = replica.source_model, replica.replica_id
    if spec.share_weights:
        if source_model is None:
            raise ValueError("share_weights needs the source model to serve")
        served = source_model
    else:
        served = copy.deepcopy(source_model) if source_model is not None else load_causal_lm(model)
        served = served.to(DTYPES[spec.dtype or model.dtype]).eval().requires_grad_(False)
    return TorchRolloutEngine(
        served,
        eos_token_ids=list(replica.eos_token_ids),
        pad_token_id=replica.pad_token_id,
        seed=spec.seed + replica_id,
        max_num_seqs=spec.max_num_seqs or UNBOUNDED_SEQS,
        replica_id=replica_id,
        partial_rollout=spec.partial_rollout,
        decode_step=spec.decode_step,
        owns_weights=not spec.share_weights,
    )


def build_vllm_engine(spec: RolloutEngineSpec, model: ModelSpec, replica: ReplicaSetup) -> RolloutEngine:
    """`VllmRolloutEngine` over the model directory (vLLM loads and lays out the weights itself)."""
    from stratarl.rollout.vllm_engine import VllmRolloutEngine  # imports vllm: only when chosen

    limits = {} if spec.max_num_seqs is None else {"max_num_seqs": spec.max_num_seqs}
    return VllmRolloutEngine(
        model.path,
        eos_token_ids=list(replica.eos_token_ids),
        dtype=spec.dtype or model.dtype,
        seed=spec.seed + replica.replica_id,
        max_model_len=spec.max_model_len,
        replica_id=replica.replica_id,
        trust_remote_code=model.trust_remote_code,
        **limits,
    )


RolloutBuilder = Callable[[RolloutEngineSpec, ModelSpec, ReplicaSetup], RolloutEngine]
ROLLOUT_BACKENDS: dict[str, RolloutBuilder] = {"torch": build_torch_engine, "vllm": build_vllm_engine}


def build_rollout_engine(
    spec: RolloutEngineSpec,
    model: ModelSpec,
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    source_model: nn.Module | None = None,
    replica_id: int = 0,
) -> RolloutEngine:
    """The engine `spec.backend` names, serving `model` as weight version 0, as replica `replica_id`."""
    replica = ReplicaSetup(source_model, tuple(eos_token_ids), pad_token_id, replica_id)
    return ROLLOUT_BACKENDS[spec.backend](spec, model, replica)
