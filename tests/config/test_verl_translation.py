"""A verl command line as our settings: every key of verl 0.9.1's generated config is classified, verl's
defaults (not ours) are what a run gets, units map with hand-computed numbers, and a refused key's
message names the verl key, the reason and our way — all before torch is imported."""

import subprocess
import sys

import pytest

from stratarl.config import ConfigError
from stratarl.config.verl_args import read_verl_args, verl_defaults_path, verl_leaf_keys
from stratarl.config.verl_rules import NO_EFFECT, REFUSED, TRANSLATED
from stratarl.config.verl_translation import classify, translate

if verl_defaults_path() is None:
    pytest.skip("verl 0.9.1 is not installed (make setup installs it, --no-deps)", allow_module_level=True)

A = "actor_rollout_ref.actor"
DL = "distillation.distillation_loss"


def ours(*overrides):
    return translate(read_verl_args(list(overrides))).settings


def test_every_leaf_of_verls_generated_config_is_classified():
    keys = verl_leaf_keys()
    assert len(keys) > 800  # verl 0.9.1: 898 leaves
    unclassified = [key for key in keys if classify(key) is None]
    assert unclassified == [], f"verl keys in none of translated / no effect / refused: {unclassified}"
    kinds = {classify(key)[0] for key in keys}
    assert kinds == {TRANSLATED, NO_EFFECT, REFUSED}


def test_verls_defaults_translate_and_win_over_ours():
    s = ours()  # verl's defaults alone: nothing refused
    assert s["data"]["prompts_per_step"] == 1024  # verl's train_batch_size, not our 16
    assert s["actor"]["prompts_per_mini_batch"] == 256
    assert s["rollout"]["n"] == 1 and s["algorithm"]["adv_estimator"] == "gae"
    assert s["trainer"]["total_epochs"] == 30 and s["trainer"]["test_freq"] == -1
    assert s["model"]["gradient_checkpointing"] is True  # verl's default; ours is false
    assert s["rollout"]["dtype"] == "bfloat16" and s["actor"]["fsdp"]["param_dtype"] == "bfloat16"
    assert s["rollout"]["val_kwargs"]["greedy"] is True  # do_sample=false, temperature 0
    assert s["cluster"] == {
        "training_workers": 8,
        "backend": "ray",
        "device": "auto",
        "num_cpus": None,
        "address": None,
        "transfer_queue_units": 0,
        "gpus_per_training_worker": 0.0,
    }  # fmt: skip  (this machine has no GPU)
    assert s["trainer"]["seed"] == 42 and s["data"]["seed"] is None  # verl's rollout.seed seeds the run


def test_several_gpus_reserve_one_gpu_per_training_process_on_a_gpu_cluster():
    cluster = "trainer.n_gpus_per_node=4", "trainer.nnodes=2", "+ray_kwargs.ray_init.address=10.0.0.1:6379"
    s = ours(*cluster)
    assert s["cluster"]["training_workers"] == 8 and s["cluster"]["backend"] == "ray"
    assert s["cluster"]["gpus_per_training_worker"] == 1.0
    assert ours(*cluster, "trainer.device=cpu")["cluster"]["gpus_per_training_worker"] == 0.0
    assert ours("trainer.n_gpus_per_node=1", "trainer.nnodes=1")["cluster"]["gpus_per_training_worker"] == 0.0


