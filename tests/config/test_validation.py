"""validate_config reports all problems at once, naming their keys, with valid names from algo registries."""

import pytest

from stratarl.algo.advantages import ADVANTAGE_ESTIMATORS
from stratarl.algo.aggregation import LOSS_AGGREGATIONS
from stratarl.algo.kl import KL_ESTIMATORS
from stratarl.algo.policy_filtration import PF_PPO_WEIGHTS
from stratarl.algo.policy_loss import POLICY_LOSSES
from stratarl.config import ConfigError, RunConfig, load_config, validate_config


@pytest.fixture
def paths(tmp_path):
    """Overrides pointing at data files and a model directory that exist (their files are empty)."""
    (tmp_path / "train.parquet").touch()
    (tmp_path / "val.parquet").touch()
    (tmp_path / "model").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer_config.json", "tokenizer.json"):
        (tmp_path / "model" / name).touch()
    return [
        f"data.train_files=[{tmp_path / 'train.parquet'}]",
        f"data.val_files=[{tmp_path / 'val.parquet'}]",
        f"model.path={tmp_path / 'model'}",
    ]


def _errors(overrides, check_paths=False) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(None, overrides), check_paths=check_paths)
    return err.value


def _problems(overrides) -> list:
    try:
        validate_config(load_config(None, overrides), check_paths=False)
    except ConfigError as err:
        return err.problems
    return []


def _message(err: ConfigError, *keys: str) -> str:
    """The message of the one problem whose keys are exactly `keys`."""
    found = [p.message for p in err.problems if set(p.keys) == set(keys)]
    assert len(found) == 1, f"expected one problem naming {keys}, got:\n{err}"
    return found[0]


def test_defaults_with_existing_paths_pass(paths):
    warnings = validate_config(load_config(None, paths))
    assert warnings == []


def test_prompts_per_step_not_divisible_by_prompts_per_mini_batch():
    err = _errors(["data.prompts_per_step=10", "actor.prompts_per_mini_batch=4"])
    assert "10" in _message(err, "data.prompts_per_step", "actor.prompts_per_mini_batch")


def test_mini_batch_trajectories_not_divisible_by_micro_batch():
    # 4 prompts per mini-batch · n=3 = 12 trajectories, not a multiple of 8.
    overrides = [
        "data.prompts_per_step=8",
        "actor.prompts_per_mini_batch=4",
        "rollout.n=3",
        "actor.trajectories_per_micro_batch=8",
    ]
    err = _errors(overrides)
    message = _message(err, "actor.prompts_per_mini_batch", "rollout.n", "actor.trajectories_per_micro_batch")
    assert "12" in message


def test_unknown_estimator_lists_the_registry_and_the_nearest_name():
    message = _message(_errors(["algorithm.adv_estimator=grpoo"]), "algorithm.adv_estimator")
    assert all(repr(name) in message for name in ADVANTAGE_ESTIMATORS)
    assert "did you mean 'grpo'" in message


@pytest.mark.parametrize(
    ("key", "registry"),
    [
        ("actor.policy_loss.name", POLICY_LOSSES),
        ("actor.loss_agg_mode", LOSS_AGGREGATIONS),
        ("actor.kl_loss_type", KL_ESTIMATORS),
        ("algorithm.kl_penalty", KL_ESTIMATORS),
        ("algorithm.pf_ppo.reweight_method", PF_PPO_WEIGHTS),
    ],
)
def test_unknown_registry_names_list_the_valid_names(key, registry):
    message = _message(_errors([f"{key}=no_such_name"]), key)
    assert all(repr(name) in message for name in registry)


