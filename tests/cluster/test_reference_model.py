"""reference.model_path: the reference scores with that model (not the actor's start), with LoRA
too, and a reference whose vocabulary differs from the actor's is refused naming the key."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stratarl.apps.quickstart import RECIPE
from stratarl.assembly import datasets, roles
from stratarl.config import load_config, validate_config
from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
from stratarl.data.tiny_models import build_tiny_model
from stratarl.data.tokenizer_factory import corpus_from_parquet
from stratarl.engine.actor import Reference
from stratarl.engine.hf_models import ModelSpec, load_causal_lm
from stratarl.rollout.interface import SamplingParams


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference_task")
    paths = make_arithmetic_dataset(root / "data", n_train=16, n_test=4, digits=1, seed=0)
    corpus = corpus_from_parquet([paths["train"]])
    return {
        "train": paths["train"],
        "actor": build_tiny_model(root / "actor", size="1m", corpus_texts=corpus, seed=0),
        "other": build_tiny_model(root / "other", size="1m", corpus_texts=corpus, seed=1),
        "other_vocab": wider_vocabulary(root / "other", root / "vocab"),
    }


def wider_vocabulary(model_dir, out_dir):
    """`model_dir`'s model with 64 more embedding rows: a model of another tokenizer."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.resize_token_embeddings(model.get_input_embeddings().weight.shape[0] + 64)
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out_dir)
    return out_dir


def worker_for(task, *extra):
    cfg = load_config(
        RECIPE,
        [
            f"data.train_files=[{task['train']}]",
            f"model.path={task['actor']}",
            "actor.use_kl_loss=true",
            *extra,
        ],
    )
    validate_config(cfg, check_paths=False)
    tokenizer = AutoTokenizer.from_pretrained(task["actor"])
    return roles.build_policy_worker(cfg, tokenizer, total_steps=2).local_worker(), tokenizer


def sampled(worker, task, tokenizer):
    prompts = datasets.load_prompts([task["train"]], tokenizer, max_prompt_tokens=64, limit=4)
    batch = datasets.prompts_batch(prompts, [0, 1, 2, 3], tokenizer.pad_token_id)
    return worker.generate(batch, SamplingParams(temperature=1.0, max_tokens=6), seed=0)


def expected_ref_log_prob(model_dir, batch, temperature):
    reference = Reference(
        load_causal_lm(ModelSpec(str(model_dir))), micro_batch_size=4, temperature=temperature
    )
    return reference.compute_log_prob(batch)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_reference_is_the_named_model(task, lora):
    extra = ["actor.lora.rank=4", "actor.lora.alpha=8"] if lora else []
    worker, tokenizer = worker_for(task, f"reference.model_path={task['other']}", *extra)
    batch = sampled(worker, task, tokenizer)
    got = worker.compute_ref_log_prob(batch)["ref_log_prob"]
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(
        got[mask],
        expected_ref_log_prob(task["other"], batch, worker.actor.temperature)[mask],
        atol=1e-5,
        rtol=0,
    )
    start = expected_ref_log_prob(task["actor"], batch, worker.actor.temperature)
    assert (got[mask] - start[mask]).abs().max() > 1e-2, "scored with the actor's start, not the named model"


def test_without_a_path_the_reference_is_the_actors_start(task):
    worker, tokenizer = worker_for(task)
    batch = sampled(worker, task, tokenizer)
    got = worker.compute_ref_log_prob(batch)["ref_log_prob"]
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(
        got[mask],
        expected_ref_log_prob(task["actor"], batch, worker.actor.temperature)[mask],
        atol=1e-5,
        rtol=0,
    )


def test_a_reference_with_another_vocabulary_is_refused_naming_the_key(task):
    with pytest.raises(ValueError, match=r"reference\.model_path=.*vocabulary"):
        worker_for(task, f"reference.model_path={task['other_vocab']}")
