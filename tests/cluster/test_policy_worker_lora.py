"""PolicyWorker from a recipe with LoRA: adapter-only training and sync, base reference, merged save."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stratarl.apps.quickstart import RECIPE
from stratarl.assembly import datasets, roles
from stratarl.cluster.policy_worker import PolicyWorker
from stratarl.config import load_config, validate_config
from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
from stratarl.data.tiny_models import build_tiny_model
from stratarl.data.tokenizer_factory import corpus_from_parquet
from stratarl.engine.actor import compute_log_probs
from stratarl.engine.hf_models import ModelSpec, load_causal_lm
from stratarl.engine.lora import base_state
from stratarl.engine.requests import UpdateRequest
from stratarl.rollout.interface import SamplingParams
from stratarl.rollout.weight_sync import tensor_bytes
from tests.engine.tiny_batches import policy_gradient_loss

TARGETS = "[q_proj,k_proj,v_proj,o_proj]"  # attention only: 4 layers × 4 matrices


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_task")
    paths = make_arithmetic_dataset(root / "data", n_train=16, n_test=4, digits=1, seed=0)
    model = build_tiny_model(root / "model", size="1m", corpus_texts=corpus_from_parquet([paths["train"]]))
    return {"train": paths["train"], "model": model}


def lora_worker(task, *extra) -> tuple[PolicyWorker, object]:
    cfg = load_config(
        RECIPE,
        [
            f"data.train_files=[{task['train']}]",
            f"model.path={task['model']}",
            "actor.use_kl_loss=true",  # a reference is built
            "actor.lora.rank=4",
            "actor.lora.alpha=8",
            f"actor.lora.target_modules={TARGETS}",
            "actor.lr=5e-2",  # large, so that the adapter moves far from B = 0 in two updates
            *extra,
        ],
    )
    validate_config(cfg, check_paths=False)
    tokenizer = AutoTokenizer.from_pretrained(task["model"])
    return roles.build_policy_worker(cfg, tokenizer, total_steps=3).local_worker(), tokenizer


def rollout_batch(worker, task, tokenizer, seed=0):
    """8 sampled trajectories of the first 4 prompts, with random advantages for the update."""
    prompts = datasets.load_prompts([task["train"]], tokenizer, max_prompt_tokens=64, limit=4)
    batch = datasets.prompts_batch(prompts, [0, 1, 2, 3, 0, 1, 2, 3], tokenizer.pad_token_id)
    out = worker.generate(batch, SamplingParams(temperature=1.0, max_tokens=6), seed=seed)
    g = torch.Generator().manual_seed(seed)
    advantages = torch.randn(out["response_mask"].shape, generator=g) * out["response_mask"]
    return out.union(type(out).from_dict({"advantages": advantages}))


def test_lora_worker_trains_adapters_syncs_only_them_and_saves_merged(task, tmp_path):
    worker, tokenizer = lora_worker(task)
    actor = worker.actor
    trainable = [n for n, p in actor.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert worker.reference.module is actor.module  # the reference is the actor with the adapter off

    base_model = load_causal_lm(ModelSpec(str(task["model"])))
    batch = rollout_batch(worker, task, tokenizer)
    for _ in range(2):
        worker.update_actor(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=len(batch)))
    full = worker.sync_weights()  # first sync: base weights + adapter
    full_bytes = tensor_bytes(actor.export_weights())
    assert full.num_bytes > full_bytes  # every base tensor, plus the adapter

    worker.update_actor(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=len(batch)))
    adapter = worker.sync_weights()  # later syncs: A and B only
    assert adapter.version == 2 and adapter.num_tensors == 16
    # 16 matrices · r·(d_in + d_out): q, o 4·(128+128), k, v 4·(128+64), fp32
    assert adapter.num_bytes == 4 * 4 * (2 * 4 * 256 + 2 * 4 * 192) == 57344  # layers · bytes · numbers
    assert adapter.num_bytes < full_bytes / 40  # 56 KiB against ~3.4 MB

    # the rollout serves exactly the merged actor, and scores its samples as the actor does
    merged = actor.export_weights()
    served = worker.rollout.model.state_dict()
    assert all(torch.equal(served[name], tensor) for name, tensor in merged.items())
    fresh = rollout_batch(worker, task, tokenizer, seed=7)
    actor_log_prob = worker.compute_log_prob(fresh)["old_log_probs"]
    torch.testing.assert_close(fresh["rollout_log_probs"], actor_log_prob, atol=1e-4, rtol=0)

    # only the adapter moved: the base under it is the model directory's, and so is the reference
    base_now = base_state(actor.lm.state_dict())
    assert all(torch.equal(base_now[name], tensor) for name, tensor in base_model.state_dict().items())
    expected, _ = compute_log_probs(base_model, fresh, micro_batch_size=8, temperature=1.0)
    torch.testing.assert_close(
        worker.compute_ref_log_prob(fresh)["ref_log_prob"], expected, atol=1e-5, rtol=0
    )
    assert not torch.allclose(actor_log_prob, expected, atol=1e-2)

    saved = AutoModelForCausalLM.from_pretrained(worker.save_pretrained(tmp_path / "hf"))
    for name, tensor in saved.state_dict().items():
        assert torch.equal(tensor, merged[name]), name


def test_without_lora_the_reference_is_a_copy_with_its_own_engine_settings(task):
    worker, _ = lora_worker(
        task,
        "actor.lora.rank=0",
        "reference.trajectories_per_micro_batch=3",
        "reference.max_tokens_per_micro_batch=200",
        "reference.layout=padded",
        "reference.logit_chunk_size=null",
        "model.gradient_checkpointing=true",
        "rollout.weight_sharing=copy",  # the engine's own copy: the full weights travel
    )
    assert worker.reference.module is not worker.actor.module
    batching = worker.reference.batching
    assert (batching.micro_batch_size, batching.max_tokens, batching.layout) == (3, 200, "padded")
    assert worker.reference.module.logit_chunk_size is None
    assert worker.actor.lm.is_activation_checkpointing
    report = worker.sync_weights()
    assert report.num_bytes == tensor_bytes(worker.actor.export_weights())
