"""LoRA actors: only adapters train, the reference is the base model, merged export and adapter sync agree."""

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from stratarl.engine.actor import Actor, OptimizerSettings, Reference, compute_log_probs
from stratarl.engine.lora import apply_adapter_update, apply_lora, base_state, lora_scalings, merge_lora_state
from stratarl.engine.requests import UpdateRequest
from tests.engine.tiny_batches import policy_gradient_loss, ragged_batch, tiny_model


@pytest.fixture(scope="module")
def trained():
    """A LoRA actor after two updates with a large lr (so the adapter is far from 0), and its base."""
    base = tiny_model(layers=2)
    original = copy.deepcopy(base)
    model = apply_lora(base, rank=4, alpha=8, target_modules=["q_proj", "v_proj", "up_proj"])
    actor = Actor(model, optim=OptimizerSettings(lr=5e-2), micro_batch_size=4)
    batch = ragged_batch()
    for _ in range(2):
        actor.update(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=8))
    return actor, original, batch


def test_only_adapter_weights_change(trained):
    actor, original, _ = trained
    trainable = {n for n, p in actor.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    for name, tensor in base_state(actor.lm.state_dict()).items():
        torch.testing.assert_close(tensor, original.state_dict()[name], atol=0, rtol=0)


def test_reference_is_the_base_model_with_the_adapter_disabled(trained):
    actor, original, batch = trained
    reference = Reference.base_of(actor)
    assert reference.module is actor.module  # no second copy of the weights
    expected, _ = compute_log_probs(original, batch, micro_batch_size=8, temperature=1.0)
    torch.testing.assert_close(reference.compute_log_prob(batch), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(actor.compute_log_prob(batch)[0], expected, atol=1e-3)
    assert actor.compute_log_prob(batch)[0].requires_grad is False
    # the reference's own micro-batching (reference.* keys) gives the same numbers, one row at a time
    own = Reference.base_of(actor, micro_batch_size=1, max_tokens_per_micro_batch=64, layout="padded")
    assert (own.batching.micro_batch_size, own.batching.max_tokens, own.batching.layout) == (1, 64, "padded")
    assert own.module is actor.module and actor.batching.layout == "packed"
    torch.testing.assert_close(own.compute_log_prob(batch), expected, atol=1e-5, rtol=1e-5)


def test_merged_export_equals_peft_merge_and_loads_into_the_plain_model(trained):
    actor, _, batch = trained
    exported = actor.export_weights()
    merged_by_peft = copy.deepcopy(actor.model).merge_and_unload().state_dict()
    assert set(exported) == set(merged_by_peft)
    for name, tensor in merged_by_peft.items():
        torch.testing.assert_close(exported[name], tensor, atol=1e-6, rtol=1e-6)
    plain = tiny_model(seed=5, layers=2)
    plain.load_state_dict(exported)
    plain_lp, _ = compute_log_probs(plain, batch, micro_batch_size=8, temperature=1.0)
    torch.testing.assert_close(plain_lp, actor.compute_log_prob(batch)[0], atol=1e-5, rtol=1e-5)


def test_adapter_only_sync_rebuilds_the_merged_weights_from_the_base(trained):
    actor, original, _ = trained
    update = actor.export_adapter()
    full = actor.export_weights()
    rebuilt = apply_adapter_update(original.state_dict(), update)
    for name, tensor in full.items():
        torch.testing.assert_close(rebuilt[name], tensor, atol=1e-6, rtol=1e-6)
    full_bytes = sum(t.numel() * t.element_size() for t in full.values())
    assert set(update.lora_a) == set(lora_scalings(actor.lm)) and update.num_bytes < full_bytes / 5


def test_merge_uses_peft_scaling_including_rslora():
    model = get_peft_model(
        tiny_model(),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], use_rslora=True, init_lora_weights=False),
    )
    scaling = lora_scalings(model.get_base_model())
    assert list(scaling.values()) == [pytest.approx(8 / 4**0.5)]  # one module; rsLoRA: α/√r = 4
    merged = merge_lora_state(model.get_base_model().state_dict(), scaling)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, atol=1e-6, rtol=1e-6)


def test_hf_export_of_a_lora_actor_loads_with_from_pretrained(trained, tmp_path):
    actor, _, batch = trained
    actor.save_hf(tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    lp, _ = compute_log_probs(loaded, batch, micro_batch_size=8, temperature=1.0)
    torch.testing.assert_close(lp, actor.compute_log_prob(batch)[0], atol=1e-5, rtol=1e-5)
