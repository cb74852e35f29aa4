"""The critic: V(s_t) read at the token before y_t, micro-batch invariance, a value update that fits."""

import torch

from stratarl.algo.aggregation import aggregate_loss
from stratarl.algo.value_loss import clipped_value_loss
from stratarl.engine.critic import Critic, load_value_model, value_model_from_causal_lm
from stratarl.engine.forward import ValueScores
from stratarl.engine.requests import UpdateRequest
from stratarl.engine.training import BatchTotals, OptimizerSettings
from tests.engine.tiny_batches import ragged_batch, tiny_model


def value_loss(micro, scores, totals, *, cliprange_value=0.5):
    """The value-loss LossFn a trainer builds: ½·max((V−R)², (clip(V, V_old ± c) − R)²), token-mean."""
    per_token, stats = clipped_value_loss(
        scores.values,
        micro["returns"],
        micro["values"],
        micro["response_mask"],
        cliprange_value=cliprange_value,
    )
    loss = aggregate_loss(
        per_token,
        micro["response_mask"],
        "token-mean",
        global_num_tokens=totals.num_tokens,
        dp_size=totals.dp_size,
    )
    share = float(micro["response_mask"].sum()) * totals.dp_size / totals.num_tokens
    return loss, {"critic/vf_loss": loss.item(), "critic/vf_clipfrac": float(stats["vf_clipfrac"]) * share}


def critic_batch(critic, seed=1, scale=1.0):
    batch = ragged_batch(n=8, seed=seed)
    mask = batch["response_mask"].float()
    returns = scale * torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed)) * mask
    values = critic.compute_values(batch)
    return batch.union(batch.from_dict({"returns": returns, "values": values}))


def test_value_model_takes_the_body_of_the_causal_lm():
    lm = tiny_model()
    value_model = value_model_from_causal_lm(lm)
    for name, tensor in lm.model.state_dict().items():
        assert torch.equal(value_model.base_model.state_dict()[name], tensor)
    assert value_model.score.out_features == 1


def test_a_saved_causal_lm_directory_loads_as_a_value_model(tmp_path):
    lm = tiny_model()
    lm.save_pretrained(tmp_path)
    value_model = load_value_model(tmp_path)
    for name, tensor in lm.model.state_dict().items():
        assert torch.equal(value_model.base_model.state_dict()[name], tensor)
    assert value_model.score.out_features == 1 and value_model.config.num_labels == 1


def test_values_are_read_at_the_position_before_each_response_token():
    value_model = value_model_from_causal_lm(tiny_model(), head_init_std=1.0)
    critic = Critic(value_model, optim=OptimizerSettings(lr=0.0), micro_batch_size=3)
    batch = ragged_batch(n=8, seed=2)
    values = critic.compute_values(batch)
    for i in range(len(batch)):
        keep = batch["attention_mask"][i].bool()
        ids = batch["input_ids"][i][keep]  # the row without padding
        n_resp = int(batch["response_mask"][i].sum())
        per_position = value_model(input_ids=ids[None]).logits[0, :, 0]  # [L] head output at each token
        torch.testing.assert_close(values[i, :n_resp], per_position[-n_resp - 1 : -1], atol=1e-5, rtol=1e-5)
        assert torch.all(values[i, n_resp:] == 0)


def grads(**kwargs):
    torch.manual_seed(0)
    value_model = value_model_from_causal_lm(tiny_model(), head_init_std=1.0)
    critic = Critic(value_model, optim=OptimizerSettings(lr=0.0, grad_clip=1e9), **kwargs)
    critic.update(critic_batch(critic), value_loss, UpdateRequest(mini_batch_size=8))
    return [p.grad.clone() for p in value_model.parameters() if p.grad is not None]


def test_token_budget_and_micro_batch_split_give_the_gradient_of_one_pass():
    whole = grads(micro_batch_size=8)
    for kwargs in (dict(micro_batch_size=2), dict(micro_batch_size=8, max_tokens_per_micro_batch=10)):
        for a, b in zip(whole, grads(**kwargs), strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_clipped_value_update_lowers_the_value_loss_on_a_fixed_batch():
    critic = Critic(
        value_model_from_causal_lm(tiny_model()), optim=OptimizerSettings(lr=3e-2), micro_batch_size=4
    )
    batch = critic_batch(critic, scale=0.3)  # returns mostly within the clip range of the old values
    totals = BatchTotals(num_tokens=int(batch["response_mask"].sum()), num_sequences=len(batch))

    def loss_now():
        return value_loss(batch, ValueScores(values=critic.compute_values(batch)), totals)[0]

    before = loss_now().item()
    for _ in range(15):
        metrics = critic.update(batch, value_loss, UpdateRequest(mini_batch_size=4))
    assert loss_now().item() < 0.5 * before
    assert {"critic/vf_loss", "critic/vf_clipfrac", "grad_norm", "lr", "perf/mfu/critic"} <= set(metrics)
