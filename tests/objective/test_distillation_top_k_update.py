"""forward_kl_topk through the real engine: the teacher's top-k ids and log-probs from its forward,
the student's log-probs at those ids from the actor's update forward, and the update's loss and
gradient equal the algo function computed by hand from plain HF forwards of both tiny models."""

import pytest
import torch

from stratarl.algo.aggregation import aggregate_loss
from stratarl.algo.distillation.top_k import forward_kl_top_k
from stratarl.engine.actor import Actor, OptimizerSettings, Reference
from stratarl.engine.requests import ScoreRequest, UpdateRequest
from stratarl.engine.training import BatchTotals
from stratarl.objective.actor_loss import ActorLoss
from stratarl.objective.distillation_term import DistillationTerm
from tests.engine.tiny_batches import ragged_batch, tiny_model

K, TAU, CLAMP = 4, 0.7, -6.0


def plain_response_log_softmax(model, batch, i):
    """[n_resp, V] log π over the vocabulary at row i's response positions, one plain HF forward."""
    keep = batch["attention_mask"][i].bool()
    ids = batch["input_ids"][i][keep]
    n_resp = int(batch["response_mask"][i].sum())
    logits = model(input_ids=ids[None]).logits[0].float() / TAU
    return torch.log_softmax(logits[-n_resp - 1 : -1], dim=-1)


def teacher_columns(teacher, batch):
    reference = Reference(teacher, micro_batch_size=3, temperature=TAU, logit_chunk_size=5)
    out = reference.score_responses(batch, ScoreRequest(top_k=K))
    return {f"teacher_{name}": column for name, column in out.items()}


def test_the_teacher_hands_over_its_plain_top_k_at_every_response_token():
    teacher, batch = tiny_model(seed=1), ragged_batch()
    columns = teacher_columns(teacher, batch)
    assert (
        columns["teacher_top_k_ids"].shape == (8, 4, K) and columns["teacher_top_k_ids"].dtype == torch.long
    )
    for i in range(len(batch)):
        n = int(batch["response_mask"][i].sum())
        top = plain_response_log_softmax(teacher, batch, i).topk(K, dim=-1)
        assert torch.equal(columns["teacher_top_k_ids"][i, :n], top.indices)
        torch.testing.assert_close(
            columns["teacher_top_k_log_probs"][i, :n], top.values, atol=1e-5, rtol=1e-5
        )
        assert torch.all(columns["teacher_top_k_log_probs"][i, n:] == 0)  # 0 outside the mask
        labels = batch["responses"][i, :n, None]
        expected = plain_response_log_softmax(teacher, batch, i).gather(-1, labels).squeeze(-1)
        torch.testing.assert_close(columns["teacher_log_prob"][i, :n], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_the_update_loss_and_gradient_are_the_algo_function_of_both_forwards(layout):
    student, teacher, batch = tiny_model(seed=0), tiny_model(seed=1), ragged_batch()
    batch = batch.union(type(batch).from_dict(teacher_columns(teacher, batch)))
    term = DistillationTerm(loss_mode="forward_kl_topk", use_task_rewards=False, log_prob_min_clamp=CLAMP)
    loss_fn = ActorLoss(distillation=term, old_log_prob_from_forward=True)
    actor = Actor(student, optim=OptimizerSettings(lr=0.0, grad_clip=1e9), micro_batch_size=3,
                  temperature=TAU, logit_chunk_size=5, layout=layout)  # fmt: skip
    request = UpdateRequest(mini_batch_size=8, score_at_ids=loss_fn.scores_at_ids)
    assert request.score_at_ids == "teacher_top_k_ids"
    metrics = actor.update(batch, loss_fn, request)
    engine_grad = student.lm_head.weight.grad.clone()

    # by hand: the student's log-softmax at the teacher's ids, the algo's ℓ_t, a token-mean over all rows
    reference = tiny_model(seed=0)
    mask = batch["response_mask"]
    student_at = torch.zeros(*mask.shape, K)
    for i in range(len(batch)):
        n = int(mask[i].sum())
        student_at[i, :n] = plain_response_log_softmax(reference, batch, i).gather(
            -1, batch["teacher_top_k_ids"][i, :n]
        )
    per_token = forward_kl_top_k(
        student_top_k_log_probs=student_at,
        teacher_top_k_log_probs=batch["teacher_top_k_log_probs"],
        log_prob_min_clamp=CLAMP,
    )
    expected = aggregate_loss(per_token, mask, "token-mean", global_num_tokens=int(mask.sum()))
    expected.backward()
    assert metrics["distillation/loss"] == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    assert expected.item() > 0  # two different random models
    torch.testing.assert_close(engine_grad, reference.lm_head.weight.grad, rtol=1e-4, atol=1e-6)
    for name in ("student_mass", "teacher_mass", "overlap_ratio", "overlap_token_advantage"):
        assert f"distillation/{name}" in metrics
    assert 0 < metrics["distillation/teacher_mass"] <= 1 and 0 <= metrics["distillation/overlap_ratio"] <= 1


def test_the_top_k_term_reads_the_teacher_top_k_and_asks_the_forward_for_it():
    loss_fn = ActorLoss(distillation=DistillationTerm(loss_mode="forward_kl_topk"))
    assert {"teacher_top_k_ids", "teacher_top_k_log_probs"} <= set(loss_fn.reads)
    assert ActorLoss(distillation=DistillationTerm()).scores_at_ids is None
    assert BatchTotals(num_tokens=1, num_sequences=1).dp_size == 1
