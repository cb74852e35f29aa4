"""A loss's declared `reads` are all it needs: on a micro-batch holding only those columns it computes
the same loss as on the full batch (the TransferQueue path sends a rank nothing else)."""

import pytest
import torch

from stratarl.assembly import algorithm
from stratarl.config import load_config
from stratarl.engine.forward import ResponseScores, ValueScores
from stratarl.engine.training import BatchTotals
from stratarl.transport.data_proto import DataProto

N, T, K = 6, 5, 3


def full_micro() -> DataProto:
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(N, T, generator=g) > 0.2).long()
    columns = {
        "response_mask": mask,
        "old_log_probs": -torch.rand(N, T, generator=g),
        "rollout_log_probs": -torch.rand(N, T, generator=g),
        "ref_log_prob": -torch.rand(N, T, generator=g),
        "teacher_log_prob": -torch.rand(N, T, generator=g),
        "advantages": torch.randn(N, T, generator=g),
        "returns": torch.randn(N, T, generator=g),
        "values": torch.randn(N, T, generator=g),
        "token_level_scores": torch.randn(N, T, generator=g),  # read by no loss
        "rollout_is_weights": torch.rand(N, T, generator=g) + 0.5,
        "teacher_top_k_ids": torch.randint(0, 9, (N, T, K), generator=g),
        "teacher_top_k_log_probs": -torch.rand(N, T, K, generator=g) - 1.0,
    }
    return DataProto.from_dict(columns)


def only_reads(micro: DataProto, reads) -> DataProto:
    return micro.select([c for c in reads if c in micro.columns])


ACTOR_SETTINGS = [
    [],
    ["actor.policy_loss.name=gspo"],
    ["actor.use_kl_loss=true", "actor.kl_loss_coef=0.1"],
    ["actor.entropy_coeff=0.01"],
    ["distillation.enabled=true", "distillation.teacher_model_path=teacher"],
    [
        "distillation.enabled=true",
        "distillation.teacher_model_path=teacher",
        "distillation.use_policy_gradient=true",
    ],
    [
        "distillation.enabled=true",
        "distillation.teacher_model_path=teacher",
        "distillation.loss_mode=forward_kl_topk",
    ],
    ["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token"],
]


@pytest.mark.parametrize("overrides", ACTOR_SETTINGS, ids=lambda o: " ".join(o) or "default")
def test_the_actor_loss_reads_only_what_it_declares(overrides):
    loss_fn = algorithm.build_actor_loss(load_config(None, overrides))
    micro, g = full_micro(), torch.Generator().manual_seed(1)
    scores = ResponseScores(
        -torch.rand(N, T, generator=g),
        torch.rand(N, T, generator=g),
        top_k_log_probs=-torch.rand(N, T, K, generator=g),
        top_k_ids=torch.randint(0, 9, (N, T, K), generator=g),
    )
    totals = BatchTotals(num_tokens=int(micro["response_mask"].sum()), num_sequences=N)
    loss, _ = loss_fn(micro, scores, totals)
    restricted, _ = loss_fn(only_reads(micro, loss_fn.reads), scores, totals)
    assert torch.equal(loss, restricted)
    assert "token_level_scores" not in loss_fn.reads


def test_the_value_loss_reads_only_what_it_declares():
    loss_fn = algorithm.build_value_loss(
        load_config(None, ["algorithm.adv_estimator=gae", "critic.enable=true"])
    )
    micro = full_micro()
    scores = ValueScores(torch.randn(N, T, generator=torch.Generator().manual_seed(2)))
    totals = BatchTotals(num_tokens=int(micro["response_mask"].sum()), num_sequences=N)
    assert torch.equal(
        loss_fn(micro, scores, totals)[0], loss_fn(only_reads(micro, loss_fn.reads), scores, totals)[0]
    )
