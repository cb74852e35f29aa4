"""Layer 5, training engine: the `Critic`, a value model V(s_t) trained by regression on returns.

The value model is a token-classification model with one output (`AutoModelForTokenClassification`,
num_labels=1): a causal LM body and a scalar head. **Which position predicts V(s_t)**: for response
token y_t the critic reads the head at the position of the token *before* it (the last prompt token
for t = 0), whose hidden state has seen exactly s_t = (x, y_<t), the state in which y_t is chosen —
verl's `values[:, -T-1:-1]`, the same positions that give log π(y_t | s_t). GAE (`algo/advantages`)
takes these values with V(s_T) = 0 after the last response token.

`update` mirrors `Actor.update`; the loss_fn receives `ValueScores` (e.g. `clipped_value_loss`
aggregated with `aggregate_loss`, see tests/engine/test_critic.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForTokenClassification

from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.forward import ValueScorer, ValueScores
from stratarl.engine.micro_batches import MicroBatching, run_in_micro_batches
from stratarl.engine.perf import ModelFlops
from stratarl.engine.training import (
    OptimizerSettings,
    TrainingEngine,
    block_class_names,
    enable_activation_checkpointing,
)
from stratarl.transport.data_proto import DataProto


def value_model_from_causal_lm(lm: nn.Module, *, head_init_std: float | None = None) -> nn.Module:
    """A token-classification model (num_labels=1, no dropout) with the body of causal LM `lm` and a
    fresh scalar head — what verl builds when the critic starts from the actor's checkpoint."""
    config = lm.config.__class__.from_dict(lm.config.to_dict())
    config.num_labels = 1
    config.classifier_dropout = 0.0
    model = AutoModelForTokenClassification.from_config(config).to(next(lm.parameters()).dtype)
    model.base_model.load_state_dict(lm.get_decoder().state_dict())
    if head_init_std is not None:
        nn.init.normal_(model.score.weight, std=head_init_std)
        if model.score.bias is not None:
            nn.init.zeros_(model.score.bias)
    return model


def load_value_model(
    path: str | Path, dtype: torch.dtype = torch.float32, *, trust_remote_code: bool = False
) -> nn.Module:
    """An HF directory (a causal LM or a saved critic) as a one-output token-classification model."""
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    config.num_labels, config.classifier_dropout = 1, 0.0  # set on the config: not every model's kwarg
    return AutoModelForTokenClassification.from_pretrained(
        str(path), config=config, dtype=dtype, trust_remote_code=trust_remote_code
    )


class Critic(TrainingEngine):
    """The value model under training: `compute_values` and `update(batch, loss_fn)`; its arguments
    are the actor's (optim: `OptimizerSettings`)."""

    role = "critic"

    def __init__(
        self,
        value_model: nn.Module,
        *,
        optim: OptimizerSettings,
        micro_batch_size: int,
        max_tokens_per_micro_batch: int | None = None,
        layout: str = "packed",
        data_parallel: DataParallel | None = None,
        gradient_checkpointing: bool = False,
        peak_flops: float | None = None,
    ):
        self.model = value_model
        if gradient_checkpointing:
            enable_activation_checkpointing(value_model)
        dp = data_parallel or DataParallel()
        scorer = ValueScorer(value_model, autocast_dtype=dp.autocast_dtype)
        config = value_model.config
        batching = MicroBatching(
            micro_batch_size,
            max_tokens=max_tokens_per_micro_batch,
            layout=layout,
            linear_coeff=12.0 * config.hidden_size,
        )
        super().__init__(
            dp.shard(scorer, block_class_names(value_model)),
            optim=optim,
            batching=batching,
            dp=dp,
            flops=ModelFlops.from_model(value_model, value_model.score, head_outputs=1),
            peak_flops=peak_flops,
        )

    @property
    def micro_batch_size(self) -> int:
        return self.batching.micro_batch_size

    def _forward(self, inputs, *, with_entropy: bool) -> ValueScores:
        return self.module.score(inputs)

    def _zero_weight_pass(self, scores: ValueScores) -> Tensor:
        return scores.values.sum() * 0.0

    def compute_values(self, batch: DataProto) -> Tensor:
        """[N, T] V(s_t) at each response token (read at the position before it), no gradients,
        0 outside response_mask."""
        was_training = self.module.training
        self.module.eval()
        out = run_in_micro_batches(
            batch,
            self.batching,
            self.dp,
            lambda inputs: {"values": self.module.score(inputs).values},
            self.device,
        )
        self.module.train(was_training)
        return out["values"] * batch["response_mask"].to(torch.float32)
