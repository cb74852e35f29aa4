"""validate_config refuses what this build or machine cannot run — sglang, vLLM where it is not
installed, cuda without CUDA or for split replicas without GPUs, FSDP2 offload without GPU workers —
naming the key, before anything loads."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stratarl.config import ConfigError, RunConfig, load_config, validate_config
from stratarl.config.setting import leaf_settings
from stratarl.rollout.factory import ROLLOUT_BACKENDS

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "grpo_arithmetic.yaml"
HAS_VLLM = importlib.util.find_spec("vllm") is not None
NOT_BUILT = {"sglang"}  # offered by rollout.backend's choices, refused until an engine exists


def problems(*overrides: str) -> dict[tuple[str, ...], str]:
    with pytest.raises(ConfigError) as caught:
        validate_config(load_config(None, list(overrides)), check_paths=False)
    return {tuple(p.keys): p.message for p in caught.value.problems}


def test_every_rollout_backend_choice_is_built_by_the_factory_or_refused():
    choices = set(leaf_settings(RunConfig)["rollout.backend"].choices)
    assert choices == set(ROLLOUT_BACKENDS) | NOT_BUILT
    assert "not available in this build" in problems("rollout.backend=sglang")[("rollout.backend",)]


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here: the backend is built")
def test_vllm_where_it_is_not_installed_names_the_key_and_how_to_get_it():
    message = problems("rollout.backend=vllm")[("rollout.backend",)]
    assert "vLLM is not installed" in message and "make test-vllm" in message and ".venv-vllm" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_config_error():
    assert "no CUDA device" in problems("cluster.device=cuda")[("cluster.device",)]


def test_offload_needs_gpu_training_workers_and_min_tokens_fit_the_response():
    found = problems(
        "actor.fsdp.offload_params=true",
        "critic.fsdp.offload_params=true",
        "rollout.max_response_tokens=8",
        "rollout.min_response_tokens=9",
    )
    offload = ("actor.fsdp.offload_params", "cluster.backend", "cluster.gpus_per_training_worker")
    assert "CPU offload" in found[offload]
    assert ("critic.fsdp.offload_params", *offload[1:]) in found
    assert found[("rollout.min_response_tokens", "rollout.max_response_tokens")] == "9 exceeds 8"
    gpus_on_cpu = problems("cluster.backend=ray", "cluster.device=cpu", "cluster.gpus_per_training_worker=1")
    assert any("cluster.device" in keys and "GPUs are reserved" in m for keys, m in gpus_on_cpu.items())
    split = ("cluster.backend=ray", "cluster.placement=split", "cluster.gpus_per_training_worker=1")
    cpu_replicas = problems(*split, "cluster.device=cuda")  # replicas run on the GPUs their bundles reserve
    assert "reserve no GPU" in cpu_replicas[("cluster.device", "cluster.gpus_per_rollout_replica")]
    assert ("cluster.device", "cluster.gpus_per_rollout_replica") not in problems(
        *split, "cluster.device=cuda", "cluster.gpus_per_rollout_replica=1"
    )


@pytest.mark.skipif(HAS_VLLM or torch.cuda.is_available(), reason="needs a CPU machine without vLLM")
@pytest.mark.parametrize(
    ("override", "expected"), [("rollout.backend=vllm", "make test-vllm"), ("cluster.device=cuda", "no CUDA")]
)
def test_stratarl_train_stops_before_loading_anything(tmp_path, override, expected):
    """What a user sees: the command fails with the key and the way out; no run directory exists."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "stratarl", "train", str(RECIPE), override]
    command.append(f"trainer.run_dir={run_dir}")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    assert override.split("=")[0] in done.stderr and expected in done.stderr, done.stderr[-2000:]
    assert not run_dir.exists()


def test_the_fused_decode_step_is_refused_for_vllm_and_for_a_family_it_does_not_cover(tmp_path):
    found = problems("rollout.decode_step=fused", "rollout.backend=vllm")
    assert found[("rollout.decode_step", "rollout.backend")] == "the fused decode step is the torch engine's"
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    found = problems("rollout.decode_step=fused", f"model.path={tmp_path}")
    message = found[("rollout.decode_step", "model.path")]
    assert "model_type 'gpt2'" in message and "rollout.decode_step=auto or hf" in message
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    validate_config(
        load_config(None, ["rollout.decode_step=fused", f"model.path={tmp_path}"]), check_paths=False
    )


def test_replica_restarts_are_refused_where_no_replica_is_a_process_of_its_own():
    """rollout.max_replica_restarts restarts split-plan replicas on Ray, in trainer.mode=sync only."""
    key = "rollout.max_replica_restarts"
    in_process = problems(f"{key}=1")
    assert "processes of their own" in in_process[(key, "cluster.backend", "cluster.placement")]
    colocated = problems(f"{key}=1", "cluster.backend=ray", "cluster.placement=colocated")
    assert "(ray, colocated)" in colocated[(key, "cluster.backend", "cluster.placement")]
    one_step_off = problems(
        f"{key}=2", "cluster.backend=ray", "cluster.placement=split", "trainer.mode=one_step_off"
    )
    assert list(one_step_off) == [(key, "trainer.mode")]
    assert "need trainer.mode=sync" in one_step_off[(key, "trainer.mode")]
    assert "≥ 0" in problems(f"{key}=-1")[(key,)]
    ok = load_config(None, [f"{key}=2", "cluster.backend=ray", "cluster.placement=split"])
    validate_config(ok, check_paths=False)  # no problem: warnings only, if any
