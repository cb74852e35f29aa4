"""LoRA adapter-only weight sync into the torch engine: merged weights served exactly, only A and B move."""

import copy

import pytest
import torch

from stratarl.engine.lora import adapter_update, apply_lora, base_state, lora_scalings, merge_lora_state
from stratarl.rollout.interface import GenerationRequest, SamplingParams
from stratarl.rollout.torch_engine import TorchRolloutEngine
from stratarl.rollout.weight_sync import WeightSyncError, tensor_bytes
from tests.rollout.tiny_lm import EOS, PAD, build_tiny_qwen2

TARGETS = ["q_proj", "v_proj"]  # 2 layers × 2 modules = 4 adapted matrices


def randomize_adapter(peft_model, seed):
    """Give every A and B random values (B starts at 0), so the adapter changes the model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.3)


def snapshot(peft_model):
    """(the adapter update, the merged HF state dict) of a peft model now."""
    lm = peft_model.get_base_model()
    state = {k: v.detach().clone() for k, v in lm.state_dict().items()}
    scalings = lora_scalings(lm)
    return adapter_update(state, scalings), merge_lora_state(state, scalings)


@pytest.fixture()
def setup():
    base = build_tiny_qwen2(seed=0)
    engine = TorchRolloutEngine(copy.deepcopy(base), eos_token_ids=EOS, pad_token_id=PAD, seed=0)
    policy = apply_lora(copy.deepcopy(base), rank=4, alpha=8, target_modules=TARGETS)
    randomize_adapter(policy, seed=1)
    return engine, policy


def assert_serves(engine, merged):
    served = engine.model.state_dict()
    for name, tensor in merged.items():
        assert torch.equal(served[name], tensor), name


def greedy(engine, prompts):
    sampling = SamplingParams(temperature=0.0, max_tokens=6)
    requests = [GenerationRequest(str(i), p, sampling) for i, p in enumerate(prompts)]
    return [(r.response_ids, r.log_probs) for r in engine.generate(requests)]


def test_first_load_brings_the_base_later_loads_only_the_adapter(setup):
    engine, policy = setup
    update, merged = snapshot(policy)
    base = base_state(policy.get_base_model().state_dict())

    first = engine.load_adapter(update, 1, base=base)
    assert first.version == engine.weight_version == 1
    assert first.num_bytes == tensor_bytes(base) + update.num_bytes
    assert_serves(engine, merged)

    randomize_adapter(policy, seed=2)  # the trainer's next step moves A and B only
    update, merged = snapshot(policy)
    second = engine.load_adapter(update, 2)
    assert second.version == engine.weight_version == 2
    assert second.num_tensors == second.num_changed == 4  # the 4 adapted matrices, nothing else
    # r·(d_in + d_out) numbers per matrix: q 4·(32+32), v 4·(32+16), fp32, 2 layers
    assert second.num_bytes == update.num_bytes == 2 * 4 * (4 * 64 + 4 * 48)
    assert second.num_bytes < first.num_bytes / 20
    assert_serves(engine, merged)


def test_after_adapter_syncs_the_engine_generates_as_the_merged_model(setup):
    engine, policy = setup
    update, _ = snapshot(policy)
    engine.load_adapter(update, 1, base=base_state(policy.get_base_model().state_dict()))
    randomize_adapter(policy, seed=3)
    update, _ = snapshot(policy)
    engine.load_adapter(update, 2)
    merged_model = copy.deepcopy(policy).merge_and_unload()  # peft's own merge, an independent path
    plain = TorchRolloutEngine(merged_model, eos_token_ids=EOS, pad_token_id=PAD, seed=0)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [20]]
    ours, expected = greedy(engine, prompts), greedy(plain, prompts)
    for (ids, log_probs), (ids_expected, log_probs_expected) in zip(ours, expected, strict=True):
        assert ids == ids_expected
        torch.testing.assert_close(
            torch.tensor(log_probs), torch.tensor(log_probs_expected), atol=1e-5, rtol=0
        )


def test_an_adapter_without_base_weights_is_refused_and_nothing_loads(setup):
    engine, policy = setup
    update, _ = snapshot(policy)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    with pytest.raises(WeightSyncError, match="base="):
        engine.load_adapter(update, 1)
    assert engine.weight_version == 0
    assert all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())


def test_an_adapter_on_other_modules_than_the_first_is_refused(setup):
    engine, policy = setup
    update, _ = snapshot(policy)
    engine.load_adapter(update, 1, base=base_state(policy.get_base_model().state_dict()))
    other = apply_lora(build_tiny_qwen2(seed=0), rank=4, alpha=8, target_modules=["k_proj"])
    other_update, _ = snapshot(other)
    with pytest.raises(WeightSyncError, match="k_proj"):
        engine.load_adapter(other_update, 2)
    assert engine.weight_version == 1
