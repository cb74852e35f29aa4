"""The training engine: response scoring, globally normalised accumulation, clipping, skipped steps."""

import copy
import math

import pytest
import torch

from stratarl.engine.actor import Actor, OptimizerSettings, Reference, compute_log_probs
from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.optim import build_lr_schedule, build_optimizer
from stratarl.engine.requests import ScoreRequest, UpdateRequest
from tests.engine.tiny_batches import V, policy_gradient_loss, ragged_batch, tiny_model


def grads_after_one_step(micro_batch_size: int = 8, **kwargs) -> list[torch.Tensor]:
    model = tiny_model()
    actor = Actor(
        model, optim=OptimizerSettings(lr=0.0, grad_clip=1e9), micro_batch_size=micro_batch_size, **kwargs
    )
    actor.update(ragged_batch(), policy_gradient_loss, UpdateRequest(mini_batch_size=8, with_entropy=True))
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


def test_sum_pi_squared_comes_from_the_same_forward_and_matches_a_plain_softmax():
    model, batch = tiny_model(), ragged_batch()
    actor = Actor(model, optim=OptimizerSettings(lr=0.0), micro_batch_size=3, temperature=0.7)
    out = actor.score_responses(batch, ScoreRequest(with_entropy=True, with_sum_pi_squared=True))
    torch.testing.assert_close(out["log_prob"], actor.compute_log_prob(batch)[0], atol=0, rtol=0)
    for i in range(len(batch)):
        keep = batch["attention_mask"][i].bool()
        ids = batch["input_ids"][i][keep]
        n_resp = int(batch["response_mask"][i].sum())
        probs = torch.softmax(model(input_ids=ids[None]).logits[0].float() / 0.7, -1)[-n_resp - 1 : -1]
        torch.testing.assert_close(
            out["sum_pi_squared"][i, :n_resp], (probs**2).sum(-1), atol=1e-5, rtol=1e-5
        )
        assert torch.all(out["sum_pi_squared"][i, n_resp:] == 0)
    assert "sum_pi_squared" not in actor.score_responses(batch)


def test_micro_batch_split_gives_the_same_gradient_as_one_pass():
    whole = grads_after_one_step(micro_batch_size=8)
    for k in (1, 2, 4):
        for a, b in zip(whole, grads_after_one_step(micro_batch_size=k), strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("max_tokens", [9, 14, 30])
def test_token_budget_micro_batches_give_the_same_gradient(max_tokens):
    whole = grads_after_one_step()  # rows 3..9 tokens long: a budget of 9 gives about one row each
    split = grads_after_one_step(max_tokens_per_micro_batch=max_tokens)
    for a, b in zip(whole, split, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_padded_layout_and_unchunked_head_give_the_same_gradient():
    packed = grads_after_one_step(micro_batch_size=3)
    padded = grads_after_one_step(micro_batch_size=3, layout="padded", logit_chunk_size=None)
    for a, b in zip(packed, padded, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_activation_checkpointing_gives_the_same_gradient():
    plain = grads_after_one_step(micro_batch_size=4)
    recomputed = grads_after_one_step(micro_batch_size=4, gradient_checkpointing=True)
    for a, b in zip(plain, recomputed, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_bf16_autocast_in_one_process_stays_close_to_fp32():
    model, batch = tiny_model(), ragged_batch()
    fp32 = Actor(model, optim=OptimizerSettings(lr=1e-2), micro_batch_size=4).compute_log_prob(batch)[0]
    actor = Actor(
        copy.deepcopy(model),
        optim=OptimizerSettings(lr=1e-2),
        micro_batch_size=4,
        data_parallel=DataParallel(param_dtype="bfloat16"),
    )
    bf16 = actor.compute_log_prob(batch)[0]
    assert 0 < (bf16 - fp32).abs().max() < 0.05  # bf16 keeps ~3 significant digits
    assert next(model.parameters()).dtype == torch.float32  # master weights stay fp32
    metrics = actor.update(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=8))
    assert math.isfinite(metrics["grad_norm"]) and metrics["skipped_steps"] == 0


def test_offloading_is_refused_where_there_is_no_accelerator():
    with pytest.raises(ValueError, match="GPU mesh"):
        DataParallel(offload_params=True)
    with pytest.raises(ValueError, match="param_dtype"):
        DataParallel(param_dtype="int8")


def test_update_changes_weights_and_reports_metrics():
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    actor = Actor(model, optim=OptimizerSettings(lr=1e-2), micro_batch_size=4)
    request = UpdateRequest(mini_batch_size=4, epochs=2, shuffle_seed=0)
    metrics = actor.update(ragged_batch(), policy_gradient_loss, request)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert set(metrics) >= {"pg_loss", "grad_norm", "lr", "skipped_steps"} and metrics["skipped_steps"] == 0
    assert metrics["perf/padding_share/actor"] == 0.0  # packed: no padding computed
    assert metrics["perf/mfu/actor"] > 0 and metrics["perf/max_memory_allocated_gb"] > 0
    assert metrics["perf/cpu_memory_used_gb"] > 0


def test_non_finite_gradient_skips_the_step_and_is_counted():
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    actor = Actor(model, optim=OptimizerSettings(lr=1e-2), micro_batch_size=8)

    def nan_loss(micro, scores, totals):
        return scores.log_prob.sum() * float("nan"), {}

    metrics = actor.update(ragged_batch(), nan_loss, UpdateRequest(mini_batch_size=8))
    assert metrics["skipped_steps"] == 1 and math.isnan(metrics["grad_norm"])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_reference_is_a_frozen_copy():
    model = tiny_model()
    reference = Reference.copy_of(model, micro_batch_size=4)
    actor = Actor(model, optim=OptimizerSettings(lr=1e-1), micro_batch_size=8)
    batch = ragged_batch()
    ref_before = reference.compute_log_prob(batch)
    actor.update(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=8))
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
