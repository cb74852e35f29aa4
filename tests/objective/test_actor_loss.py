"""ActorLoss reads actor.loss_scale_factor: the divisor S of seq-mean-token-sum-norm (Dr. GRPO)."""

import torch

from stratarl.engine.forward import ResponseScores
from stratarl.engine.training import BatchTotals
from stratarl.objective.actor_loss import ActorLoss
from stratarl.transport.data_proto import DataProto


def test_loss_scale_factor_is_the_divisor_of_seq_mean_token_sum_norm():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])  # T = 4 (padded width)
    log_prob = torch.log(torch.tensor([[0.5, 0.25, 0.5, 1.0], [0.5, 1.0, 1.0, 1.0]]))
    micro = DataProto.from_dict(
        {
            "response_mask": mask,
            "old_log_probs": log_prob,
            "advantages": torch.tensor([[1.0] * 4, [-2.0] * 4]),
        }
    )
    scores = ResponseScores(log_prob=log_prob, entropy=None)
    totals = BatchTotals(num_tokens=4, num_sequences=2)
    # on-policy: ratio 1, per-token loss −A; Σ over row tokens: −3 and +2; Σ rows / (B · S), B = 2
    default, _ = ActorLoss(loss_agg_mode="seq-mean-token-sum-norm")(micro, scores, totals)
    scaled, _ = ActorLoss(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=8.0)(
        micro, scores, totals
    )
    assert default.item() == (-3 + 2) / (2 * 4)  # S = T = 4 when unset
    assert scaled.item() == (-3 + 2) / (2 * 8)
