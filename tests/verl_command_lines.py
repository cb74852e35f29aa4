"""Five verl command lines of the kinds in verl 0.9's examples/, written from its documentation (GRPO with
a KL loss and LoRA, PPO with a critic, DAPO's clip-higher with dynamic sampling and the overlong
buffer, REINFORCE++, a multi-turn tool recipe from a YAML config), with only the model, the data and
the sizes replaced. The words are as the shell passes them to `python3 -m verl.trainer.main_ppo`.

Each function takes the task's paths and a run directory and returns (options, overrides): options
are `--config-path/--config-name` words (the tool recipe's), overrides the Hydra `KEY=VALUE` words.
"""

from pathlib import Path

ARF, A, R = "actor_rollout_ref", "actor_rollout_ref.actor", "actor_rollout_ref.rollout"


def sizes(task, run_dir, *, n=4, response=6):
    """What every line replaces: the data, the model, the batch sizes, two steps on one process."""
    return [
        f"data.train_files=['{task['train']}']",
        f"data.val_files=['{task['test']}']",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        f"data.max_response_length={response}",
        f"{ARF}.model.path={task['model']}",
        f"{A}.ppo_mini_batch_size=2",
        f"{A}.ppo_micro_batch_size_per_gpu=4",
        f"{R}.log_prob_micro_batch_size_per_gpu=4",
        f"{ARF}.ref.log_prob_micro_batch_size_per_gpu=4",
        f"{R}.n={n}",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_training_steps=2",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        'trainer.logger=["console"]',
        f"trainer.default_local_dir={run_dir}",
        "reward.num_workers=1",
    ]


def grpo_kl_lora(task, run_dir):
    """examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh's kind: GRPO, low-variance KL loss, LoRA
    on every linear layer, the rollout loading adapters (load_format, layered_summon: no effect here)."""
    return [], [
        "algorithm.adv_estimator=grpo",
        *sizes(task, run_dir),
        f"{ARF}.model.use_shm=True",
        f"{ARF}.model.lora_rank=8",
        f"{ARF}.model.lora_alpha=16",
        f"{ARF}.model.target_modules=all-linear",
        f"{A}.optim.lr=3e-4",
        f"{ARF}.model.use_remove_padding=True",
        f"{A}.use_kl_loss=True",
        f"{A}.kl_loss_coef=0.001",
        f"{A}.kl_loss_type=low_var_kl",
        f"{A}.entropy_coeff=0",
        f"{ARF}.model.enable_gradient_checkpointing=True",
        f"{A}.fsdp_config.param_offload=False",
        f"{A}.fsdp_config.optimizer_offload=False",
        f"{R}.tensor_model_parallel_size=2",
        f"{R}.name=vllm",
        f"{R}.gpu_memory_utilization=0.6",
        f"{R}.load_format=safetensors",
        f"{R}.layered_summon=True",
        f"{ARF}.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.project_name='verl_grpo_example_gsm8k'",
        "trainer.experiment_name='qwen2.5_3b_grpo_lora'",
    ]


def ppo_critic(task, run_dir):
    """examples/ppo_trainer/run_qwen2-7b_rm_seq_balance.sh's kind without the reward model: GAE with a
    critic of the policy's model, dynamic batch sizes in tokens, a KL penalty in the reward."""
    return [], [
        "algorithm.adv_estimator=gae",
        *sizes(task, run_dir, n=2),
        f"{A}.optim.lr=1e-3",
        f"{ARF}.model.use_remove_padding=True",
        f"{ARF}.model.enable_gradient_checkpointing=True",
        f"{A}.use_dynamic_bsz=True",
        f"{A}.ppo_max_token_len_per_gpu=512",
        f"{A}.fsdp_config.param_offload=False",
        f"{A}.fsdp_config.optimizer_offload=False",
        f"{R}.tensor_model_parallel_size=2",
        f"{R}.name=vllm",
        f"{R}.gpu_memory_utilization=0.5",
        "critic.optim.lr=1e-3",
        "critic.model.use_remove_padding=True",
        f"critic.model.path={task['model']}",
        "critic.model.enable_gradient_checkpointing=True",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "critic.use_dynamic_bsz=True",
        "critic.ppo_max_token_len_per_gpu=1024",
        "critic.fsdp.param_offload=False",
        "critic.fsdp.optimizer_offload=False",
        "algorithm.use_kl_in_reward=True",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.critic_warmup=0",
        "trainer.project_name='verl_example'",
        "trainer.experiment_name='qwen2-7b_ppo'",
    ]


