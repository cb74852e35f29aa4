"""Parity with verl 0.9.1's on-policy distillation (`verl.trainer.distillation`): every sampled-token
estimator (k1/kl, abs, k2/mse, k3/low_var_kl) through verl's own `distillation_loss` — supervised
and policy-gradient forms, with and without its loss clamp, each aggregation mode and the global
normalisers — and the top-k forward KL of its FSDP path (plain and chunked) with its mass and
overlap diagnostics and the clamps, on identical seeded inputs, rtol 1e-5. Also the registry's
names and what each name needs.
"""

from __future__ import annotations

import pytest
import torch

from stratarl.algo.aggregation import LOSS_AGGREGATIONS
from stratarl.algo.distillation import DISTILLATION_LOSSES, distillation_loss, get_distillation_loss
from stratarl.algo.distillation.top_k import forward_kl_top_k, student_log_probs_at, top_k_diagnostics
from tests.parity.verl_091 import (
    NORMALIZERS,
    RESPONSE_LENGTH,
    actor_config,
    check,
    log_probs,
    nearby_log_probs,
    response_mask,
)
from tests.parity.verl_091_distillation import load_verl_distillation, packed, padded_inputs, per_row

pytestmark = pytest.mark.parity

N = 14
SAMPLED_TOKEN_MODES = sorted(name for name, loss in DISTILLATION_LOSSES.items() if not loss.uses_top_k)


@pytest.fixture(scope="module")
def vd(verl):
    return load_verl_distillation(verl)


def sampled_inputs(seed: int, dtype: torch.dtype) -> dict:
    """Student, old and teacher log-probs [N, T] (two tokens |Δ| = 25, so k3's clamps and the loss
    clamp bind), the mask, and prompt lengths 1..5."""
    gen = torch.Generator().manual_seed(300 + seed)
    student = log_probs(gen, (N, RESPONSE_LENGTH), dtype)
    teacher = nearby_log_probs(gen, student, 0.7 + seed)
    teacher[0, 0], student[2, 1] = student[0, 0] - 25.0, teacher[2, 1] - 25.0
    old = nearby_log_probs(gen, student, 0.1)
    prompts = torch.randint(1, 6, (N,), generator=gen).tolist()
    return {
        "student": student,
        "teacher": teacher,
        "old": old,
        "mask": response_mask(gen, N),
        "prompts": prompts,
    }


def _verl_distillation_loss(vd, x, mode, *, use_pg, clamp, agg, norm):
    loss_config = vd.DistillationLossConfig(
        loss_mode=mode,
        use_policy_gradient=use_pg,
        loss_max_clamp=clamp,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
    )
    config = vd.DistillationConfig(enabled=False, distillation_loss=loss_config)
    actor = actor_config(vd, loss_agg_mode=agg, loss_scale_factor=norm["loss_scale_factor"])
    lengths = [p + RESPONSE_LENGTH for p in x["prompts"]]
    tensors = padded_inputs(x["prompts"], RESPONSE_LENGTH) | {
        "teacher_logprobs": per_row(packed(x["teacher"].unsqueeze(-1), x["prompts"]), lengths),
        "response_mask": x["mask"],
        "old_log_probs": x["old"],
    }
    counts = {k: norm[k] for k in ("dp_size", "batch_num_tokens", "global_batch_size")}
    data = vd.tu.get_tensordict(tensors, non_tensor_dict=counts)
    student = x["student"].clone().requires_grad_(True)
    output = {"log_probs": packed(student, x["prompts"])}
    loss, metrics = vd.losses.distillation_loss(actor, config, output, data)
    loss.backward()
    return loss, metrics, student.grad


def _our_distillation_loss(x, mode, *, use_pg, clamp, agg, norm):
    student = x["student"].clone().requires_grad_(True)
    per_token = get_distillation_loss(mode).fn(log_prob=student, teacher_log_prob=x["teacher"])
    loss, metrics = distillation_loss(
        per_token,
        response_mask=x["mask"],
        log_prob=student,
        old_log_prob=x["old"],
        use_policy_gradient=use_pg,
        loss_agg_mode=agg,
        loss_max_clamp=clamp,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        dp_size=norm["dp_size"],
        global_num_tokens=norm["batch_num_tokens"],
        global_batch_size=norm["global_batch_size"],
        loss_scale_factor=norm["loss_scale_factor"],
    )
    loss.backward()
    return loss, metrics, student.grad, per_token


def _value(metric):
    return metric.aggregate() if hasattr(metric, "aggregate") else metric  # verl's Metric, or a number


