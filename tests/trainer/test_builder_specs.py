"""The builders' specs carry settings to the workers that read them: the spec pickles unchanged;
mixed precision, micro-batching, LoRA, the rollout engine and the AdamW kernels reach the workers;
threads_per_worker sets this process's threads; trust_remote_code is what lets a model directory's own
code load."""

import json
import pickle
import shutil

import pytest
import torch
from transformers import AutoTokenizer

from stratarl.assembly import datasets, roles
from stratarl.cluster.policy_worker import PolicyWorker
from tests.trainer.test_engine_settings import sampled_batch
from tests.trainer.test_rl_trainer import small_config

SHIPPED_CODE = """
from transformers import Qwen2Config, Qwen2ForCausalLM


class ShippedConfig(Qwen2Config):
    model_type = "shipped_qwen2"


class ShippedForCausalLM(Qwen2ForCausalLM):
    config_class = ShippedConfig
"""


def test_the_spec_crosses_a_process_boundary_unchanged_and_builds_what_it_says(task):
    cfg = small_config(
        task,
        "actor.fsdp.param_dtype=bfloat16",
        "actor.trajectories_per_micro_batch=2",
        "actor.use_kl_loss=true",
        "reference.trajectories_per_micro_batch=3",
        "actor.lora.rank=4",
        "rollout.trajectories_per_generate_batch=5",
    )
    tokenizer = AutoTokenizer.from_pretrained(task["model"])
    spec = roles.policy_spec(cfg, tokenizer, total_steps=7)
    assert pickle.loads(pickle.dumps(spec)) == spec  # what a Ray rank receives
    assert (spec.model.device, spec.precision.param_dtype, spec.actor.optimizer.total_steps) == (
        "cpu",
        "bfloat16",
        7,
    )
    worker = PolicyWorker(spec)
    assert worker.actor.dp.autocast_dtype == torch.bfloat16  # in one process: autocast over fp32 weights
    assert next(worker.actor.model.parameters()).dtype == torch.float32
    assert (worker.actor.micro_batch_size, worker.reference.micro_batch_size) == (2, 3)
    assert worker.reference.module is worker.actor.module  # LoRA: the base under the adapter
    assert worker.rollout._core.max_num_seqs == 5

    # mixed precision does something: bf16 log-probs are near, not equal to, the fp32 ones
    fp32 = PolicyWorker(roles.policy_spec(small_config(task), tokenizer, total_steps=7))
    batch = sampled_batch(fp32, task, tokenizer)
    low, full = worker.compute_log_prob(batch)["old_log_probs"], fp32.compute_log_prob(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    difference = (low[mask] - full[mask]).abs()
    assert 1e-4 < difference.max() < 0.2, difference.max()


def test_the_adamw_kernels_of_the_config_reach_the_actor_and_the_critic(task):
    cfg = small_config(
        task, "actor.adamw_impl=fused", "algorithm.adv_estimator=gae", "critic.adamw_impl=foreach"
    )
    tokenizer = AutoTokenizer.from_pretrained(task["model"])
    actor = roles.build_policy_worker(cfg, tokenizer, total_steps=1).local_worker().actor
    critic = roles.build_critic_worker(cfg, total_steps=1).local_worker().critic
    assert (actor.optimizer.defaults["fused"], actor.optimizer.defaults["foreach"]) == (True, False)
    assert (critic.optimizer.defaults["fused"], critic.optimizer.defaults["foreach"]) == (False, True)
    default = roles.policy_spec(small_config(task), tokenizer, total_steps=1)
    assert PolicyWorker(default).actor.optimizer.defaults["foreach"] is None  # auto: torch chooses


def test_threads_per_worker_sets_the_threads_of_this_process_in_process(task):
    before = torch.get_num_threads()
    try:
        cfg = small_config(task, "cluster.threads_per_worker=1")
        roles.build_policy_worker(cfg, AutoTokenizer.from_pretrained(task["model"]), total_steps=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def shipped_code_model(task, tmp_path):
    """The task's model, declaring a model class whose code ships inside its directory."""
    model_dir = tmp_path / "shipped"
    shutil.copytree(task["model"], model_dir)
    (model_dir / "shipped.py").write_text(SHIPPED_CODE)
    config = json.loads((model_dir / "config.json").read_text())
    config["model_type"] = "shipped_qwen2"
    config["auto_map"] = {
        "AutoConfig": "shipped.ShippedConfig",
        "AutoModelForCausalLM": "shipped.ShippedForCausalLM",
    }
    (model_dir / "config.json").write_text(json.dumps(config))
    return model_dir


def test_trust_remote_code_is_read_where_the_model_and_tokenizer_load(task, shipped_code_model):
    cfg = small_config(task, f"model.path={shipped_code_model}")
    with pytest.raises(ValueError, match="trust_remote_code"):  # the model's code may not run
        roles.build_policy_worker(cfg, AutoTokenizer.from_pretrained(task["model"]), total_steps=1)
    trusted = small_config(task, f"model.path={shipped_code_model}", "model.trust_remote_code=true")
    tokenizer = datasets.load_tokenizer(trusted)
    worker = roles.build_policy_worker(trusted, tokenizer, total_steps=1).local_worker()
    assert type(worker.actor.lm).__name__ == type(worker.rollout.model).__name__ == "ShippedForCausalLM"
