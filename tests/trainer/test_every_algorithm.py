"""Every estimator, policy loss and trainer-level knob runs 2 GRPO-style steps from recipe overrides."""

import math

import pytest

from stratarl.algo.advantages import ADVANTAGE_ESTIMATORS
from stratarl.algo.policy_loss import POLICY_LOSSES
from stratarl.apps.quickstart import RECIPE
from stratarl.config import load_config
from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer


def two_steps(task, tmp_path, *overrides):
    cfg = load_config(
        RECIPE,
        [
            f"data.train_files=['{task['train']}']",
            f"model.path={task['model']}",
            "data.val_files=[]",
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
            "trainer.total_steps=2",
            "trainer.save_trajectories=false",
            "data.prompts_per_step=2",
            "rollout.n=4",
            "rollout.max_response_tokens=6",
            "actor.prompts_per_mini_batch=1",
            "actor.trajectories_per_micro_batch=4",
            "actor.lr=1e-3",
            "critic.prompts_per_mini_batch=1",
            "critic.trajectories_per_micro_batch=4",
            *overrides,
        ],
    )
    RLTrainer(cfg, tmp_path / "run").fit()
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "train"]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert math.isfinite(record["actor/pg_loss"]) and math.isfinite(record["actor/grad_norm"])
    return records


@pytest.mark.parametrize("estimator", sorted(ADVANTAGE_ESTIMATORS))
def test_estimator_runs(task, tmp_path, estimator):
    extra = ["algorithm.gdpo_reward_keys=[acc,format_ok]"] if estimator == "gdpo" else []
    records = two_steps(task, tmp_path, f"algorithm.adv_estimator={estimator}", *extra)
    if estimator == "remax":
        assert all("timing_s/gen_max" in r for r in records)
    if estimator == "gae":  # the critic is on (critic.enable null): values, its update, its metrics
        for record in records:
            assert {"timing_s/values", "timing_s/update_critic"} <= record.keys()
            assert all(math.isfinite(record[f"critic/{name}"]) for name in ("vf_loss", "vf_explained_var"))


@pytest.mark.parametrize("loss", sorted(POLICY_LOSSES))
def test_policy_loss_runs(task, tmp_path, loss):
    extra = ["actor.policy_loss.dro_beta=0.1"] if loss == "dro" else []
    two_steps(task, tmp_path, f"actor.policy_loss.name={loss}", *extra)


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive"],
        ["actor.use_kl_loss=true", "actor.kl_loss_type=low_var_kl+"],
        ["actor.entropy_coeff=0.01", "actor.ppo_epochs=2", "actor.shuffle=true"],
        ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_rs=token_k1",
         "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0"],
        ["algorithm.rollout_correction.bypass_mode=true"],
        ["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.loss_type=reinforce",
         "algorithm.rollout_correction.rollout_is=sequence"],
    ],
    ids=["kl-in-reward-adaptive", "kl-loss-straight-through", "entropy-epochs-shuffle", "decoupled-is-rs",
         "bypass-ppo-clip", "bypass-reinforce"],
)  # fmt: skip
def test_trainer_knob_runs(task, tmp_path, overrides):
    records = two_steps(task, tmp_path, *overrides)
    if "algorithm.use_kl_in_reward=true" in overrides:
        assert records[0]["actor/reward_kl_penalty_coeff"] != records[1]["actor/reward_kl_penalty_coeff"]
    if any("rollout_is=" in o for o in overrides):
        assert any(k.startswith("rollout_corr/") for k in records[0])


def test_dynamic_sampling_drops_flat_groups_and_keeps_generating(task, tmp_path):
    # An untrained model scores 0 everywhere on arithmetic; this scorer varies with the response.
    scorer = tmp_path / "parity_of_length.py"
    scorer.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(len(solution_str) % 2)\n")  # fmt: skip
    records = two_steps(
        task,
        tmp_path,
        f"reward.custom_function_path={scorer}",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=8",
    )
    for record in records:
        assert record["batch/gen_rounds"] >= 1 and "batch/dropped_groups" in record
        assert record["batch/groups_with_signal"] == 1.0  # every kept group has reward variance
