"""Layer 3, orchestration: what builds each role — typed specs, made once from the config.

The builders of `stratarl/assembly/roles.py` turn the config into these frozen dataclasses of
plain values; they reach a worker unchanged, in this process or pickled to a Ray rank, and the
worker's one constructor reads them (`PolicyWorker(spec)`, `CriticWorker(spec)`). A spec is the
whole contract: a setting that is not in a spec cannot reach a worker.

    PolicySpec: model · actor (optimizer, micro-batching) · precision · LoRA · reference · rollout engine
    CriticSpec: model · optimizer · micro-batching · precision · value-head seed
    TeacherSpec: the distillation teachers by name · temperature · the student's vocabulary size
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stratarl.engine.fused_head import LOGIT_CHUNK_SIZE
from stratarl.engine.hf_models import ModelSpec
from stratarl.engine.training import OptimizerSettings
from stratarl.rollout.factory import RolloutEngineSpec

__all__ = [
    "ActorSpec",
    "BatchingSpec",
    "CriticSpec",
    "LoraSpec",
    "ModelSpec",
    "OptimizerSettings",
    "PolicySpec",
    "PrecisionSpec",
    "ReferenceSpec",
    "RolloutEngineSpec",
    "TeacherSpec",
]


@dataclass(frozen=True)
class BatchingSpec:
    """How a role splits its rows for a forward/backward: `micro_batch_size` rows per micro-batch,
    or a token budget per micro-batch; packed (no compute on padding) or padded layout."""

    micro_batch_size: int
    max_tokens_per_micro_batch: int | None = None
    layout: str = "packed"


@dataclass(frozen=True)
class PrecisionSpec:
    """`engine.data_parallel.DataParallel`'s settings: mixed precision (`param_dtype` computes in
    bf16/fp16 over fp32 master weights), FSDP2 CPU offload (GPU meshes only), and whether each
    block's gathered parameters are freed after its forward (ZeRO-3) or kept for the backward; and
    whether the optimizer state waits in CPU memory between updates (the colocated hand-off)."""

    param_dtype: str | None = None
    offload_params: bool = False
    reshard_after_forward: bool = True
    offload_optimizer: bool = False


@dataclass(frozen=True)
class LoraSpec:
    """LoRA adapters on the policy (peft): only they train; W' = W + (alpha / rank)·B·A."""

    rank: int
    alpha: float
    target_modules: str | tuple[str, ...] = "all-linear"


@dataclass(frozen=True)
class ActorSpec:
    """The trained policy: its optimizer, its micro-batching, the rows of logits made at a time for
    log-probs and entropy, and the temperature log-probs are scored at (the rollout's)."""

    optimizer: OptimizerSettings
    batching: BatchingSpec
    logit_chunk_size: int | None = LOGIT_CHUNK_SIZE
    temperature: float = 1.0


@dataclass(frozen=True)
class ReferenceSpec:
    """A frozen policy that scores the actor's tokens — the reference, or a distillation teacher: its
    scoring settings, and its model (None: a frozen copy of the actor's start; under LoRA the actor's
    own model with the adapter off, which scores through the actor's module, so the actor's
    logit_chunk_size holds). A teacher always has a model of its own."""

    batching: BatchingSpec
    logit_chunk_size: int | None = LOGIT_CHUNK_SIZE
    model: ModelSpec | None = None  # reference.model_path: a model of its own
    top_k: int = 0  # a teacher for forward_kl_topk: also its distillation.topk most likely tokens


# The name of the teacher that scores the rows whose data_source has no teacher of its own.
DEFAULT_TEACHER = "*"


@dataclass(frozen=True)
class TeacherSpec:
    """What builds a `TeacherWorker`: the distillation teachers by name — a data_source value
    (distillation.teachers) or DEFAULT_TEACHER (distillation.teacher_model_path) — each a frozen
    model with its scoring settings; the temperature log-probs are scored at (the rollout's); the
    student's vocabulary size, which every teacher's must equal (it scores the student's ids)."""

    teachers: dict[str, ReferenceSpec]
    temperature: float
    vocab_size: int


@dataclass(frozen=True)
class PolicySpec:
    """What builds a `PolicyWorker`: the model, the actor, the engine that serves it for generation,
    and optionally a reference (None: no KL term needs one), distillation teachers and LoRA adapters
    (None: full training).
    The actor and the reference share `precision` (they live in one process and one group)."""

    model: ModelSpec
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    actor: ActorSpec
    rollout: RolloutEngineSpec = field(default_factory=RolloutEngineSpec)
    reference: ReferenceSpec | None = None
    # distillation in the policy's process (None: no teacher there; on Ray it has a pool of its own)
    teacher: TeacherSpec | None = None
    lora: LoraSpec | None = None
    precision: PrecisionSpec = field(default_factory=PrecisionSpec)


@dataclass(frozen=True)
class CriticSpec:
    """What builds a `CriticWorker`: a model directory (a causal LM whose body gets a fresh scalar
    head, or a saved value model), its optimizer, micro-batching and precision. `init_seed` draws
    the fresh head (None: from the global RNG); every data-parallel rank must draw the same one."""

    model: ModelSpec
    optimizer: OptimizerSettings
    batching: BatchingSpec
    precision: PrecisionSpec = field(default_factory=PrecisionSpec)
    init_seed: int | None = None
