"""Layer 1, config: when the rollout engine may serve the actor's own model — `rollout.weight_sharing`.

Sharing removes the engine's second copy of the weights and the copy of every weight sync (the
optimizer's in-place step is what the engine serves next). It is safe only where nothing can read
the weights while they change and where the served module is exactly the trained one:

- the engine is in the trainer's process (cluster.backend=in-process; on Ray the ranks shard their
  parameters with FSDP2 and the split placement's replicas live in other processes);
- it is the torch engine (vLLM lays out the weights itself);
- generation never overlaps an update (trainer.mode=sync; one_step_off and async generate while the
  optimizer steps);
- the actor trains the whole model (LoRA wraps the modules; the engine serves the merged weights);
- the engine serves the training dtype (rollout.dtype null or model.dtype).

`auto` shares when all hold and copies otherwise (`trainer.roles.shares_weights`); `share` is
refused at validation where one does not, naming the key that stops it.
"""

from __future__ import annotations

from typing import Any

from stratarl.config.errors import ConfigProblem

KEY = "rollout.weight_sharing"


def sharing_blockers(cfg: Any, *, sft: bool = False) -> list[tuple[str, str]]:
    """(key, why) for each condition above that `cfg` breaks; [] when sharing is safe. sft: for
    `stratarl sft`, which always trains in this process, the whole model, and generates only between
    updates (so only the engine's own conditions apply)."""
    r, blockers = cfg.rollout, []
    if r.backend != "torch":
        blockers.append(("rollout.backend", f"rollout.backend={r.backend} loads its own weights"))
    if r.dtype not in (None, cfg.model.dtype):
        why = f"rollout.dtype={r.dtype} differs from model.dtype={cfg.model.dtype}"
        blockers.append(("rollout.dtype", why))
    if sft:
        return blockers
    if cfg.cluster.backend != "in-process":
        why = f"cluster.backend={cfg.cluster.backend}: the engine is not in the trainer's process"
        blockers.append(("cluster.backend", why))
    if cfg.trainer.mode != "sync":
        why = f"trainer.mode={cfg.trainer.mode} generates while the optimizer steps"
        blockers.append(("trainer.mode", why))
    if cfg.actor.lora.rank > 0:
        blockers.append(("actor.lora.rank", "a LoRA actor's engine serves merged weights"))
    return blockers


def weight_sharing_problems(cfg: Any) -> list[ConfigProblem]:
    """`share` where a condition of the module docstring does not hold: one problem per condition."""
    if cfg.rollout.weight_sharing != "share":
        return []
    return [
        ConfigProblem((KEY, key), f"weight_sharing=share is not safe here: {why} (auto or copy keep a copy)")
        for key, why in sharing_blockers(cfg)
    ]
