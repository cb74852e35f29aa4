"""The CUDA path on one GPU: a bf16 GRPO run trains on cuda with the memory hand-off, rollout and training
log-probs agree within bf16 rounding, FSDP2 computes in bf16 over fp32 shards (CPU offload too), the
hand-off frees device memory (and trains as without it for each AdamW kernel, fused keeping its `step`
on the GPU), and a checkpoint saved on cuda loads on the CPU. Skipped without CUDA; `make test-gpu` and
benchmarks/gpu_check.sh run them."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from transformers import AutoTokenizer

from stratarl.assembly import roles
from stratarl.cluster.policy_worker import PolicyWorker
from stratarl.engine.actor import Actor, OptimizerSettings
from stratarl.engine.checkpoint import CheckpointManager
from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.offload import optimizer_state_devices
from stratarl.engine.optim import ADAMW_IMPLS
from stratarl.engine.process_group import free_port, join_process_group, leave_process_group
from stratarl.engine.requests import CheckpointRequest, UpdateRequest
from stratarl.objective.actor_loss import ActorLoss
from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer
from tests.engine.tiny_batches import policy_gradient_loss, ragged_batch, tiny_model
from tests.trainer.precision_gap import BF16, rollout_training_gap, served_dtype
from tests.trainer.test_engine_settings import sampled_batch
from tests.trainer.test_rl_trainer import small_config

NO_CUDA = "needs a CUDA device; torch.cuda.is_available() is False here (run on a GPU: make test-gpu)"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]
HAND_OFF = ("actor.fsdp.optimizer_offload=true", "rollout.free_cache_engine=true")


def cuda_worker(task, *overrides: str) -> tuple[PolicyWorker, object]:
    tokenizer = AutoTokenizer.from_pretrained(task["model"])
    spec = roles.policy_spec(small_config(task, "cluster.device=cuda", *overrides), tokenizer, total_steps=2)
    return PolicyWorker(spec), tokenizer


def test_a_bf16_grpo_run_trains_on_cuda_with_the_hand_off(task, tmp_path):
    cfg = small_config(task, "cluster.device=cuda", *BF16, *HAND_OFF, "trainer.total_steps=2")
    trainer = RLTrainer(cfg, tmp_path / "run")
    worker = trainer.worker.local_worker()
    actor_params = next(worker.actor.model.parameters())
    assert actor_params.device.type == "cuda" and actor_params.dtype == torch.float32
    assert (
        next(worker.rollout.model.parameters()).device.type == "cuda"
        and served_dtype(worker) == torch.bfloat16
    )
    before = {k: v.detach().cpu().clone() for k, v in worker.actor.model.state_dict().items()}
    trainer.fit()
    after = worker.actor.model.state_dict()
    assert any(not torch.equal(before[k], after[k].cpu()) for k in before), "no weight changed"
    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "train"]
    assert len(train) == 2
    for record in train:
        assert record["perf/max_memory_allocated_gb"] > 0 and 0 < record["perf/mfu/actor"] < 1
        assert record["perf/rollout_cache_released_gb"] > 0 and record["perf/optimizer_offloaded_gb"] > 0
    assert optimizer_state_devices(worker.actor.optimizer) == {
        torch.device("cpu")
    }  # out until the next update


def test_bf16_rollout_and_training_log_probs_agree_within_bf16_rounding_on_cuda(task):
    # CPU measures mean 1.3e-3, max 4.3e-3 nats for this model (tests/trainer/test_rollout_precision.py);
    # the bound leaves CUDA's bf16 kernels an order of magnitude more.
    full = rollout_training_gap(task, "cuda")
    low = rollout_training_gap(task, "cuda", *BF16)
    print(f"rollout vs training |Δ log p| on cuda: fp32 {full}, bf16 {low}")
    assert full["max"] < 1e-3, full  # fp32 both sides (no TF32 matmuls: PyTorch's default)
    assert 1e-5 < low["mean"] < 0.02 and low["max"] < 0.1, low


@pytest.fixture
def one_nccl_rank():
    join_process_group(
        address="127.0.0.1", port=free_port(), rank=0, world_size=1, backend="nccl", cuda_index=0
    )
    yield
    leave_process_group()


@pytest.mark.parametrize("offload_params", [False, True])
def test_fsdp2_computes_in_bf16_over_fp32_shards_and_trains(one_nccl_rank, offload_params):
    dp = DataParallel.over_world(param_dtype="bfloat16", offload_params=offload_params)
    actor = Actor(
        tiny_model(layers=2).cuda(), optim=OptimizerSettings(lr=1e-2), micro_batch_size=4, data_parallel=dp
    )
    assert actor.device.type == "cuda"  # batches go to the GPU even when the shards live in CPU memory
    shard_devices = {p.to_local().device.type for p in actor.module.parameters()}
    assert shard_devices == ({"cpu"} if offload_params else {"cuda"})
    assert {p.dtype for p in actor.module.parameters()} == {torch.float32}  # master weights
    seen: set[torch.dtype] = set()
    hook = actor.lm.model.layers[0].mlp.up_proj.register_forward_pre_hook(
        lambda module, args: seen.add(module.weight.dtype)
    )
    before = [p.full_tensor().detach().cpu().clone() for p in actor.module.parameters()]
    metrics = actor.update(ragged_batch(), policy_gradient_loss, UpdateRequest(mini_batch_size=8))
    hook.remove()
    assert seen == {torch.bfloat16}  # unsharded for compute in param_dtype
    grads = {p.grad.dtype for p in actor.module.parameters() if p.grad is not None}
    assert grads == {torch.float32}  # reduced in fp32
    after = [p.full_tensor().detach().cpu() for p in actor.module.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert metrics["perf/max_memory_allocated_gb"] > 0 and "nccl" in dist.get_backend()


def test_the_hand_off_frees_device_memory(task):
    worker, tokenizer = cuda_worker(task, *BF16, *HAND_OFF)
    batch = sampled_batch(worker, task, tokenizer)
    torch.cuda.synchronize()
    with_cache = torch.cuda.memory_allocated()
    batch = batch.union(worker.compute_log_prob(batch))  # a training phase: the KV cache goes
    assert torch.cuda.memory_allocated() < with_cache
    assert worker.rollout._core.cache.num_bytes == 0
    worker.update_actor(batch, ActorLoss(), UpdateRequest(mini_batch_size=8))
    assert optimizer_state_devices(worker.actor.optimizer) == {torch.device("cpu")}
    with_state = torch.cuda.memory_allocated()
    worker.actor.reload_optimizer()
    state_bytes = sum(p.numel() * 8 for p in worker.actor.module.parameters())  # AdamW: 2 fp32 moments
    assert torch.cuda.memory_allocated() - with_state >= state_bytes
    assert worker.actor.offload_optimizer() >= state_bytes
    assert torch.cuda.memory_allocated() == with_state


@pytest.mark.parametrize("adamw_impl", ADAMW_IMPLS)
def test_the_optimizer_hand_off_trains_as_without_it_for_each_adamw_kernel(adamw_impl):
    batch = ragged_batch(n=4)
    plain, handed = (
        Actor(
            tiny_model().cuda(), optim=OptimizerSettings(lr=1e-2, adamw_impl=adamw_impl), micro_batch_size=2
        )
        for _ in range(2)
    )
    for actor in (plain, handed):
        actor.update(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=4))
    assert handed.offload_optimizer() > 0
    assert optimizer_state_devices(handed.optimizer) == {torch.device("cpu")}
    steps = {state["step"].device.type for state in handed.optimizer.state.values()}
    assert steps == ({"cuda"} if adamw_impl == "fused" else {"cpu"})  # never moved
    assert handed.reload_optimizer() > 0
    for actor in (plain, handed):
        actor.update(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=4))
    for p, q in zip(plain.module.parameters(), handed.module.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)  # only GPU reduction order may differ


def test_a_checkpoint_saved_on_cuda_loads_on_the_cpu_equal(task, tmp_path):
    worker, tokenizer = cuda_worker(task)
    batch = sampled_batch(worker, task, tokenizer)
    batch = batch.union(worker.compute_log_prob(batch))
    worker.update_actor(batch, ActorLoss(), UpdateRequest(mini_batch_size=8))  # optimizer state on cuda
    worker.save_checkpoint(tmp_path / "ckpt", CheckpointRequest(step=1))
    cpu_spec = dataclasses.replace(worker.spec, model=dataclasses.replace(worker.spec.model, device="cpu"))
    on_cpu = PolicyWorker(cpu_spec)
    assert on_cpu.load_checkpoint(tmp_path / "ckpt") is not None
    cuda_state = worker.actor.model.state_dict()
    for name, tensor in on_cpu.actor.model.state_dict().items():
        assert tensor.device.type == "cpu" and torch.equal(tensor, cuda_state[name].cpu()), name
    assert CheckpointManager(tmp_path / "ckpt").steps() == [1]
    moments = [
        (state["exp_avg"], worker.actor.optimizer.state[p]["exp_avg"])
        for p, state in zip(worker.actor.optimizer.state, on_cpu.actor.optimizer.state.values(), strict=True)
    ]
    assert moments and all(torch.equal(loaded, saved.cpu()) for loaded, saved in moments)
    assert optimizer_state_devices(on_cpu.actor.optimizer) == {torch.device("cpu")}
