"""Checks the on-policy distillation losses: hand values of each loss_mode, the top-k forward KL's
clamps, masses, overlap and gradient, the supervised and policy-gradient compositions (value,
clamp, gradient), the combination with the task loss, and the registry's names and errors."""

import math

import pytest
import torch

from stratarl.algo.distillation import (
    DISTILLATION_LOSSES,
    distillation_loss,
    get_distillation_loss,
    sampled_token_abs_mean,
    with_task_loss,
)
from stratarl.algo.distillation.top_k import forward_kl_top_k, student_log_probs_at, top_k_diagnostics

# Δ = log π_θ − log π_T = [1, 0, −1.5]
STUDENT = torch.tensor([[0.0, -1.0, -2.0]], dtype=torch.float64)
TEACHER = torch.tensor([[-1.0, -1.0, -0.5]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("k1", [1.0, 0.0, -1.5]),  # Δ
        ("kl", [1.0, 0.0, -1.5]),
        ("abs", [1.0, 0.0, 1.5]),  # |Δ|
        ("k2", [0.5, 0.0, 1.125]),  # ½Δ²
        ("mse", [0.5, 0.0, 1.125]),
        ("k3", [math.exp(-1.0), 0.0, math.exp(1.5) - 2.5]),  # e^−Δ + Δ − 1
        ("low_var_kl", [math.exp(-1.0), 0.0, math.exp(1.5) - 2.5]),
    ],
)
def test_sampled_token_losses_by_hand(mode, expected):
    loss = get_distillation_loss(mode)
    assert not loss.uses_top_k
    got = loss.fn(log_prob=STUDENT, teacher_log_prob=TEACHER)
    torch.testing.assert_close(got, torch.tensor([expected], dtype=torch.float64), rtol=0, atol=1e-12)


def test_k1_only_teaches_as_a_reward():
    # ∇k1 = ∇log π_θ whatever the teacher says: backpropagating it directly is refused at config time.
    assert [n for n, d in DISTILLATION_LOSSES.items() if not d.teaches_when_backpropagated] == ["k1", "kl"]


def _log(*probs):
    return torch.tensor([[list(map(math.log, probs))]], dtype=torch.float64)  # [1, 1, K]


def test_forward_kl_top_k_by_hand():
    # π_T = (.5, .25), π_θ = (.25, .25): .5·ln(.5/.25) + .25·ln 1 = .5 ln 2
    got = forward_kl_top_k(student_top_k_log_probs=_log(0.25, 0.25), teacher_top_k_log_probs=_log(0.5, 0.25))
    torch.testing.assert_close(got, torch.tensor([[0.5 * math.log(2)]]), rtol=1e-6, atol=0)
    # π_θ = (.7, .2): .5 ln(5/7) + .25 ln(1.25) = −0.16824 + 0.05579 < 0, clamped to 0 (truncated sum)
    got = forward_kl_top_k(student_top_k_log_probs=_log(0.7, 0.2), teacher_top_k_log_probs=_log(0.5, 0.25))
    assert got.item() == 0.0


def test_forward_kl_top_k_clamps_log_probs():
    # student log-prob −30 clamped to −10: .5·(ln .5 + 10) = 4.65343; unclamped .5·(ln .5 + 30)
    student = torch.tensor([[[-30.0]]], dtype=torch.float64)
    teacher = _log(0.5)
    clamped = forward_kl_top_k(
        student_top_k_log_probs=student, teacher_top_k_log_probs=teacher, log_prob_min_clamp=-10
    )
    free = forward_kl_top_k(student_top_k_log_probs=student, teacher_top_k_log_probs=teacher)
    torch.testing.assert_close(clamped, torch.tensor([[0.5 * (math.log(0.5) + 10)]]), rtol=1e-6, atol=0)
    torch.testing.assert_close(free, torch.tensor([[0.5 * (math.log(0.5) + 30)]]), rtol=1e-6, atol=0)


def test_student_log_probs_at_the_teacher_ids():
    # logits (0, ln 3): logsumexp = ln 4 → log-probs (ln .25, ln .75)
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    got = student_log_probs_at(logits, torch.tensor([[[1, 0]]]))
    torch.testing.assert_close(got, torch.tensor([[[math.log(0.75), math.log(0.25)]]]), rtol=1e-6, atol=1e-7)


def test_forward_kl_top_k_gradient_is_mass_times_q_minus_p():
    # ℓ = Σ_k p_k (log p_k − log q_k), q = softmax(z):  ∂ℓ/∂z_j = q_j·Σ_k p_k − p_j (p_j = 0 off the top-k)
    logits = torch.tensor([[[0.3, -0.2, 1.1, 0.0]]], dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[[2, 0]]])
    teacher = torch.tensor([[[math.log(0.6), math.log(0.3)]]], dtype=torch.float64)
    student = torch.gather(torch.log_softmax(logits, -1), -1, ids)
    forward_kl_top_k(student_top_k_log_probs=student, teacher_top_k_log_probs=teacher).sum().backward()
    q = torch.softmax(logits.detach(), -1)[0, 0]
    p = torch.tensor([0.3, 0.0, 0.6, 0.0], dtype=torch.float64)
    torch.testing.assert_close(logits.grad[0, 0], q * 0.9 - p, rtol=1e-6, atol=1e-9)