def dapo(task, run_dir, reward_file):
    """recipe/dapo/run_dapo_qwen2.5_32b.sh's kind: decoupled clip (0.2, 0.28), token-mean loss, no KL,
    dynamic sampling on `acc`, the overlong buffer penalty, a custom reward function."""
    return [], [
        "algorithm.adv_estimator=grpo",
        *sizes(task, run_dir, response=8),
        f"{A}.optim.lr=1e-3",
        "algorithm.use_kl_in_reward=False",
        "algorithm.kl_ctrl.kl_coef=0.0",
        f"{A}.use_kl_loss=False",
        f"{A}.kl_loss_coef=0.0",
        f"{A}.clip_ratio_low=0.2",
        f"{A}.clip_ratio_high=0.28",
        f"{A}.clip_ratio_c=10.0",
        f"{A}.loss_agg_mode=token-mean",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=acc",
        "algorithm.filter_groups.max_num_gen_batches=4",
        f"{R}.temperature=1.0",
        f"{R}.top_p=1.0",
        f"{R}.top_k=-1",
        f"{R}.val_kwargs.temperature=1.0",
        f"{R}.val_kwargs.top_p=0.7",
        f"{R}.val_kwargs.do_sample=True",
        f"{R}.val_kwargs.n=1",
        f"{A}.optim.weight_decay=0.1",
        f"{A}.optim.lr_warmup_steps=1",
        f"{A}.grad_clip=1.0",
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.name=compute_score",
        "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward.reward_kwargs.overlong_buffer_cfg.len=4",
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "+reward.reward_kwargs.overlong_buffer_cfg.log=False",
        "+reward.reward_kwargs.overlong_buffer_cfg.max_resp_len=8",
        "trainer.project_name='DAPO'",
        "trainer.experiment_name='DAPO-tiny'",
    ]


def reinforce_plus_plus(task, run_dir):
    """examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh's kind: REINFORCE++ advantages
    (whitened discounted returns), an mse KL loss against the reference."""
    return [], [
        "algorithm.adv_estimator=reinforce_plus_plus",
        *sizes(task, run_dir),
        f"{A}.optim.lr=3e-4",
        f"{ARF}.model.use_remove_padding=True",
        f"{A}.use_kl_loss=True",
        f"{A}.kl_loss_coef=0.001",
        f"{A}.kl_loss_type=mse",
        f"{A}.entropy_coeff=0",
        f"{R}.name=vllm",
        f"{R}.tensor_model_parallel_size=2",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.project_name='verl_example_gsm8k'",
        "trainer.experiment_name='qwen2_7b_reinforce_plus_plus'",
    ]


TOOL_CONFIG = """\
# examples/sglang_multiturn/config/gsm8k_multiturn_grpo.yaml's kind, on verl's defaults
hydra:
  searchpath:
    - file://verl/trainer/config
defaults:
  - ppo_trainer
  - _self_
data:
  max_prompt_length: 192  # the calculator's system prompt
  max_response_length: 24
  train_batch_size: 4
  return_raw_chat: True
actor_rollout_ref:
  hybrid_engine: True
  rollout:
    name: vllm
    multi_turn:
      enable: True
      max_assistant_turns: 3
      format: hermes
"""


def multi_turn_tools(task, run_dir, config_dir: Path):
    """examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh's kind: a YAML config composed on
    verl's ppo_trainer (--config-path/--config-name), a tool config, GRPO; vllm for sglang."""
    (config_dir / "tiny_multiturn_grpo.yaml").write_text(TOOL_CONFIG)
    options = ["--config-path", str(config_dir), "--config-name", "tiny_multiturn_grpo"]
    return options, [
        "algorithm.adv_estimator=grpo",
        *sizes(task, run_dir, response=24),
        "data.max_prompt_length=192",
        f"{A}.optim.lr=1e-3",
        f"{ARF}.model.use_remove_padding=True",
        f"{A}.use_kl_loss=True",
        f"{A}.kl_loss_coef=0.001",
        f"{A}.kl_loss_type=low_var_kl",
        f"{A}.entropy_coeff=0",
        f"{R}.tensor_model_parallel_size=2",
        f"{R}.gpu_memory_utilization=0.5",
        f"{R}.multi_turn.tool_config_path={task['tools']}",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.project_name='gsm8k_async_rl'",
        "trainer.experiment_name='tiny-gsm8k-multiturn'",
    ]
