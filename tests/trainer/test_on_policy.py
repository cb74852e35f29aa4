"""π_old from the update's own forward: the same losses, gradients, metrics and weights as the separate
old-log-prob forward, one forward fewer; and still the separate forward wherever the two could differ."""

import pytest
import torch
from transformers import Qwen2Config

from stratarl.assembly import algorithm
from stratarl.config import load_config
from stratarl.engine.forward import ResponseScores
from stratarl.engine.training import BatchTotals
from stratarl.observe.run_log import read_metrics
from stratarl.trainer import pi_old
from stratarl.trainer.rl_trainer import RLTrainer
from stratarl.transport.data_proto import DataProto
from tests.trainer.test_rl_trainer import small_config

N, T = 6, 5


def test_the_loss_with_pi_old_from_its_forward_equals_the_loss_given_those_log_probs():
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(N, T, generator=g) > 0.2).long()
    micro = DataProto.from_dict({"response_mask": mask, "advantages": torch.randn(N, T, generator=g)})
    totals = BatchTotals(num_tokens=int(mask.sum()), num_sequences=N)
    cfg = load_config(None, [])

    def loss_and_grad(from_forward: bool):
        log_prob = (-torch.rand(N, T, generator=torch.Generator().manual_seed(1))).requires_grad_()
        scores = ResponseScores(log_prob, torch.rand(N, T, generator=torch.Generator().manual_seed(2)))
        given = micro.union(DataProto.from_dict({"old_log_probs": log_prob.detach() * mask}))
        loss_fn = algorithm.build_actor_loss(cfg, old_log_prob_from_forward=from_forward)
        loss, metrics = loss_fn(micro if from_forward else given, scores, totals)
        loss.backward()
        return loss, log_prob.grad, metrics

    reused, recomputed = loss_and_grad(True), loss_and_grad(False)
    assert torch.equal(reused[0], recomputed[0]) and torch.equal(reused[1], recomputed[1])
    assert reused[2] == recomputed[2]
    assert reused[1].abs().sum() > 0  # the gradient is ∇log π_θ·A, not 0


def old_log_prob_source(cfg):
    """Where the trainer takes π_old from for `cfg` (its tiny models have no dropout)."""
    inputs = algorithm.estimator_inputs(cfg)
    return pi_old.choose_old_log_probs(cfg, model_has_dropout=False, estimator_inputs=inputs)


def blockers(cfg, model_config):
    inputs = algorithm.estimator_inputs(cfg)
    return pi_old.reuse_blockers(
        cfg, model_has_dropout=pi_old.has_dropout(model_config), estimator_inputs=inputs
    )


def run_metrics(task, tmp_path, name, *extra):
    cfg = small_config(task, "trainer.total_steps=2", "trainer.test_freq=0", *extra)
    trainer = RLTrainer(cfg, tmp_path / name)
    trainer.fit()
    weights = trainer.worker.local_worker().actor.model.state_dict()
    train = [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if r["phase"] == "train"]
    return trainer, train, weights


def test_a_one_step_batch_skips_the_old_forward_and_trains_exactly_as_the_recompute(task, tmp_path):
    one_step = ["actor.prompts_per_mini_batch=4"]  # 4 prompts a step: one mini-batch, one epoch
    reused, reused_metrics, reused_weights = run_metrics(task, tmp_path, "reused", *one_step)
    _, recomputed_metrics, recomputed_weights = run_metrics(
        task, tmp_path, "recomputed", *one_step, "actor.old_log_prob_from_update=false"
    )
    assert reused.actor_loss.old_log_prob_from_forward
    assert all("timing_s/old_log_prob" not in r for r in reused_metrics)
    assert all("timing_s/old_log_prob" in r for r in recomputed_metrics)
    compared = [k for k in recomputed_metrics[0] if k.split("/")[0] in ("actor", "rollout_corr", "critic")]
    assert "actor/entropy" in compared and "actor/pg_loss" in compared and "actor/grad_norm" in compared
    assert any(k.startswith("rollout_corr/") for k in compared)  # π_old against π_rollout
    for step_reused, step_recomputed in zip(reused_metrics, recomputed_metrics, strict=True):
        for key in compared:
            assert step_reused[key] == step_recomputed[key], key
    for name, tensor in recomputed_weights.items():
        assert torch.equal(reused_weights[name], tensor), name


@pytest.mark.parametrize(
    "extra, blocker",
    [
        (["actor.prompts_per_mini_batch=2"], "prompts_per_mini_batch < data.prompts_per_step"),
        (["actor.prompts_per_mini_batch=4", "actor.ppo_epochs=2"], "ppo_epochs > 1"),
        (["actor.prompts_per_mini_batch=4", "algorithm.use_kl_in_reward=true"], "use_kl_in_reward"),
        (["actor.prompts_per_mini_batch=4", "algorithm.rollout_correction.rollout_is=token"], "rollout_is"),
        (["actor.prompts_per_mini_batch=4", "algorithm.rollout_correction.bypass_mode=true"], "bypass_mode"),
        (["actor.prompts_per_mini_batch=4", "trainer.mode=one_step_off"], "trainer.mode=one_step_off"),
        (["actor.prompts_per_mini_batch=4", "trainer.mode=async"], "trainer.mode=async"),
    ],
)
def test_whatever_could_make_them_differ_keeps_the_separate_forward(task, extra, blocker):
    cfg = small_config(task, *extra)
    source = old_log_prob_source(cfg)
    assert not source.from_update and blocker in source.line
    one_step = load_config(None, ["actor.prompts_per_mini_batch=16"])
    assert blockers(one_step, Qwen2Config()) == []
    assert "the model has dropout" in blockers(one_step, Qwen2Config(attention_dropout=0.1))


def test_the_start_up_line_of_bypass_mode_says_that_no_forward_runs(task):
    """Was: "old log-probs: a separate forward (… bypass_mode (π_old is π_rollout))", which
    contradicts itself: bypass mode takes π_old from the rollout and runs no old-log-prob forward."""
    source = old_log_prob_source(small_config(task, "algorithm.rollout_correction.bypass_mode=true"))
    reuse, line = source.from_update, source.line
    assert not reuse and "separate forward" not in line
    assert (
        line.startswith("old log-probs: the rollout's own, no old-log-prob forward") and "π_rollout" in line
    )
    recompute = old_log_prob_source(small_config(task, "actor.prompts_per_mini_batch=2")).line
    assert recompute.startswith("old log-probs: a separate forward")


def test_two_mini_batches_still_run_the_old_forward(task, tmp_path):
    trainer, metrics, _ = run_metrics(task, tmp_path, "two", "actor.prompts_per_mini_batch=2")
    assert not trainer.actor_loss.old_log_prob_from_forward
    assert all(r["timing_s/old_log_prob"] > 0 for r in metrics)
