"""load_config merges defaults ← recipe ← overrides, and reports unknown keys and bad types together."""

import dataclasses
from pathlib import Path

import pytest

from stratarl.config import ConfigError, RunConfig, load_config, save_resolved_config, validate_config
from stratarl.config.loading import path_keys
from stratarl.config.schema_training import ValidationSamplingConfig

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _problem(err: ConfigError, key: str) -> str:
    """The message of the one problem that names `key`."""
    found = [p.message for p in err.problems if key in p.keys]
    assert len(found) == 1, f"expected one problem naming {key}, got {err.problems}"
    return found[0]


def test_defaults_load_as_typed_dataclasses():
    cfg = load_config()
    assert cfg == RunConfig()
    assert isinstance(cfg.rollout.val_kwargs, ValidationSamplingConfig)
    assert cfg.actor.betas == [0.9, 0.999] and cfg.critic.enable is None


def test_recipe_then_overrides_win_in_order(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("rollout:\n  n: 8\n  temperature: 0.7\nactor:\n  lr: 1e-4\n")
    cfg = load_config(
        recipe, ["rollout.n=3", "data.train_files=[a.parquet,b.parquet]", "trainer.total_steps=5"]
    )
    assert cfg.rollout.n == 3  # the override beats the recipe
    assert cfg.rollout.temperature == 0.7 and cfg.actor.lr == 1e-4  # the recipe beats the defaults
    assert cfg.data.train_files == ["a.parquet", "b.parquet"] and cfg.trainer.total_steps == 5
    assert cfg.rollout.top_p == RunConfig().rollout.top_p  # untouched settings keep their default


def test_a_recipe_extends_another_and_cycles_are_reported(tmp_path):
    (tmp_path / "base.yaml").write_text("rollout:\n  n: 8\n  top_k: 5\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nrollout:\n  n: 2\n")
    cfg = load_config(tmp_path / "child.yaml")
    assert (cfg.rollout.n, cfg.rollout.top_k) == (2, 5)
    (tmp_path / "base.yaml").write_text("extends: child.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "child.yaml")


def test_missing_recipe_names_its_path(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "nope.yaml")
    assert "nope.yaml" in _problem(err.value, "recipe")


def test_unknown_key_suggests_the_nearest_valid_key():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.temprature=0.5"])
    assert "'rollout.temperature'" in _problem(err.value, "rollout.temprature")


def test_a_verl_key_gets_our_name():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4"])
    assert "'data.prompts_per_step'" in _problem(err.value, "data.train_batch_size")
    assert "'actor.prompts_per_mini_batch'" in _problem(
        err.value, "actor_rollout_ref.actor.ppo_mini_batch_size"
    )


def test_bad_type_names_the_key_and_the_expected_type():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.n=abc"])
    assert "expected int" in _problem(err.value, "rollout.n")


def test_all_problems_of_recipe_and_overrides_are_reported_together(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("actor:\n  policy_loss:\n    clip_ratio_hi: 0.3\ntrainer:\n  total_epochs: many\n")
    overrides = ["rollout.n=abc", "cluster=3", "foo.bar=1", "actor.betas=0.9", "no_equals_sign"]
    with pytest.raises(ConfigError) as err:
        load_config(recipe, overrides)
    assert err.value.keys == {
        "actor.policy_loss.clip_ratio_hi",
        "trainer.total_epochs",
        "rollout.n",
        "cluster",
        "foo.bar",
        "actor.betas",
        "no_equals_sign",
    }
    assert "'actor.policy_loss.clip_ratio_high'" in _problem(err.value, "actor.policy_loss.clip_ratio_hi")
    assert "actor.betas=[0.9]" in _problem(err.value, "actor.betas")
    assert "7 problems" in str(err.value)


def test_free_form_kwargs_accept_any_key():
    cfg = load_config(None, ["reward.function_kwargs.alpha=2", "reward.function_kwargs.mode=strict"])
    assert cfg.reward.function_kwargs == {"alpha": 2, "mode": "strict"}


def test_saved_resolved_config_round_trips(tmp_path):
    recipe = tmp_path / "r.yaml"
    # An interpolation, an Optional set and unset, a list, a nested section and a free-form dict.
    recipe.write_text("trainer:\n  experiment_name: ${algorithm.adv_estimator}-n${rollout.n}\n")
    overrides = [
        "rollout.n=6",
        "actor.loss_scale_factor=512.0",
        "data.train_files=[x.parquet]",
        "algorithm.kl_ctrl.type=adaptive",
        "reward.function_kwargs.alpha=0.5",
    ]
    cfg = load_config(recipe, overrides)
    assert cfg.trainer.experiment_name == "grpo-n6"
    path = save_resolved_config(cfg, tmp_path / "run")
    assert path == tmp_path / "run" / "config.yaml"
    assert "experiment_name: grpo-n6" in path.read_text()  # resolved, not the ${...} expression
    reloaded = load_config(path)
    assert reloaded.data.train_files == [str(Path("x.parquet").absolute())]
    assert dataclasses.replace(reloaded, data=cfg.data, trainer=cfg.trainer) == cfg
    assert reloaded.trainer.output_root == str(Path("runs").absolute())


def test_every_setting_that_names_a_path_is_saved_absolute(tmp_path, monkeypatch):
    """A saved config repeats the run from any directory: each file and directory setting is made
    absolute (against the directory the run started in); the list of such settings is pinned here."""
    assert path_keys() == [
        "data.train_files", "data.val_files", "model.path", "model.tokenizer_path",
        "agent.tool_config_path", "agent.interaction_config_path", "agent.gateway.agent_function_path",
        "reference.model_path", "critic.model_path", "distillation.teacher_model_path",
        "reward.custom_function_path", "reward.model.path", "reward.model.tokenizer_path",
        "trainer.resume_from_path",
        "trainer.output_root", "trainer.run_dir", "sft.train_files",
    ]  # fmt: skip
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["model.path=models/m", "data.train_files=[d/a.parquet,/abs/b.parquet]"])
    text = save_resolved_config(cfg, "run").read_text()
    monkeypatch.chdir("/")
    saved = load_config(tmp_path / "run" / "config.yaml")
    assert saved.model.path == str(tmp_path / "models" / "m")
    assert saved.data.train_files == [str(tmp_path / "d" / "a.parquet"), "/abs/b.parquet"]
    assert saved.model.tokenizer_path == "" and saved.trainer.run_dir == ""  # empty stays empty
    assert "models/m\n" in text and not (tmp_path / "run" / "config.yaml.tmp").exists()


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_loads_and_validates(recipe):
    cfg = load_config(recipe)
    assert cfg != RunConfig()
    validate_config(cfg, check_paths=False)