def test_top_k_diagnostics_by_hand():
    # teacher ids (3, 1), student's own top-2 (1, 0): one shared id, 1.
    teacher = _log(0.5, 0.25)
    student = _log(0.125, 0.5)
    diag = top_k_diagnostics(
        student_top_k_log_probs=student,
        teacher_top_k_log_probs=teacher,
        teacher_top_k_ids=torch.tensor([[[3, 1]]]),
        student_top_k_ids=torch.tensor([[[1, 0]]]),
    )
    assert diag.student_mass.item() == pytest.approx(0.625)
    assert diag.teacher_mass.item() == pytest.approx(0.75)
    assert diag.overlap_count.item() == 1
    # on id 1: −.25·(ln .25 − ln .5) = .25 ln 2
    assert diag.overlap_token_advantage.item() == pytest.approx(0.25 * math.log(2))


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_supervised_form_aggregates_and_clamps():
    zeros = torch.zeros_like(PER_TOKEN)
    free, metrics = distillation_loss(PER_TOKEN, response_mask=MASK, log_prob=zeros, old_log_prob=zeros)
    assert free.item() == pytest.approx(10 / 4)  # token-mean of 1, 2, 3, 4
    assert (metrics["loss_min"].item(), metrics["loss_max"].item()) == (1.0, 4.0)  # masked, before clamp
    clamped, _ = distillation_loss(
        PER_TOKEN, response_mask=MASK, log_prob=zeros, old_log_prob=zeros, loss_max_clamp=2.5
    )
    assert clamped.item() == pytest.approx((1 + 2 + 2.5 + 2.5) / 4)
    seq, _ = distillation_loss(
        PER_TOKEN, response_mask=MASK, log_prob=zeros, old_log_prob=zeros, loss_agg_mode="seq-mean-token-mean"
    )
    assert seq.item() == pytest.approx((2 + 4) / 2)


def test_policy_gradient_form_rewards_minus_the_loss():
    # r = 1: ℓ_pg = −Â·r = ℓ' (also under dual clip, Â < 0), so the value is agg(ℓ'); the gradient
    # w.r.t. log π is −Â·r / 4 = ℓ'/4 on each of the 4 tokens, and the loss itself is detached.
    log_prob = torch.full((2, 3), -1.0, dtype=torch.float64, requires_grad=True)
    per_token = PER_TOKEN.clone().requires_grad_(True)
    loss, metrics = distillation_loss(
        per_token,
        response_mask=MASK,
        log_prob=log_prob,
        old_log_prob=torch.full((2, 3), -1.0, dtype=torch.float64),
        use_policy_gradient=True,
        loss_max_clamp=2.5,
    )
    assert loss.item() == pytest.approx(8 / 4)
    loss.backward()
    expected = torch.tensor([[1.0, 2.0, 2.5], [2.5, 0.0, 0.0]], dtype=torch.float64) / 4
    torch.testing.assert_close(log_prob.grad, expected, rtol=0, atol=1e-12)
    assert per_token.grad is None  # the reward carries no gradient
    assert metrics["pg_clipfrac"].item() == 0.0


def test_combination_with_the_task_loss():
    task, distill = torch.tensor(1.5), torch.tensor(0.5)
    assert with_task_loss(task, distill, use_task_rewards=True, distillation_loss_coef=2.0).item() == 2.5
    assert with_task_loss(task, distill, use_task_rewards=False, distillation_loss_coef=2.0).item() == 0.5


def test_abs_mean_and_an_empty_mask():
    assert sampled_token_abs_mean(torch.tensor([[-1.0, 3.0]]), torch.tensor([[1, 0]])).item() == 1.0
    zeros = torch.zeros(1, 2)
    loss, metrics = distillation_loss(
        zeros, response_mask=torch.zeros(1, 2), log_prob=zeros, old_log_prob=zeros
    )
    assert loss.item() == 0.0 and metrics["loss_max"].item() == 0.0


def test_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match="forward_kl_topk"):
        get_distillation_loss("forward_kl")


def test_the_per_row_view_of_the_loss_masks_and_averages_the_action_tokens():
    from stratarl.algo.distillation import distillation_loss_per_row

    per_token = torch.tensor([[0.5, 1.5, 9.0], [2.0, 7.0, 7.0], [3.0, 3.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    out = distillation_loss_per_row(per_token, mask)
    # row 0: (0.5 + 1.5) / 2 = 1.0; row 1: 2.0 / 1; row 2: no action token -> NaN
    assert torch.equal(out["distillation_loss"], torch.tensor([[0.5, 1.5, 0.0], [2.0, 0.0, 0.0], [0.0] * 3]))
    assert out["distillation_loss_mean"][:2].tolist() == [1.0, 2.0]
    assert out["distillation_loss_mean"][2].isnan()
