"""`stratarl verl`: command lines in the form of verl's example scripts (GRPO, GRPO with LoRA, PPO with a
critic, DAPO, REINFORCE++, a multi-turn tool recipe from a YAML config) train 2 steps each on a tiny task
through the same path as `stratarl train`; the run directory records the translation, and
`stratarl config RUN --as-verl` gives back a line that `stratarl verl` takes."""

import json
import shlex

import pytest

from stratarl.cli import main
from stratarl.config import load_config
from stratarl.config.verl_args import verl_defaults_path
from stratarl.observe.run_log import read_metrics
from tests import verl_command_lines as verl_lines
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


@pytest.fixture(scope="module")
def tool_task(tmp_path_factory):
    """The calculator tool task and a 1M model whose tokenizer was trained on it."""
    from stratarl.data.tasks.tool_arithmetic import make_tool_dataset
    from stratarl.data.tiny_models import build_tiny_model
    from stratarl.data.tokenizer_factory import corpus_from_parquet

    root = tmp_path_factory.mktemp("verl-tool-task")
    paths = make_tool_dataset(root / "data", n_train=16, n_test=4, digits=(3, 3), seed=0)
    corpus = corpus_from_parquet([paths["train"]])
    return {**paths, "model": build_tiny_model(root / "model", size="1m", corpus_texts=corpus, seed=0)}


LENGTH_PARITY_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Variance on an untrained model (the length's parity), so dynamic sampling keeps groups."""
    acc = float(len(solution_str) % 2)
    return {"score": acc, "acc": acc}
'''


def train_metrics(run_dir):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]


def run_line(options, overrides):
    assert main(["verl", *options, *overrides]) == 0


def test_grpo_with_a_kl_loss_and_lora_trains_the_adapters(tiny_task, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    run_line(*verl_lines.grpo_kl_lora(tiny_task, run_dir))
    train = train_metrics(run_dir)
    assert [r["step"] for r in train] == [1, 2] and all("actor/kl_loss" in r for r in train)
    cfg = load_config(run_dir / "config.yaml")
    lora = cfg.actor.lora
    assert (lora.rank, lora.alpha, lora.target_modules) == (8, 16.0, "all-linear")
    assert cfg.actor.policy_loss.name == "vanilla" and cfg.algorithm.adv_estimator == "grpo"


def test_ppo_with_a_critic_trains_both_and_puts_the_kl_in_the_reward(tiny_task, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    run_line(*verl_lines.ppo_critic(tiny_task, run_dir))
    train = train_metrics(run_dir)
    assert [r["step"] for r in train] == [1, 2]
    assert all("critic/vf_loss" in r and "critic/values/mean" in r for r in train)
    cfg = load_config(run_dir / "config.yaml")
    assert cfg.algorithm.adv_estimator == "gae" and cfg.algorithm.use_kl_in_reward
    assert cfg.actor.max_tokens_per_micro_batch == 512


def test_dapo_clip_higher_with_dynamic_sampling_and_the_overlong_buffer(tiny_task, tmp_path):  # noqa: F811
    run_dir, reward = tmp_path / "run", tmp_path / "length_parity.py"
    reward.write_text(LENGTH_PARITY_REWARD)
    run_line(*verl_lines.dapo(tiny_task, run_dir, reward))
    train = train_metrics(run_dir)
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["batch/gen_rounds"] >= 1 for r in train)  # dynamic sampling ran
    cfg = load_config(run_dir / "config.yaml")
    assert (cfg.actor.policy_loss.clip_ratio_low, cfg.actor.policy_loss.clip_ratio_high) == (0.2, 0.28)
    assert cfg.algorithm.filter_groups.enable and cfg.algorithm.filter_groups.metric == "acc"
    assert cfg.reward.overlong_buffer.enable and cfg.reward.overlong_buffer.len == 4


def test_reinforce_plus_plus_with_an_mse_kl_loss(tiny_task, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    run_line(*verl_lines.reinforce_plus_plus(tiny_task, run_dir))
    train = train_metrics(run_dir)
    assert [r["step"] for r in train] == [1, 2] and all("actor/kl_loss" in r for r in train)
    cfg = load_config(run_dir / "config.yaml")
    assert cfg.algorithm.adv_estimator == "reinforce_plus_plus" and cfg.actor.kl_loss_type == "mse"


def test_a_multi_turn_tool_recipe_from_a_yaml_config_runs_episodes(tool_task, tmp_path):
    run_dir = tmp_path / "run"
    run_line(*verl_lines.multi_turn_tools(tool_task, run_dir, tmp_path))
    train = train_metrics(run_dir)
    assert [r["step"] for r in train] == [1, 2]
    assert all("agent/tool_calls/total" in r for r in train)  # episodes ran through the tool loop
    cfg = load_config(run_dir / "config.yaml")
    assert cfg.agent.enable and cfg.agent.max_assistant_turns == 3 and cfg.data.max_prompt_tokens == 192
    record = json.loads((run_dir / "verl_translation.json").read_text())
    given = {r["verl_key"]: r["given"] for r in record["keys"]}
    assert given["actor_rollout_ref.rollout.multi_turn.enable"].endswith("tiny_multiturn_grpo.yaml")


def test_a_run_comes_back_as_the_verl_line_that_made_it(tiny_task, tmp_path, capsys):  # noqa: F811
    run_dir = tmp_path / "run"
    options, overrides = verl_lines.reinforce_plus_plus(tiny_task, run_dir)
    run_line(options, overrides)
    capsys.readouterr()
    assert main(["config", str(run_dir), "--as-verl"]) == 0
    text = capsys.readouterr().out
    assert "python3 -m verl.trainer.main_ppo" in text
    assert "algorithm.adv_estimator=reinforce_plus_plus" in text
    words = shlex.split(" ".join(line.rstrip("\\") for line in text.splitlines() if not line.startswith("#")))
    assert main(["verl", "--dry-run", *words[3:]]) == 0  # the printed line is one stratarl verl takes back