def test_batch_sizes_map_with_their_units():
    s = ours(
        "data.train_batch_size=32",
        "actor_rollout_ref.rollout.n=8",
        f"{A}.ppo_mini_batch_size=16",
        f"{A}.ppo_micro_batch_size_per_gpu=4",
        "trainer.n_gpus_per_node=2",
        "trainer.nnodes=1",
    )
    # prompts stay prompts: B = 32 per step, 16 per mini-batch -> 2 optimizer steps; 16·8 = 128
    # trajectories per mini-batch, 64 per worker, micro-batches of 4 per worker -> 16 accumulation steps
    assert s["data"]["prompts_per_step"] == 32 and s["rollout"]["n"] == 8
    assert s["actor"]["prompts_per_mini_batch"] == 16
    assert s["actor"]["trajectories_per_micro_batch"] == 4
    assert s["cluster"]["training_workers"] == 2 and s["cluster"]["backend"] == "ray"
    assert s["critic"]["prompts_per_mini_batch"] == 16  # follows the actor's, as in verl
    assert s["reference"]["trajectories_per_micro_batch"] == 4  # not given: the actor's


def test_the_global_micro_batch_and_no_micro_batch_become_per_worker_sizes():
    base = ["data.train_batch_size=32", "actor_rollout_ref.rollout.n=8", f"{A}.ppo_mini_batch_size=16"]
    # the deprecated global ppo_micro_batch_size=32 over 2 × 2 GPUs: 32 / 4 = 8 per worker
    s = ours(*base, f"{A}.ppo_micro_batch_size=32", "trainer.n_gpus_per_node=2", "trainer.nnodes=2")
    assert s["actor"]["trajectories_per_micro_batch"] == 8 and s["cluster"]["training_workers"] == 4
    # neither: the worker's whole mini-batch, 16 prompts · 8 / 1 GPU = 128 trajectories
    s = ours(*base, "trainer.n_gpus_per_node=1")
    assert s["actor"]["trajectories_per_micro_batch"] == 128 and s["cluster"]["backend"] == "in-process"


def test_values_map_where_verl_spells_them_differently():
    s = ours(
        "data.train_files=/d/train.parquet",
        "data.max_response_length=1024",
        "trainer.total_epochs=3",
        f"{A}.use_dynamic_bsz=true",
        f"{A}.ppo_max_token_len_per_gpu=4096",
        f"{A}.clip_ratio=0.3",
        f"{A}.clip_ratio_high=0.28",
        f"{A}.optim.lr_warmup_steps_ratio=0.1",
        "trainer.total_training_steps=50",
        f"{A}.fsdp_config.model_dtype=bf16",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.6",
        "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=left",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+custom_reward_function.reward_kwargs.scale=2",
    )
    assert s["data"]["train_files"] == ["/d/train.parquet"]  # one file -> a list
    assert s["rollout"]["max_response_tokens"] == 1024  # the rollout's response_length follows it
    assert s["trainer"]["total_epochs"] == 3 and s["trainer"]["total_steps"] == 50
    assert s["actor"]["max_tokens_per_micro_batch"] == 4096
    assert s["actor"]["policy_loss"]["clip_ratio_low"] == 0.3  # clip_ratio where low is not given
    assert s["actor"]["policy_loss"]["clip_ratio_high"] == 0.28
    assert s["actor"]["warmup_steps"] == 5  # lr_warmup_steps=-1: int(0.1 × 50)
    assert s["model"]["dtype"] == "bfloat16"
    assert s["rollout"]["val_kwargs"]["greedy"] is False and s["rollout"]["val_kwargs"]["temperature"] == 0.6
    assert s["agent"]["truncate_side"] == "head"
    assert s["actor"]["layout"] == "padded" and s["reference"]["layout"] == "padded"
    assert s["reward"]["function_kwargs"] == {"scale": 2}


def test_dapos_overlong_buffer_is_our_penalty_not_a_scoring_argument():
    # as verl's DAPO scripts write it
    s = ours(
        "data.max_response_length=512",
        "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward.reward_kwargs.overlong_buffer_cfg.len=128",
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        "+reward.reward_kwargs.overlong_buffer_cfg.max_resp_len=512",
        "+reward.reward_kwargs.scale=2",
    )
    assert s["reward"]["overlong_buffer"] == {"enable": True, "len": 128, "penalty_factor": 0.5}
    assert s["reward"]["function_kwargs"] == {"scale": 2}
    assert ours()["reward"]["overlong_buffer"]["enable"] is False
    with pytest.raises(ConfigError, match=r"max_resp_len=256 differs from data\.max_response_length=512"):
        ours(
            "data.max_response_length=512",
            "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward.reward_kwargs.overlong_buffer_cfg.max_resp_len=256",
        )