def test_pf_ppo_method_and_power_are_checked_and_a_non_gae_estimator_is_warned_about(paths):
    err = _errors(["algorithm.use_pf_ppo=true", "algorithm.pf_ppo.reweight_method=maxmin"])
    assert "did you mean 'max_min'" in _message(err, "algorithm.pf_ppo.reweight_method")
    assert "≥ 0" in _message(_errors(["algorithm.pf_ppo.weight_pow=-1"]), "algorithm.pf_ppo.weight_pow")
    on = [*paths, "algorithm.use_pf_ppo=true"]
    assert any("only with gae" in w for w in validate_config(load_config(None, on)))  # default grpo
    gae = [*on, "algorithm.adv_estimator=gae"]
    assert not any("use_pf_ppo" in w for w in validate_config(load_config(None, gae)))
    keys = ("algorithm.use_pf_ppo", "cluster.backend", "cluster.transfer_queue_units")
    ray = ["algorithm.use_pf_ppo=true", "cluster.backend=ray"]
    assert "transfer_queue_units=0" in _message(_errors(ray), *keys)
    assert not [p for p in _problems([*ray, "cluster.transfer_queue_units=0"]) if set(p.keys) == set(keys)]


def test_values_outside_declared_choices():
    err = _errors(["trainer.logger=[console,jsonl,wandbx]", "model.dtype=fp8", "actor.lr_schedule=linear"])
    assert "did you mean 'wandb'" in _message(err, "trainer.logger")
    assert "'bfloat16'" in _message(err, "model.dtype")
    assert "'cosine'" in _message(err, "actor.lr_schedule")


def test_gae_needs_a_critic():
    message = _message(
        _errors(["algorithm.adv_estimator=gae", "critic.enable=false"]),
        "algorithm.adv_estimator",
        "critic.enable",
    )
    assert "critic" in message
    # critic.enable=null follows the estimator: gae gets a critic.
    cfg = load_config(None, ["algorithm.adv_estimator=gae"])
    assert cfg.uses_critic
    validate_config(cfg, check_paths=False)


def test_critic_batch_split_is_checked_only_when_a_critic_runs():
    overrides = ["critic.prompts_per_mini_batch=5"]
    validate_config(load_config(None, overrides), check_paths=False)  # grpo: no critic
    err = _errors([*overrides, "algorithm.adv_estimator=gae"])
    assert "5" in _message(err, "data.prompts_per_step", "critic.prompts_per_mini_batch")


def test_group_estimator_with_one_sample_per_prompt_is_an_error():
    overrides = ["rollout.n=1", "actor.trajectories_per_micro_batch=8"]
    message = _message(_errors(overrides), "algorithm.adv_estimator", "rollout.n")
    assert "rollout.n ≥ 2" in message
    # An estimator that needs no group runs with n=1.
    validate_config(
        load_config(None, [*overrides, "algorithm.adv_estimator=reinforce_plus_plus"]), check_paths=False
    )


def test_missing_files_are_named_by_key_and_path(paths, tmp_path):
    missing = tmp_path / "missing.parquet"
    err = _errors(
        [*paths, f"data.val_files=[{missing}]", f"model.path={tmp_path / 'no_model'}"], check_paths=True
    )
    assert str(missing) in _message(err, "data.val_files")
    assert "no_model" in _message(err, "model.path")
    validate_config(load_config(None, [*paths, f"data.val_files=[{missing}]"]), check_paths=False)


def test_nothing_given_reports_both_data_and_model():
    err = _errors([], check_paths=True)
    assert err.keys == {"data.train_files", "model.path"}


def test_every_problem_is_collected_into_one_error():
    overrides = [
        "data.prompts_per_step=10",
        "actor.prompts_per_mini_batch=4",  # not divisible
        "algorithm.adv_estimator=nope",  # unknown estimator
        "rollout.top_p=0",  # out of range
        "actor.policy_loss.clip_ratio_c=1.0",  # dual clip needs c > 1
        "rollout.val_kwargs.greedy=false",
        "rollout.val_kwargs.temperature=0",  # sampling at temperature 0
    ]
    err = _errors(overrides)
    assert err.keys == {
        "data.prompts_per_step",
        "actor.prompts_per_mini_batch",
        "algorithm.adv_estimator",
        "rollout.top_p",
        "actor.policy_loss.clip_ratio_c",
        "rollout.val_kwargs.greedy",
        "rollout.val_kwargs.temperature",
    }
    assert len(err.problems) == 5


