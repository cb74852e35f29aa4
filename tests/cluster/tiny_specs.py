"""Specs of the tests' tiny policy and critic (`tests.engine.tiny_batches.tiny_model`, saved)."""

from __future__ import annotations

from stratarl.cluster.specs import (
    ActorSpec,
    BatchingSpec,
    CriticSpec,
    ModelSpec,
    OptimizerSettings,
    PolicySpec,
    ReferenceSpec,
    RolloutEngineSpec,
)


def policy_spec(
    model_dir, *, lr: float = 1e-2, micro_batch_size: int = 2, with_reference: bool = False, **rollout
) -> PolicySpec:
    """EOS id 1, pad id 0; the reference (when asked for) scores in the actor's micro-batches."""
    batching = BatchingSpec(micro_batch_size)
    return PolicySpec(
        model=ModelSpec(str(model_dir)),
        eos_token_ids=(1,),
        pad_token_id=0,
        actor=ActorSpec(OptimizerSettings(lr=lr), batching),
        rollout=RolloutEngineSpec(**rollout),
        reference=ReferenceSpec(batching) if with_reference else None,
    )


def critic_spec(
    model_dir, *, lr: float = 1e-2, micro_batch_size: int = 2, init_seed: int | None = 1
) -> CriticSpec:
    return CriticSpec(
        model=ModelSpec(str(model_dir)),
        optimizer=OptimizerSettings(lr=lr),
        batching=BatchingSpec(micro_batch_size),
        init_seed=init_seed,
    )
