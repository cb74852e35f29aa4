"""bf16 rollout and the colocated hand-off keys reach the workers: rollout.dtype serves the rollout's
copy in bf16 over fp32 training, whose log-probs then differ from the actor's by bf16 rounding only
(measured on CPU: mean 1.3e-3, max 4.3e-3 nats on the tiny task model); and the hand-off
(rollout.free_cache_engine, actor.fsdp.optimizer_offload) is a no-op on CPU, and where it applies
frees the cache at the first training phase."""

import torch
from transformers import AutoTokenizer

from stratarl.assembly import roles
from stratarl.cluster.policy_worker import PolicyWorker
from stratarl.engine.offload import optimizer_state_devices
from stratarl.engine.requests import CheckpointRequest, UpdateRequest
from stratarl.objective.actor_loss import ActorLoss
from tests.trainer.precision_gap import BF16, rollout_training_gap, served_dtype
from tests.trainer.test_engine_settings import sampled_batch
from tests.trainer.test_rl_trainer import small_config


def test_rollout_dtype_serves_a_bf16_copy_and_the_gap_is_bf16_rounding(task):
    tokenizer = AutoTokenizer.from_pretrained(task["model"])
    spec = roles.policy_spec(small_config(task, *BF16), tokenizer, total_steps=1)
    worker = PolicyWorker(spec)
    assert spec.rollout.dtype == "bfloat16" and served_dtype(worker) == torch.bfloat16
    assert next(worker.actor.model.parameters()).dtype == torch.float32  # master weights stay fp32
    full = rollout_training_gap(task, "cpu")
    low = rollout_training_gap(task, "cpu", *BF16)
    assert full["max"] < 1e-5  # fp32 both sides: the same numbers by two code paths
    assert 1e-5 < low["mean"] < 0.01 and low["max"] < 0.05, low  # bf16 is used, and only rounds


def test_the_hand_off_keys_reach_the_worker_and_do_nothing_on_cpu(task):
    tokenizer = AutoTokenizer.from_pretrained(task["model"])
    cfg = small_config(task, "actor.fsdp.optimizer_offload=true")
    spec = roles.policy_spec(cfg, tokenizer, total_steps=1)
    assert spec.rollout.free_cache_engine and spec.precision.offload_optimizer
    off = roles.policy_spec(small_config(task, "rollout.free_cache_engine=false"), tokenizer, total_steps=1)
    assert not off.rollout.free_cache_engine and not off.precision.offload_optimizer
    worker = PolicyWorker(spec)
    assert not worker.frees_rollout_cache and not worker.offloads_optimizer  # one RAM serves both phases
    batch = sampled_batch(worker, task, tokenizer)
    held = worker.rollout._core.cache.num_bytes
    worker.compute_log_prob(batch)
    assert held > 0 and worker.rollout._core.cache.num_bytes == held  # kept: nothing to hand over
    batch = batch.union(worker.compute_log_prob(batch))
    metrics = worker.update_actor(batch, ActorLoss(), UpdateRequest(mini_batch_size=8))
    assert "perf/rollout_cache_released_gb" not in metrics and "perf/optimizer_offloaded_gb" not in metrics
    assert optimizer_state_devices(worker.actor.optimizer) == {torch.device("cpu")}


def test_the_hand_off_where_it_applies_frees_the_cache_at_the_first_training_phase(task, tmp_path):
    """The GPU decision forced on a CPU worker (the steps are the same; only memory_allocated needs a
    GPU, tests/gpu): the KV cache goes at the old log-prob, and the update reports what went."""
    tokenizer = AutoTokenizer.from_pretrained(task["model"])
    spec = roles.policy_spec(
        small_config(task, "actor.fsdp.optimizer_offload=true"), tokenizer, total_steps=1
    )
    worker = PolicyWorker(spec)
    worker.frees_rollout_cache = worker.offloads_optimizer = True
    batch = sampled_batch(worker, task, tokenizer)
    core = worker.rollout._core
    # the KV cache, the cached prefixes and the fused decode step's copies of a shared model's weights
    held = core.cache.num_bytes + core.store.num_bytes + (core.fused.num_bytes if core.fused else 0)
    batch = batch.union(worker.compute_log_prob(batch))
    assert held > 0 and worker.rollout._core.cache.num_bytes == 0 and len(worker.rollout._core.store) == 0
    metrics = worker.update_actor(batch, ActorLoss(), UpdateRequest(mini_batch_size=8))
    assert metrics["perf/rollout_cache_released_gb"] == held / 2**30
    assert metrics["perf/optimizer_offloaded_gb"] == 0.0  # CPU to CPU: nothing moves
    again = worker.update_actor(batch, ActorLoss(), UpdateRequest(mini_batch_size=8))
    assert again["perf/rollout_cache_released_gb"] == 0
    path = worker.save_checkpoint(tmp_path / "ckpt", CheckpointRequest(step=1))  # the state is on hand
    assert (path / "actor" / "optimizer.pt").is_file()
    assert worker.load_checkpoint(tmp_path / "ckpt") is not None
    after = sampled_batch(worker, task, tokenizer, seed=1)  # generation re-allocates its cache
    assert after["responses"].shape[0] == 8 and worker.rollout._core.cache.num_bytes > 0