def test_a_config_built_in_python_gets_its_types_checked():
    cfg = RunConfig()
    cfg.rollout.n = "8"
    cfg.actor.lr = True  # a bool is not a float
    cfg.data.train_files = ["a.parquet", 3]
    cfg.trainer.total_steps = 5  # int | None: fine
    cfg.rollout.temperature = 1  # an int is a fine float
    with pytest.raises(ConfigError) as err:
        validate_config(cfg, check_paths=False)
    assert err.value.keys == {"rollout.n", "actor.lr", "data.train_files"}
    assert "expected int, got '8'" in _message(err.value, "rollout.n")


def test_dro_needs_its_beta():
    err = _errors(["actor.policy_loss.name=dro"])
    assert "dro_beta" in _message(err, "actor.policy_loss.name", "actor.policy_loss.dro_beta")
    validate_config(
        load_config(None, ["actor.policy_loss.name=dro", "actor.policy_loss.dro_beta=0.1"]), check_paths=False
    )


def test_doubtful_settings_come_back_as_warnings(paths):
    overrides = [
        *paths,
        "actor.use_kl_loss=true",
        "algorithm.use_kl_in_reward=true",
        "actor.policy_loss.name=sapo",
    ]
    warnings = validate_config(load_config(None, overrides))
    assert any("use_kl_loss" in w and "use_kl_in_reward" in w for w in warnings)
    assert any("seq-mean-token-mean" in w for w in warnings)  # sapo's forced aggregation
    no_val = [p for p in paths if not p.startswith("data.val_files")]
    assert any("data.val_files" in w for w in validate_config(load_config(None, no_val)))


def test_async_keys_a_mode_does_not_read_are_warned_about_by_name():
    """sync reads no async_training key, one_step_off only `correction`; async reads them all."""

    def warnings(*overrides):
        return validate_config(load_config(None, list(overrides)), check_paths=False)

    (sync,) = [w for w in warnings("async_training.deterministic=true") if "async_training" in w]
    assert sync.startswith("async_training.deterministic=True has no effect with trainer.mode=sync")
    off = warnings(
        "trainer.mode=one_step_off", "async_training.correction=none", "async_training.max_staleness=4"
    )
    (one_step_off,) = [w for w in off if "async_training" in w]
    assert "async_training.max_staleness=4 has no effect" in one_step_off
    assert "correction" not in one_step_off  # the off-policy correction is read by one_step_off
    full = warnings("trainer.mode=async", "async_training.max_staleness=4", "async_training.buffer_batches=3")
    assert not [w for w in full if "async_training" in w]
    assert not [w for w in warnings() if "async_training" in w]  # defaults: nothing to say


def test_agent_settings_are_checked_with_the_rest_before_any_worker_starts(tmp_path):
    missing = tmp_path / "no_tools.yaml"
    err = _errors(
        [
            "agent.enable=true",
            "agent.max_parallel_calls=0",
            f"agent.tool_config_path={missing}",
            "data.prompts_per_step=10",
            "actor.prompts_per_mini_batch=4",
        ],
        check_paths=True,
    )
    assert "≥ 1" in _message(err, "agent.max_parallel_calls")
    assert str(missing) in _message(err, "agent.tool_config_path")
    assert _message(err, "data.prompts_per_step", "actor.prompts_per_mini_batch")  # all reported at once
    skipped = _errors(
        ["agent.enable=true", "agent.max_parallel_calls=0", f"agent.tool_config_path={missing}"]
    )
    assert not [p for p in skipped.problems if "agent.tool_config_path" in p.keys]  # check_paths=False
