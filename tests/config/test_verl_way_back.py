"""The way back (`stratarl config RUN --as-verl`): verl → ours → verl keeps every translated key of five
verl command lines; our own recipes come out as verl lines that translate back to the same run; what
verl cannot say is listed, never dropped; the printed line survives the shell."""

import shlex
from pathlib import Path

import pytest

from stratarl.config import load_config
from stratarl.config.hydra_overrides import format_value, parse_value
from stratarl.config.setting import get_by_key
from stratarl.config.verl_args import read_verl_args, verl_defaults_path
from stratarl.config.verl_translation import TRANSLATIONS, load_verl_config
from stratarl.config.verl_way_back import VERL_PROGRAM, as_verl
from tests import verl_command_lines as lines

if verl_defaults_path() is None:
    pytest.skip("verl 0.9.1 is not installed (make setup installs it, --no-deps)", allow_module_level=True)

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.fixture
def paths(tmp_path):
    """Files the lines name (validation checks they exist; nothing is loaded)."""
    (tmp_path / "model").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer_config.json", "tokenizer.json"):
        (tmp_path / "model" / name).write_text("{}")
    for name in ("train.parquet", "test.parquet", "tools.yaml", "reward.py"):
        (tmp_path / name).write_text("")
    task = {name: str(tmp_path / f"{name}.parquet") for name in ("train", "test")}
    return {**task, "model": str(tmp_path / "model"), "tools": str(tmp_path / "tools.yaml"), "root": tmp_path}


def five_lines(paths):
    run, root = str(paths["root"] / "run"), paths["root"]
    return {
        "grpo_kl_lora": lines.grpo_kl_lora(paths, run),
        "ppo_critic": lines.ppo_critic(paths, run),
        "dapo": lines.dapo(paths, run, str(root / "reward.py")),
        "reinforce_plus_plus": lines.reinforce_plus_plus(paths, run),
        "multi_turn_tools": lines.multi_turn_tools(paths, run, root),
    }


def read(options, overrides):
    kwargs = {"config_path": options[1], "config_name": options[3]} if options else {}
    return load_verl_config(overrides, **kwargs), read_verl_args(overrides, **kwargs)


@pytest.mark.parametrize(
    "name", ["grpo_kl_lora", "ppo_critic", "dapo", "reinforce_plus_plus", "multi_turn_tools"]
)
def test_verl_to_ours_to_verl_keeps_every_translated_key(paths, name):
    (cfg, translation), given = read(*five_lines(paths)[name])
    line = as_verl(cfg)
    assert line.not_carried == []  # every setting of a verl line has a verl form

    (cfg_again, _), verl_again = read([], line.arguments())
    for rule in TRANSLATIONS:  # the same run: every translated setting of ours
        assert get_by_key(cfg_again, rule.ours) == get_by_key(cfg, rule.ours), rule.ours
    twins = {key for rule in TRANSLATIONS if len(rule.reads) > 1 for key in rule.reads}
    for record in translation.records:  # and every verl key the line set, where one key says it
        if record["class"] == "translated" and record["given"] != "verl default":
            key = record["verl_key"]
            if key not in twins:  # a legacy twin (custom_reward_function.*) comes back as its new name
                assert verl_again.value(key) == given.value(key), key


def test_the_way_back_sets_only_what_differs_from_verls_defaults(paths):
    (cfg, _), _ = read(*five_lines(paths)["reinforce_plus_plus"])
    line = as_verl(cfg)
    assert line.overrides["algorithm.adv_estimator"] == "reinforce_plus_plus"
    assert line.overrides["actor_rollout_ref.actor.kl_loss_type"] == "mse"
    assert line.overrides["data.train_batch_size"] == 4 and line.overrides["trainer.n_gpus_per_node"] == 1
    assert line.overrides["actor_rollout_ref.rollout.name"] == "vllm"  # mandatory in verl's config
    assert "actor_rollout_ref.actor.clip_ratio_low" not in line.overrides  # at verl's default
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size" not in line.overrides  # no effect here


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_each_recipe_of_ours_becomes_a_verl_line_that_trains_the_same_run(recipe):
    cfg = load_config(RECIPES / recipe)
    line = as_verl(cfg)
    # verl has no OpenAI-compatible endpoint for an agent program of the user's: the gateway recipe's
    # agent.gateway.* settings are listed as not carried, with the reason; nothing else may be
    ours_only = [(key, why) for key, _, why in line.not_carried if key.startswith("agent.gateway.")]
    assert ours_only == [(key, "no verl key sets it") for key, _, _ in line.not_carried]
    assert bool(ours_only) == cfg.agent.gateway.enable
    again = read_verl_args(line.arguments())
    from stratarl.config.loading import load_config_data
    from stratarl.config.verl_translation import translate

    cfg_again = load_config_data(translate(again).settings)
    for rule in TRANSLATIONS:
        if rule.ours in ("rollout.dtype", "trainer.run_dir"):  # our null / empty, said explicitly
            continue
        assert get_by_key(cfg_again, rule.ours) == get_by_key(cfg, rule.ours), rule.ours
    assert cfg_again.rollout.dtype == cfg.model.dtype  # null: the model's dtype
    assert cfg_again.trainer.run_dir == f"runs/{cfg.trainer.project_name}/{cfg.trainer.experiment_name}"


def test_what_verl_cannot_say_is_listed_with_the_reason():
    changes = ["trainer.mode=one_step_off", "cluster.host_allocator=system"]
    cfg = load_config(RECIPES / "quickstart.yaml", changes)
    line = as_verl(cfg)
    carried = {key: why for key, _, why in line.not_carried}
    assert "main_ppo trains synchronously" in carried["trainer.mode"]
    assert carried["cluster.host_allocator"] == "no verl key sets it"
    text = line.text()
    assert "# not carried to verl" in text and "#   trainer.mode=one_step_off:" in text
    assert "trainer.v1.trainer_mode" not in line.overrides


def test_the_printed_line_is_one_shell_command_whose_words_are_the_overrides(paths):
    (cfg, _), _ = read(*five_lines(paths)["dapo"])
    line = as_verl(cfg)
    command = [part for part in line.text().splitlines() if not part.startswith("#")]
    words = shlex.split(" ".join(part.rstrip("\\") for part in command))
    assert " ".join(words[:3]) == VERL_PROGRAM
    assert words[3:] == line.arguments()
    assert "+reward.reward_kwargs.overlong_buffer_cfg.max_resp_len=8" in words  # not in verl's config: +
    assert f"data.train_files=[{paths['train']}]" in words  # a list of one path (Hydra reads it bare)


@pytest.mark.parametrize(
    "value", [None, True, 3, 1e-6, "a b", "it's", "true", "1", "/x/y", ["a", "b c"], {"k": [1, 2]}, ""]
)
def test_format_value_is_the_inverse_of_hydras_parse(value):
    assert parse_value(format_value(value)) == value
