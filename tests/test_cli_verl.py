"""`stratarl verl`: a command line in the form of verl's example scripts trains 2 GRPO steps on a tiny
task through the same path as `stratarl train`, and the run directory records the translation."""

import json

import pytest

from stratarl.cli import main
from stratarl.config.verl_args import verl_defaults_path
from stratarl.observe.run_log import read_metrics
from tests.test_cli import tiny_task  # noqa: F401  (the fixture: a tiny task and a 1M model)

if verl_defaults_path() is None:
    pytest.skip("verl 0.9.1 is not installed (make setup installs it, --no-deps)", allow_module_level=True)


def verl_script(task, run_dir):
    """examples/grpo_trainer/run_qwen2-7b.sh's arguments, with the model, data and sizes replaced, as
    the shell passes them (quotes the shell removes are gone; quotes inside a word reach Hydra)."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files=['{task['train']}']",
        f"data.val_files=['{task['test']}']",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=6",
        "data.filter_overlong_prompts=True",
        "data.truncation='error'",
        f"actor_rollout_ref.model.path={task['model']}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        'trainer.logger=["console"]',  # the shell's word for trainer.logger='["console"]'
        "trainer.project_name='verl_grpo_example_gsm8k'",
        "trainer.experiment_name='tiny'",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        f"trainer.default_local_dir={run_dir}",
        "reward.num_workers=2",
        "trainer.total_training_steps=2",
    ]


def test_a_verl_grpo_script_trains_two_steps_and_records_its_translation(tiny_task, tmp_path, capsys):  # noqa: F811
    run_dir = tmp_path / "run"
    assert main(["verl", "--dry-run", *verl_script(tiny_task, run_dir)]) == 0
    out = capsys.readouterr().out
    assert "data.train_batch_size = 4  ->  data.prompts_per_step = 4" in out
    assert not run_dir.exists()  # a dry run loads no model and writes nothing

    assert main(["verl", *verl_script(tiny_task, run_dir)]) == 0
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all("actor/kl_loss" in r for r in train)  # use_kl_loss was translated

    record = json.loads((run_dir / "verl_translation.json").read_text())
    assert record["verl_command_line"][0] == "algorithm.adv_estimator=grpo"
    keys = {(r["verl_key"], r.get("ours")): r for r in record["keys"]}
    batch = keys[("data.train_batch_size", "data.prompts_per_step")]
    assert (batch["verl_value"], batch["our_value"], batch["class"]) == (4, 4, "translated")
    assert batch["given"] == "command line"
    epochs = keys[("trainer.total_epochs", "trainer.total_epochs")]  # not given: verl's 30, not our 1
    assert (epochs["verl_value"], epochs["our_value"], epochs["given"]) == (30, 30, "verl default")
    memory = keys[("actor_rollout_ref.rollout.gpu_memory_utilization", None)]
    assert memory["class"] == "no effect" and memory["reason"]
    assert record["counts"]["translated"] > 100
