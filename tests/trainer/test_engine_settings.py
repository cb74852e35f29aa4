"""Engine settings from a recipe: a 3-step LoRA run; packed, padded and token-budget updates agree."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stratarl.assembly import datasets, roles
from stratarl.engine.actor import compute_log_probs
from stratarl.engine.hf_models import ModelSpec, load_causal_lm
from stratarl.engine.lora import base_state
from stratarl.engine.requests import UpdateRequest
from stratarl.observe.run_log import read_metrics
from stratarl.rollout.interface import SamplingParams
from stratarl.rollout.weight_sync import tensor_bytes
from stratarl.trainer.rl_trainer import RLTrainer
from tests.engine.tiny_batches import policy_gradient_loss
from tests.trainer.test_rl_trainer import small_config as rl_trainer_config


def small_config(task, *extra):
    """test_rl_trainer's small run at the recipe's learning rate, without validation."""
    return rl_trainer_config(task, "actor.lr=3e-4", "trainer.test_freq=0", *extra)


def test_three_lora_steps_from_a_recipe(task, tmp_path):
    """LoRA with the KL loss (so a reference is scored), padded layout and a token budget."""
    scorer = tmp_path / "digits.py"  # a reward with variance in every group, so the policy gradient is not 0
    scorer.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return sum(c.isdigit() for c in solution_str) / 8\n"
    )
    cfg = small_config(
        task,
        f"reward.custom_function_path={scorer}",
        "actor.lr=1e-2",
        "actor.use_kl_loss=true",
        "actor.lora.rank=4",
        "actor.lora.alpha=8",
        "actor.layout=padded",
        "actor.max_tokens_per_micro_batch=160",  # ≥ max_prompt_tokens (64) + max_response_tokens (8)
    )
    trainer = RLTrainer(cfg, tmp_path / "run")
    worker = trainer.worker.local_worker()
    actor = worker.actor
    assert (actor.batching.layout, actor.batching.max_tokens) == ("padded", 160)
    adapter_before = {n: p.detach().clone() for n, p in actor.model.named_parameters() if p.requires_grad}
    trainer.fit()

    assert worker.weight_version == 3
    assert adapter_before and all("lora_" in n for n in adapter_before)
    adapter_after = dict(actor.model.named_parameters())
    assert any(not torch.equal(adapter_after[n], p) for n, p in adapter_before.items()), "no adapter moved"
    base_model = load_causal_lm(
        ModelSpec(str(task["model"]))
    )  # the base under the adapter is still the directory's
    base_now = base_state(actor.lm.state_dict())
    assert all(torch.equal(base_now[n], t) for n, t in base_model.state_dict().items())

    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "train"]
    assert len(train) == 3 and all("actor/kl_loss" in r for r in train)
    assert train[-1]["actor/kl_loss"] > 0  # the adapted policy left the reference

    # the rollout serves the merged actor; the reference scores as the base model does
    merged = actor.export_weights()
    served = worker.rollout.model.state_dict()
    assert all(torch.equal(served[n], t) for n, t in merged.items())
    batch = sampled_batch(worker, task, trainer.tokenizer)
    expected, _ = compute_log_probs(base_model, batch, micro_batch_size=8, temperature=1.0)
    ref = worker.compute_ref_log_prob(batch)["ref_log_prob"]
    torch.testing.assert_close(ref, expected, atol=1e-5, rtol=0)

    report = worker.sync_weights()  # after the first sync, only the adapter moves
    assert report.num_bytes < tensor_bytes(merged) / 20

    final = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")  # a plain, merged model
    assert all(torch.equal(t, merged[n]) for n, t in final.state_dict().items())


def sampled_batch(worker, task, tokenizer, seed=0):
    """8 sampled trajectories of the first 4 prompts, with random advantages."""
    prompts = datasets.load_prompts([task["train"]], tokenizer, max_prompt_tokens=64, limit=4)
    batch = datasets.prompts_batch(prompts, [0, 1, 2, 3, 0, 1, 2, 3], tokenizer.pad_token_id)
    out = worker.generate(batch, SamplingParams(temperature=1.0, max_tokens=8), seed=seed)
    g = torch.Generator().manual_seed(seed)
    advantages = torch.randn(out["response_mask"].shape, generator=g) * out["response_mask"]
    return out.union(type(out).from_dict({"advantages": advantages}))


def test_packed_padded_and_token_budget_updates_agree(task):
    """One update on the same batch from three recipes (fp32). The clipped gradients agree to 1e-7
    (largest entry ~0.04); the parameter steps to 2 % of lr where the gradient is not near 0
    (Adam's first step lr·g/(|g| + ε) magnifies rounding on the few gradients near 0: measured up
    to 2.05e-6 on 1 of 16384 entries, which made a flat 2e-6 bound flaky)."""
    tokenizer = AutoTokenizer.from_pretrained(task["model"])
    variants = {
        "packed": [],
        "padded": ["actor.layout=padded"],
        "budget": ["actor.max_tokens_per_micro_batch=80", "actor.logit_chunk_size=7"],
    }
    workers = {
        name: roles.build_policy_worker(
            small_config(task, "actor.lr=1e-4", "actor.trajectories_per_micro_batch=2", *extra),
            tokenizer,
            total_steps=1,
        ).local_worker()
        for name, extra in variants.items()
    }
    batch = sampled_batch(workers["packed"], task, tokenizer)
    assert workers["budget"].actor.batching.max_tokens == 80
    deltas, grads, metrics = {}, {}, {}
    for name, worker in workers.items():
        before = {n: p.detach().clone() for n, p in worker.actor.model.named_parameters()}
        metrics[name] = worker.update_actor(batch, policy_gradient_loss, UpdateRequest(len(batch)))
        deltas[name] = {n: p.detach() - before[n] for n, p in worker.actor.model.named_parameters()}
        grads[name] = {n: p.grad for n, p in worker.actor.model.named_parameters()}  # clipped, kept
    assert metrics["packed"]["perf/padding_share/actor"] == 0 < metrics["padded"]["perf/padding_share/actor"]
    for name in ("padded", "budget"):
        torch.testing.assert_close(
            metrics[name]["grad_norm"], metrics["packed"]["grad_norm"], rtol=1e-5, atol=0
        )
        for param, grad in grads[name].items():
            torch.testing.assert_close(grad, grads["packed"][param], atol=1e-7, rtol=0, msg=param)
            # Adam's first step is lr·g/(|g| + ε) ≈ lr·sign(g): where |g| > 1e-6 the 1e-7 gradient
            # differences move it by < 1e-7; below that, rounding can flip it by up to 2·lr.
            settled = grads["packed"][param].abs() > 1e-6
            delta, packed = deltas[name][param], deltas["packed"][param]
            torch.testing.assert_close(delta[settled], packed[settled], atol=2e-6, rtol=0, msg=param)
            assert (delta - packed).abs().max() <= 2.01e-4, param