@pytest.mark.parametrize("mode", SAMPLED_TOKEN_MODES)
@pytest.mark.parametrize("use_pg", [False, True])
@pytest.mark.parametrize("clamp", [None, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sampled_token_losses_match_verl(vd, mode, use_pg, clamp, dtype):
    if mode == "k1" and not use_pg:
        with pytest.raises(ValueError):  # verl refuses to backpropagate k1; so does our validation
            vd.DistillationLossConfig(loss_mode=mode, use_policy_gradient=False)
        return
    x = sampled_inputs(0, dtype)
    norm = NORMALIZERS["local"]
    theirs, their_metrics, their_grad = _verl_distillation_loss(
        vd, x, mode, use_pg=use_pg, clamp=clamp, agg="token-mean", norm=norm
    )
    ours, our_metrics, our_grad, per_token = _our_distillation_loss(
        x, mode, use_pg=use_pg, clamp=clamp, agg="token-mean", norm=norm
    )
    what = f"{mode} pg={use_pg} clamp={clamp} {dtype}"
    check("distillation/loss", ours, theirs, what=what)
    check("distillation/grad", our_grad, their_grad, what=what)
    for name in ("loss_min", "loss_max"):
        check(
            "distillation/metrics",
            our_metrics[name],
            _value(their_metrics[f"distillation/{name}"]),
            what=name,
        )
    mask = x["mask"].bool()
    check(
        "distillation/metrics", per_token[mask].abs().mean(), _value(their_metrics["distillation/abs_loss"])
    )
    if use_pg:
        for name in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"):
            check(
                "distillation/metrics",
                our_metrics[name],
                _value(their_metrics[f"distillation/{name}"]),
                what=name,
            )


@pytest.mark.parametrize("agg", sorted(LOSS_AGGREGATIONS))
@pytest.mark.parametrize("norm", sorted(NORMALIZERS))
@pytest.mark.parametrize("use_pg", [False, True])
def test_aggregation_and_normalisers_match_verl(vd, agg, norm, use_pg):
    x = sampled_inputs(1, torch.float64)
    kwargs = {"use_pg": use_pg, "clamp": 10.0, "agg": agg, "norm": NORMALIZERS[norm]}
    theirs, _, their_grad = _verl_distillation_loss(vd, x, "k3", **kwargs)
    ours, _, our_grad, _ = _our_distillation_loss(x, "k3", **kwargs)
    check("distillation/loss", ours, theirs, what=f"{agg} {norm} pg={use_pg}")
    check("distillation/grad", our_grad, their_grad, what=f"{agg} {norm} pg={use_pg}")


def top_k_inputs(seed: int, k: int, vocab: int = 40, tokens: int = 23):
    """Student logits [1, L, V], the teacher's top-k ids [L, K] (from its own logits, so the two
    top-k sets overlap partly) and log-probs; three tokens where the student gives ~0 mass."""
    gen = torch.Generator().manual_seed(400 + seed)
    student_logits = 2.0 * torch.randn(1, tokens, vocab, generator=gen)
    teacher_logits = student_logits[0] + 1.5 * torch.randn(tokens, vocab, generator=gen)
    teacher_log_probs = torch.log_softmax(teacher_logits, -1)
    top = torch.topk(teacher_log_probs, k, dim=-1)
    ids = top.indices
    student_logits[0, :3].scatter_(-1, ids[:3, :1], -40.0)  # π_θ ≈ e^-40 on the teacher's first choice
    return student_logits, top.values, ids


@pytest.mark.parametrize("k", [1, 4, 16])
@pytest.mark.parametrize("min_clamp", [None, -10.0])
@pytest.mark.parametrize("chunked", [False, True])
def test_forward_kl_top_k_matches_verl(vd, k, min_clamp, chunked):
    logits, teacher, ids = top_k_inputs(k, k)
    lengths = [5, 11, 7]  # three sequences packed into the 23 tokens
    loss_config = vd.DistillationLossConfig(
        loss_mode="forward_kl_topk",
        topk=k,
        use_policy_gradient=False,
        log_prob_min_clamp=min_clamp,
        use_chunked_topk=chunked,
        chunked_topk_chunk_size=6,
    )
    config = vd.DistillationConfig(enabled=False, distillation_loss=loss_config)
    leaf = logits.clone().requires_grad_(True)
    theirs = vd.fsdp_losses.compute_forward_kl_topk(
        student_logits=leaf,
        teacher_topk_log_probs=per_row(teacher, lengths),
        teacher_topk_ids=per_row(ids, lengths),
        config=config,
        data_format="thd",
    )
    theirs["distillation_losses"].sum().backward()

    ours_leaf = logits.clone().requires_grad_(True)
    student = student_log_probs_at(ours_leaf, ids.unsqueeze(0))  # [1, L, K]
    loss = forward_kl_top_k(
        student_top_k_log_probs=student,
        teacher_top_k_log_probs=teacher.unsqueeze(0),
        log_prob_min_clamp=min_clamp,
    )
    diag = top_k_diagnostics(
        student_top_k_log_probs=student.detach(),
        teacher_top_k_log_probs=teacher.unsqueeze(0),
        teacher_top_k_ids=ids.unsqueeze(0),
        student_top_k_ids=torch.topk(logits, k, dim=-1).indices,
        log_prob_min_clamp=min_clamp,
    )
    loss.sum().backward()
    what = f"k={k} clamp={min_clamp} chunked={chunked}"
    # verl clamps the truncated sum at 0 later, in the registered loss; compare after that clamp.
    check("distillation/forward_kl_topk", loss, theirs["distillation_losses"].clamp_min(0.0), what=what)
    check("distillation/forward_kl_topk", diag.student_mass, theirs["student_mass"], what=what)
    check("distillation/forward_kl_topk", diag.teacher_mass, theirs["teacher_mass"], what=what)
    check("distillation/forward_kl_topk", diag.overlap_count, theirs["overlap_count"], atol=0, rtol=0)
    check("distillation/forward_kl_topk", diag.overlap_token_advantage, theirs["overlap_token_advantage"])
    # gradients agree where verl's unclamped sum is ≥ 0 (elsewhere ours is clamped at 0 first)
    positive = theirs["distillation_losses"].detach()[0] > 0
    check("distillation/forward_kl_topk_grad", ours_leaf.grad[0][positive], leaf.grad[0][positive], what=what)


def test_registry_matches_verl(vd):
    theirs = vd.losses.DISTILLATION_SETTINGS_REGISTRY
    assert set(theirs) == set(DISTILLATION_LOSSES)
    for name, settings in theirs.items():
        assert settings.use_topk == DISTILLATION_LOSSES[name].uses_top_k, name
    with pytest.raises(ValueError):
        vd.losses.get_distillation_loss_fn("reverse_kl")
    with pytest.raises(ValueError):
        get_distillation_loss("reverse_kl")
