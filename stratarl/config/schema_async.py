"""Layer 1, config: when generation runs relative to training — `trainer.mode` and `async_training.*`.

sync: generate, score, update, one after another. one_step_off: the batch of step k+1 is generated
(with the weights step k starts from) while step k trains. async: a producer generates continuously
into a bounded buffer; the trainer takes batches at most `async_training.max_staleness` versions old.
`async_training.partial_rollout` says what a weight push does to the generations in flight (async).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from stratarl.config.errors import ConfigProblem
from stratarl.config.setting import setting

TRAINER_MODES = ("sync", "one_step_off", "async")
STALE_STRATEGIES = ("drop", "wait")
OFF_POLICY_CORRECTIONS = ("decoupled", "none")
PARTIAL_ROLLOUTS = ("finish", "continue")


@dataclass
class AsyncTrainingConfig:
    """The producer of the off-policy modes (trainer.mode=one_step_off or async)."""

    max_staleness: int = setting(
        2,
        "async: a trained sample is at most this many weight versions older than the weights it "
        "trains (trained version − generating version)",
        verl="trainer.v1.sampler.max_off_policy_threshold",
    )
    stale_strategy: str = setting(
        "wait",
        "async: wait (the producer pauses so no sample can pass max_staleness) or drop (batches past "
        "it are discarded and counted in async/dropped_samples)",
        verl="trainer.v1.sampler.max_off_policy_strategy",
        choices=STALE_STRATEGIES,
    )
    weight_sync_interval: int = setting(
        1,
        "async: push the actor's weights to the rollout every this many steps",
        verl="async_training.trigger_parameter_sync_step",
    )
    buffer_batches: int = setting(
        2, "async: finished batches the producer may hold before it pauses (the buffer's bound)"
    )
    deterministic: bool = setting(
        False,
        "async: pin which weight version generates each batch — the oldest pushed version within "
        "max_staleness, the push waiting for the batches it owes — so a run and its resume reproduce "
        "given the seed whatever the speeds (needs stale_strategy=wait and buffer_batches ≥ "
        "max_staleness − weight_sync_interval + 1); sync and one_step_off are deterministic always",
    )
    correction: str = setting(
        "decoupled",
        "off-policy modes: decoupled (decoupled PPO — π_old recomputed as the proximal policy, token "
        "IS weights π_old/π_rollout truncated at algorithm.rollout_correction.rollout_is_threshold, "
        "unless algorithm.rollout_correction sets its own) or none (train stale samples as on-policy)",
        choices=OFF_POLICY_CORRECTIONS,
    )
    partial_rollout: str = setting(
        "finish",
        "async: what a weight push does to the generations in flight — finish (the push waits until "
        "the batch in flight is done: every trajectory comes from one version) or continue (the push "
        "lands at the rollout engine's next step boundary; running responses are re-prefilled under "
        "the new weights and go on from their prefix, each token recording the version that sampled "
        "it in token_weight_version)",
        verl="async_training.partial_rollout",
        choices=PARTIAL_ROLLOUTS,
    )


def async_problems(cfg: Any) -> list[ConfigProblem]:
    """Combinations of trainer.mode and async_training.* that cannot run, each naming its keys."""
    a, mode, problems = cfg.async_training, cfg.trainer.mode, []
    for name in ("weight_sync_interval", "buffer_batches"):
        if getattr(a, name) < 1:
            message = f"must be ≥ 1, got {getattr(a, name)}"
            problems.append(ConfigProblem((f"async_training.{name}",), message))
    if a.max_staleness < 0:
        message = f"must be ≥ 0, got {a.max_staleness}"
        problems.append(ConfigProblem(("async_training.max_staleness",), message))
    elif mode == "async" and a.max_staleness < a.weight_sync_interval - 1:
        problems.append(
            ConfigProblem(
                ("async_training.max_staleness", "async_training.weight_sync_interval"),
                f"max_staleness={a.max_staleness} < weight_sync_interval − 1 = {a.weight_sync_interval - 1}: "
                "between two pushes the rollout's weights fall that far behind, so no batch could be "
                "trained",
            )
        )
    problems += _partial_rollout_problems(cfg)
    if a.deterministic and a.stale_strategy != "wait":
        problems.append(
            ConfigProblem(
                ("async_training.deterministic", "async_training.stale_strategy"),
                f"a deterministic schedule needs stale_strategy=wait, got {a.stale_strategy} (what is "
                "dropped depends on the speeds)",
            )
        )
    owed = a.max_staleness - a.weight_sync_interval + 1
    if mode == "async" and a.deterministic and a.buffer_batches < owed:
        problems.append(
            ConfigProblem(
                ("async_training.deterministic", "async_training.buffer_batches"),
                f"buffer_batches={a.buffer_batches} < max_staleness − weight_sync_interval + 1 = {owed}: "
                "a push would wait for batches the buffer has no room for",
            )
        )
    return problems


# The async_training keys each trainer.mode reads (trainer/training_modes.py, trainer/correction.py,
# trainer/pi_old.py);
# async reads them all. partial_rollout reaches the rollout engine's spec in every mode, but outside
# async validation refuses any value but its default, so no warning is owed for it.
# tests/trainer/test_mode_reads.py runs every read site under each mode and compares.
READ_BY_MODE = {"sync": (), "one_step_off": ("correction",)}


def async_warnings(cfg: Any) -> list[ConfigProblem]:
    """async_training keys changed from their defaults that trainer.mode does not read (one warning
    naming them all, as a ConfigProblem: its keys and its sentence)."""
    read = READ_BY_MODE.get(cfg.trainer.mode)
    if read is None:  # async reads them all
        return []
    unread = [
        f.name
        for f in fields(AsyncTrainingConfig)
        if f.name not in read and getattr(cfg.async_training, f.name) != f.default
    ]
    if not unread:
        return []
    values = ", ".join(f"async_training.{name}={getattr(cfg.async_training, name)!r}" for name in unread)
    message = (
        f"{values} {'has' if len(unread) == 1 else 'have'} no effect with trainer.mode={cfg.trainer.mode} "
        "(read only by trainer.mode=async)"
    )
    return [ConfigProblem(tuple(f"async_training.{name}" for name in unread), message)]


def _partial_rollout_problems(cfg: Any) -> list[ConfigProblem]:
    """partial_rollout=continue is built for trainer.mode=async on the torch engine, in one process
    or with the split placement (a colocated rank cannot take a push while it generates)."""
    if cfg.async_training.partial_rollout != "continue":
        return []
    key, problems = "async_training.partial_rollout", []
    if cfg.trainer.mode != "async":
        problems.append(
            ConfigProblem(
                (key, "trainer.mode"),
                f"partial_rollout=continue needs trainer.mode=async, got {cfg.trainer.mode} (only async "
                "pushes weights while a batch is generated)",
            )
        )
    if cfg.async_training.deterministic:
        problems.append(
            ConfigProblem(
                (key, "async_training.deterministic"),
                "partial_rollout=continue cannot be deterministic: where a push lands in a response "
                "depends on the two sides' speeds",
            )
        )
    if cfg.rollout.backend != "torch":
        problems.append(
            ConfigProblem(
                (key, "rollout.backend"),
                f"partial_rollout=continue is built for rollout.backend=torch, not {cfg.rollout.backend}",
            )
        )
    if cfg.cluster.backend == "ray" and cfg.cluster.placement != "split":
        problems.append(
            ConfigProblem(
                (key, "cluster.placement"),
                "partial_rollout=continue on Ray needs cluster.placement=split: a colocated rank "
                "generates and takes the push in one call at a time",
            )
        )
    return problems