def test_pf_ppo_translates_to_our_settings():
    s = ours("algorithm.use_pf_ppo=true", "algorithm.pf_ppo.reweight_method=max_min")
    assert s["algorithm"]["use_pf_ppo"] is True and s["algorithm"]["pf_ppo"]["reweight_method"] == "max_min"


def test_a_refused_key_names_the_verl_key_the_reason_and_our_way():
    with pytest.raises(ConfigError) as err:
        ours(f"{A}.strategy=megatron", "actor_rollout_ref.rollout.name=sglang", f"{DL}.policy_loss_mode=gspo")
    text = str(err.value)
    assert "3 problems" in text
    assert f"{A}.strategy: 'megatron' is refused here: Megatron-LM" in text and "Our way: FSDP2" in text
    assert "actor_rollout_ref.rollout.name: 'sglang' is refused here: SGLang" in text
    assert f"{DL}.policy_loss_mode: 'gspo' is refused here" in text


def test_refused_keys_at_verls_default_and_allowed_values_pass():
    ours(f"{A}.strategy=fsdp2", "trainer.use_v1=true", "distillation.enabled=false")


def test_no_effect_keys_are_accepted_and_recorded_with_the_reason():
    translation = translate(read_verl_args(["actor_rollout_ref.rollout.gpu_memory_utilization=0.9",
                                            "actor_rollout_ref.model.use_liger=true"]))  # fmt: skip
    given = {r["verl_key"]: r for r in translation.records if r["given"] == "command line"}
    assert given["actor_rollout_ref.rollout.gpu_memory_utilization"]["class"] == NO_EFFECT
    assert "kernel" in given["actor_rollout_ref.model.use_liger"]["reason"]


def test_hydras_rules_for_adding_and_deleting_keys():
    with pytest.raises(ConfigError, match=r"data\.train_batch_sizee: is not in verl's config \(did you mean"):
        ours("data.train_batch_sizee=3")
    with pytest.raises(ConfigError, match=r"is already in verl's config"):
        ours("+data.train_batch_size=3")
    with pytest.raises(ConfigError, match=r"not a key of verl 0\.9\.1's config"):
        ours("+actor_rollout_ref.actor.no_such_knob=1")
    assert ours("~trainer.total_epochs")["trainer"]["total_epochs"] == 30  # deleted: verl's default
    assert ours("+ray_kwargs.ray_init.address=10.0.0.1:6379")["cluster"]["address"] == "10.0.0.1:6379"


def test_a_verl_yaml_config_composes_on_verls_defaults(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "hydra:\n  searchpath: [pkg://verl.trainer.config]\ndefaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  train_batch_size: 64\nactor_rollout_ref:\n  rollout:\n    n: 4\n"
    )
    args = read_verl_args(["actor_rollout_ref.rollout.n=5"], config_path=str(tmp_path), config_name="mine")
    s = translate(args).settings
    assert s["data"]["prompts_per_step"] == 64 and s["rollout"]["n"] == 5  # the command line last
    assert args.given["data.train_batch_size"].endswith("mine.yaml")


def test_validation_problems_name_the_verl_key_and_ours_before_torch_is_imported():
    code = (
        "import sys\nfrom stratarl.cli import main\n"
        "code = main(['verl', 'algorithm.adv_estimator=grpo', 'actor_rollout_ref.rollout.n=1'])\n"
        "print(code, sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[-2] == "2 []", out.stdout + out.stderr
    assert "actor_rollout_ref.rollout.n (our rollout.n)" in out.stderr
    assert "actor_rollout_ref.model.path (our model.path): directory not found" in out.stderr
