"""The training engine: response scoring, globally normalised accumulation, clipping, skipped steps."""

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from stratarl.algo.aggregation import aggregate_loss
from stratarl.engine.actor import Actor, BatchTotals, Reference, compute_log_probs
from stratarl.engine.optim import build_lr_schedule, build_optimizer
from stratarl.transport.data_proto import DataProto

P, T, V = 5, 4, 32


def tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    return Qwen2ForCausalLM(config)


def ragged_batch(n: int = 8, seed: int = 1) -> DataProto:
    """n rows: left-padded prompts of 2..P tokens, right-padded responses of 1..T tokens."""
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(2, P + 1, (n,), generator=g)
    response_len = torch.randint(1, T + 1, (n,), generator=g)
    prompt_mask = (torch.arange(P) >= P - prompt_len[:, None]).long()
    response_mask = (torch.arange(T) < response_len[:, None]).long()
    prompts = torch.randint(1, V, (n, P), generator=g) * prompt_mask
    responses = torch.randint(1, V, (n, T), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {
            "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
            "position_ids": position_ids, "responses": responses, "response_mask": response_mask,
            "advantages": torch.randn(n, T, generator=g) * response_mask,
        }
    )  # fmt: skip


def policy_gradient_loss(micro, scores, totals: BatchTotals):
    per_token = -micro["advantages"] * scores.log_prob
    loss = (
        aggregate_loss(
            per_token, micro["response_mask"], "token-mean", global_num_tokens=totals.num_tokens, dp_size=2
        )
        / 2
    )  # dp_size=2 with /2: the normaliser is the global count, whatever the rank count
    return loss, {"pg_loss": loss.item()}


def grads_after_one_step(micro_batch_size: int) -> list[torch.Tensor]:
    model = tiny_model()
    actor = Actor(model, lr=0.0, micro_batch_size=micro_batch_size, grad_clip=1e9)
    actor.update(ragged_batch(), policy_gradient_loss, mini_batch_size=8)
    return [p.grad.clone() for p in model.parameters()]


def test_log_probs_match_a_plain_forward_per_row():
    model, batch = tiny_model(), ragged_batch()
    log_prob, entropy = compute_log_probs(
        model, batch, micro_batch_size=3, temperature=0.7, with_entropy=True
    )
    for i in range(len(batch)):
        keep = batch["attention_mask"][i].bool()
        ids = batch["input_ids"][i][keep]  # the row without padding: prompt then response
        n_resp = int(batch["response_mask"][i].sum())
        logits = model(input_ids=ids[None]).logits[0].float() / 0.7
        expected = torch.log_softmax(logits[-n_resp - 1 : -1], -1).gather(-1, ids[-n_resp:, None]).squeeze(-1)
        torch.testing.assert_close(log_prob[i, :n_resp], expected, atol=1e-5, rtol=1e-5)
        assert torch.all(log_prob[i, n_resp:] == 0) and torch.all(entropy[i, n_resp:] == 0)
    assert entropy.max() <= math.log(V) + 1e-5


def test_micro_batch_split_gives_the_same_gradient_as_one_pass():
    whole = grads_after_one_step(micro_batch_size=8)
    for k in (1, 2, 4):
        for a, b in zip(whole, grads_after_one_step(micro_batch_size=k), strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_update_changes_weights_and_reports_metrics():
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    actor = Actor(model, lr=1e-2, micro_batch_size=4)
    metrics = actor.update(ragged_batch(), policy_gradient_loss, mini_batch_size=4, epochs=2, shuffle_seed=0)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert set(metrics) >= {"pg_loss", "grad_norm", "lr", "skipped_steps"} and metrics["skipped_steps"] == 0


def test_non_finite_gradient_skips_the_step_and_is_counted():
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    actor = Actor(model, lr=1e-2, micro_batch_size=8)

    def nan_loss(micro, scores, totals):
        return scores.log_prob.sum() * float("nan"), {}

    metrics = actor.update(ragged_batch(), nan_loss, mini_batch_size=8)
    assert metrics["skipped_steps"] == 1 and math.isnan(metrics["grad_norm"])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_reference_is_a_frozen_copy():
    model = tiny_model()
    reference = Reference.copy_of(model, micro_batch_size=4)
    actor = Actor(model, lr=1e-1, micro_batch_size=8)
    batch = ragged_batch()
    ref_before = reference.compute_log_prob(batch)
    actor.update(batch, policy_gradient_loss, mini_batch_size=8)
    torch.testing.assert_close(reference.compute_log_prob(batch), ref_before)
    assert not torch.allclose(actor.compute_log_prob(batch)[0], ref_before)
    assert not any(p.requires_grad for p in reference.model.parameters())


@pytest.mark.parametrize(
    ("schedule", "expected"),
    # warmup 2 of 6 steps: 0.5, 1.0, then constant 1 or cosine from 1 down to min ratio 0.1
    [("constant", [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]),
     ("cosine", [0.5, 1.0, 1.0, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)), 0.55,
                 0.1 + 0.9 * 0.5 * (1 + math.cos(3 * math.pi / 4))])],
)  # fmt: skip
def test_lr_schedule_warmup_then_constant_or_cosine(schedule, expected):
    opt = build_optimizer(tiny_model().parameters(), lr=1.0)
    sched = build_lr_schedule(opt, schedule=schedule, warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        sched.step()
    assert seen == pytest.approx(expected)
