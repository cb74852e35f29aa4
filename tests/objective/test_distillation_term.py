"""The actor's loss with distillation: L_task + c·L_distill with task rewards, L_distill alone without,
the teacher's log-probs read from the batch, and the gradient of k3 towards the teacher."""

import math

import pytest
import torch

from stratarl.engine.forward import ResponseScores
from stratarl.engine.training import BatchTotals
from stratarl.objective.actor_loss import ActorLoss
from stratarl.objective.distillation_term import DistillationTerm
from stratarl.transport.data_proto import DataProto

MASK = torch.tensor([[1.0, 1.0, 0.0]])
STUDENT = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
TEACHER = torch.tensor([[-2.0, -2.0, -9.0]], dtype=torch.float64)  # Δ = (1, 0); the masked 3rd ignored
K3 = math.exp(-1.0)  # token 1: e^−1 + 1 − 1; token 2: 0


def micro() -> DataProto:
    return DataProto.from_dict(
        {
            "response_mask": MASK,
            "old_log_probs": STUDENT.clone(),
            "advantages": torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64),
            "teacher_log_prob": TEACHER,
        }
    )


def loss_of(term, log_prob):
    scores = ResponseScores(log_prob=log_prob, entropy=None)
    return ActorLoss(distillation=term)(micro(), scores, BatchTotals(num_tokens=2, num_sequences=1))


def test_task_loss_plus_the_weighted_distillation_loss():
    # on-policy PPO with A = 1: ℓ_pg = −1 per token → token-mean −1; k3 token-mean = e^−1 / 2
    loss, metrics = loss_of(DistillationTerm(distillation_loss_coef=0.5), STUDENT.clone())
    assert loss.item() == pytest.approx(-1.0 + 0.5 * K3 / 2)
    assert metrics["distillation/loss"] == pytest.approx(K3 / 2)
    assert metrics["actor/pg_loss"] == pytest.approx(-1.0)


def test_without_task_rewards_only_the_distillation_loss_trains():
    log_prob = STUDENT.clone().requires_grad_(True)
    loss, _ = loss_of(DistillationTerm(use_task_rewards=False, distillation_loss_coef=0.5), log_prob)
    assert loss.item() == pytest.approx(K3 / 2)  # coef unused, the task's −1 gone
    loss.backward()
    # ∂k3/∂log π = 1 − exp(−Δ): token 1: 1 − e^−1, token 2: 0; over 2 tokens; the masked token: 0
    expected = torch.tensor([[(1 - math.exp(-1.0)) / 2, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(log_prob.grad, expected, rtol=0, atol=1e-12)


def test_the_loss_declares_that_it_reads_the_teacher():
    assert "teacher_log_prob" in ActorLoss(distillation=DistillationTerm()).reads
    assert "teacher_log_prob" not in ActorLoss().reads


def test_the_top_k_loss_reads_the_student_at_the_teacher_ids():
    # one token, K = 2: π_T = (0.5, 0.25), log π_θ at those ids = log(0.25, 0.25):
    # ℓ = 0.5·(ln 0.5 − ln 0.25) + 0.25·(ln 0.25 − ln 0.25) = 0.5·ln 2
    import math as m

    teacher = torch.log(torch.tensor([[[0.5, 0.25]]]))
    batch = DataProto.from_dict(
        {
            "response_mask": torch.tensor([[1.0]]),
            "old_log_probs": torch.tensor([[-1.0]]),
            "advantages": torch.tensor([[0.0]]),
            "teacher_log_prob": torch.tensor([[-1.0]]),
            "teacher_top_k_ids": torch.tensor([[[3, 1]]]),
            "teacher_top_k_log_probs": teacher,
        }
    )
    scores = ResponseScores(
        log_prob=torch.tensor([[-1.0]]),
        entropy=None,
        top_k_log_probs=torch.log(torch.tensor([[[0.25, 0.25]]])),
        top_k_ids=torch.tensor([[[1, 0]]]),
    )
    term = DistillationTerm(loss_mode="forward_kl_topk", use_task_rewards=False)
    loss, metrics = ActorLoss(distillation=term)(batch, scores, BatchTotals(num_tokens=1, num_sequences=1))
    assert loss.item() == pytest.approx(0.5 * m.log(2.0))
    assert metrics["distillation/teacher_mass"] == pytest.approx(0.75)
    assert metrics["distillation/student_mass"] == pytest.approx(0.5)
    assert metrics["distillation/overlap_ratio"] == pytest.approx(0.5)  # id 1 shared of K = 2
