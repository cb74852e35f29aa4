"""Engine and LoRA keys: defaults match the engine, verl names are recognised, bad values are named."""

import pytest

from stratarl.config import ConfigError, load_config, validate_config
from stratarl.config.schema_training import ADAMW_IMPLS, LAYOUTS, LOGIT_CHUNK_SIZE
from stratarl.engine import fused_head, optim, packing
from stratarl.engine.training import OptimizerSettings


def _problems(*overrides) -> dict[tuple[str, ...], str]:
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(None, list(overrides)), check_paths=False)
    return {problem.keys: problem.message for problem in err.value.problems}


def test_schema_defaults_are_the_engine_defaults():
    cfg = load_config(None, [])
    assert LOGIT_CHUNK_SIZE == fused_head.LOGIT_CHUNK_SIZE == cfg.actor.logit_chunk_size
    assert set(LAYOUTS) == set(packing.LAYOUTS)
    assert set(ADAMW_IMPLS) == set(optim.ADAMW_IMPLS)
    assert cfg.actor.adamw_impl == cfg.critic.adamw_impl == OptimizerSettings(lr=1.0).adamw_impl == "auto"
    assert cfg.actor.lora.rank == 0 and cfg.actor.max_tokens_per_micro_batch is None  # off by default
    validate_config(cfg, check_paths=False)


def test_lora_settings_load_from_a_recipe_list_or_all_linear():
    cfg = load_config(None, ["actor.lora.rank=8", "actor.lora.target_modules=[q_proj,v_proj]"])
    assert cfg.actor.lora.target_modules == ["q_proj", "v_proj"]
    validate_config(cfg, check_paths=False)
    assert load_config(None, ["actor.lora.rank=8"]).actor.lora.target_modules == "all-linear"


def test_verl_names_point_to_ours():
    with pytest.raises(ConfigError, match=r"actor\.lora\.rank"):
        load_config(None, ["actor_rollout_ref.model.lora_rank=8"])
    with pytest.raises(ConfigError, match=r"actor\.max_tokens_per_micro_batch"):
        load_config(None, ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096"])


@pytest.mark.parametrize(
    ("override", "key", "says"),
    [
        ("actor.lora.rank=-1", "actor.lora.rank", "≥ 0"),
        ("actor.lora.alpha=0", "actor.lora.alpha", "> 0"),
        ("actor.lora.target_modules=q_proj", "actor.lora.target_modules", "list of module names"),
        ("actor.lora.target_modules=[]", "actor.lora.target_modules", "list of module names"),
        ("actor.layout=unpadded", "actor.layout", "'packed'"),
        ("reference.layout=dense", "reference.layout", "'padded'"),
        ("critic.layout=x", "critic.layout", "'packed'"),
        ("actor.adamw_impl=apex", "actor.adamw_impl", "'fused'"),
        ("critic.adamw_impl=Fused", "critic.adamw_impl", "'fused'"),
        ("actor.max_tokens_per_micro_batch=0", "actor.max_tokens_per_micro_batch", "null or > 0"),
        ("actor.logit_chunk_size=-4", "actor.logit_chunk_size", "null or > 0"),
        ("reference.logit_chunk_size=0", "reference.logit_chunk_size", "null or > 0"),
        ("critic.max_tokens_per_micro_batch=-1", "critic.max_tokens_per_micro_batch", "null or > 0"),
    ],
)
def test_bad_values_are_named_by_their_key(override, key, says):
    problems = _problems(override)
    assert says in problems[(key,)]


def test_a_budget_below_one_trajectory_names_the_three_keys():
    # 64 prompt + 16 response tokens = 80: a budget of 79 cannot hold the longest trajectory
    problems = _problems(
        "data.max_prompt_tokens=64",
        "rollout.max_response_tokens=16",
        "reference.max_tokens_per_micro_batch=79",
    )
    keys = ("reference.max_tokens_per_micro_batch", "data.max_prompt_tokens", "rollout.max_response_tokens")
    assert "80" in problems[keys]
    ok = [
        "data.max_prompt_tokens=64",
        "rollout.max_response_tokens=16",
        "actor.max_tokens_per_micro_batch=80",
    ]
    validate_config(load_config(None, ok), check_paths=False)
