"""Planted failures, each a real 8-step GRPO run from the shared SFT model (about 10-20 s each on 2
cores): the doctor names the cause in the right layer with a next step that fixes it, and does not
report the cause's symptoms as causes of their own; a healthy async run gives no warning. Slow and
long: CI's slow tier has no room left, `make test-slow` runs them. The same classes are tested on
synthetic run directories in tests/observe (every `make test`)."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from stratarl.apps.quickstart import RECIPE
from stratarl.assembly import datasets
from stratarl.config import load_config
from stratarl.data.tokenizer_factory import train_tokenizer
from stratarl.observe.doctor.diagnosis import diagnose
from stratarl.observe.doctor.view import load_run
from stratarl.trainer.rl_trainer import RLTrainer
from tests.trainer.planted_runs import alarming, overrides, run
from tests.trainer.test_agent_rollout import tool_config

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.long]

INVERTED = """from stratarl.reward.arithmetic import compute_score as graded


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 - graded(data_source, solution_str, ground_truth)["score"]  # pays for wrong answers
"""

LENGTHY = """def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return min(1.0, len(solution_str) / 60)  # pays for length, not for the answer
"""
LEAKY = """KEPT = []


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    KEPT.append(bytearray(8 * 1024 * 1024))  # a cache never cleared: 8 MiB a call, 256 MiB a step
    return 1.0 if f"Answer: {ground_truth}" in solution_str else 0.0
"""


def by_key(findings):
    return {f.key: f for f in findings}


def test_a_learning_rate_far_too_high_is_named_before_its_symptoms(sft_task, tmp_path):
    found = by_key(run(sft_task, tmp_path / "run", "actor.lr=3e-2"))
    problem = found["policy_broken"]
    assert problem.severity == "problem" and problem.layer == "config", list(found)
    assert "actor.lr" in problem.next_step
    assert not {"truncation", "no_signal", "weak_signal"} & set(found)  # symptoms, not causes


def test_a_temperature_near_zero_is_sampling_too_cold(sft_task, tmp_path):
    found = by_key(run(sft_task, tmp_path / "run", "rollout.temperature=0.05"))
    problem = found["cold_sampling"]
    assert problem.layer == "config", list(found)
    assert "rollout.temperature" in problem.next_step
    assert not {"weak_signal", "no_signal", "flat_loss"} & set(found)  # the sampler, not the update


def test_a_negative_entropy_coefficient_is_named_as_the_cause(sft_task, tmp_path):
    found = by_key(run(sft_task, tmp_path / "run", "actor.entropy_coeff=-1.0"))
    problem = found["negative_entropy_bonus"]
    assert problem.layer == "config" and "actor.entropy_coeff" in problem.next_step
    assert not {"entropy", "weak_signal", "policy_broken"} & set(found), list(found)


def test_a_reward_that_pays_for_wrong_answers_is_a_wrong_sign(sft_task, tmp_path):
    scorer = tmp_path / "inverted.py"
    scorer.write_text(INVERTED)
    found = by_key(run(sft_task, tmp_path / "run", f"reward.custom_function_path={scorer}"))
    problem = found["reward_sign"]
    assert problem.severity == "problem" and problem.layer == "compute & environment", list(found)
    assert "ground truth" in " ".join(problem.evidence) and "reward's sign" in problem.next_step
    assert "reward_constant" not in found


def test_a_tokenizer_whose_eos_is_not_the_end_of_turn_is_an_eos_problem(sft_task, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(sft_task["model"], model)
    settings = json.loads((model / "tokenizer_config.json").read_text())
    settings["eos_token"] = "<|endoftext|>"  # the chat template ends a turn with <|im_end|>
    (model / "tokenizer_config.json").write_text(json.dumps(settings))
    found = by_key(run({**sft_task, "model": model}, tmp_path / "run"))
    problem = found["eos"]
    assert problem.severity == "problem" and problem.layer == "config", list(found)
    assert "<|im_end|>" in problem.next_step and "eos_token" in problem.next_step
    assert "truncation" not in found  # raising rollout.max_response_tokens would not help


def test_a_tokenizer_from_another_model_is_named(sft_task, tmp_path):
    size = json.loads((sft_task["model"] / "config.json").read_text())["vocab_size"]
    other = train_tokenizer([f"the quick brown fox {i} jumps over the lazy dog" for i in range(400)],
                            vocab_size=size)  # fmt: skip
    other.save_pretrained(tmp_path / "other_tokenizer")
    found = by_key(run(sft_task, tmp_path / "run", f"model.tokenizer_path={tmp_path / 'other_tokenizer'}"))
    problem = found["tokenizer_mismatch"]
    assert problem.severity == "problem" and problem.layer == "config", list(found)
    assert "model.tokenizer_path" in problem.next_step
    assert not {"reward_constant", "no_signal", "weak_signal"} & set(found)  # explained by it


def test_prompts_dropped_by_the_length_filter_are_counted_and_named(sft_task, tmp_path):
    # Three quarters of the rows carry a long preamble and pass data.max_prompt_tokens: the overlong
    # filter drops them, the run trains on the other quarter.
    rows = pq.read_table(sft_task["train"]).to_pylist()
    for i, row in enumerate(rows):
        if i % 4:
            row["prompt"][0]["content"] = "Read the question carefully. " * 4 + row["prompt"][0]["content"]
    train = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), train)
    cfg = load_config(RECIPE, overrides(sft_task))
    short = len(datasets.load_prompts([str(sft_task["train"])], datasets.load_tokenizer(cfg),
                                      max_prompt_tokens=512, limit=None)[0].prompt_ids)  # fmt: skip
    planted = {**sft_task, "train": train}
    found = by_key(run(planted, tmp_path / "run", f"data.max_prompt_tokens={short}"))
    problem = found["prompts_dropped"]
    assert problem.evidence[0] == "data/prompts_dropped 48, data/prompts_kept 16: 75% dropped", (
        problem.evidence
    )
    assert problem.severity == "problem" and problem.layer == "config"
    assert "data.max_prompt_tokens" in problem.next_step


def test_a_kl_coefficient_that_drowns_the_policy_loss_is_named(sft_task, tmp_path):
    found = by_key(run(sft_task, tmp_path / "run", "actor.use_kl_loss=true", "actor.kl_loss_coef=50"))
    problem = found["kl_dominates"]
    assert problem.layer == "config" and "actor.kl_loss_coef" in problem.next_step, list(found)


def test_a_critic_that_does_not_learn_is_named(sft_task, tmp_path):
    ppo = ["algorithm.adv_estimator=gae", "algorithm.gamma=1.0", "algorithm.lam=1.0", "critic.lr=0",
           "critic.prompts_per_mini_batch=4", "critic.trajectories_per_micro_batch=16"]  # fmt: skip
    found = by_key(run(sft_task, tmp_path / "run", *ppo))
    problem = found["critic"]
    assert problem.layer == "RL math" and "critic.lr" in problem.next_step, list(found)


def test_a_tool_that_always_fails_is_named(sft_tool_task, tmp_path):
    tools = yaml.safe_load(Path(sft_tool_task["tools"]).read_text())
    tools["tools"][0]["class_name"] = "tests.trainer.failing_tools.UnreachableCalculator"
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump(tools))
    cfg = tool_config({**sft_tool_task, "tools": tmp_path / "tools.yaml"}, "trainer.total_steps=4")
    RLTrainer(cfg, tmp_path / "run").fit()
    found = by_key(diagnose(load_run(tmp_path / "run")))
    problem = found["tool_failures"]
    assert problem.severity == "problem" and problem.layer == "compute & environment", list(found)
    assert "agent.tool_config_path" in problem.next_step


def test_a_run_killed_mid_step_is_dead_at_once_and_resume_advice_fits(sft_task, tmp_path):
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "stratarl", "train", str(ROOT / "recipes" / "grpo_arithmetic.yaml"),
               *overrides(sft_task, "trainer.total_steps=200", "trainer.save_freq=0",
                          f"trainer.run_dir={run_dir}")]  # fmt: skip
    trainer = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and '"step": 3' not in _text(run_dir / "metrics.jsonl"):
            time.sleep(0.2)
    finally:
        trainer.kill()  # SIGKILL mid-run: no clean stop, no error report
        trainer.wait()
    found = by_key(diagnose(load_run(run_dir)))  # at once: the metrics are seconds old
    problem = found["progress"]
    assert problem.severity == "problem" and "is dead" in problem.title, list(found)
    assert "no longer holds the run directory's lock" in " ".join(problem.evidence)
    assert "there is no checkpoint to resume from (trainer.save_freq=0)" in problem.next_step


def _text(path):
    return path.read_text() if path.exists() else ""


def test_a_rollout_in_bf16_is_a_precision_mismatch(sft_task, tmp_path):
    found = by_key(run(sft_task, tmp_path / "run", "rollout.dtype=bfloat16"))
    problem = found["mismatch"]
    assert problem.layer == "compute & environment" and "rollout.dtype" in problem.next_step, list(found)


def test_a_reward_that_pays_for_length_is_hacking_not_a_broken_update(sft_task, tmp_path):
    scorer = tmp_path / "length.py"
    scorer.write_text(LENGTHY)
    extra = [f"reward.custom_function_path={scorer}", "rollout.max_response_tokens=32", "actor.lr=1e-3"]
    found = by_key(run(sft_task, tmp_path / "run", *extra))
    problem = found["length_hacking"]
    assert problem.layer == "compute & environment" and "reward.overlong_buffer" in problem.next_step
    # entropy rose 15× as the policy wrote longer text (an EPYC: 0.30 → 4.5): paid for, not broken
    assert not {"policy_broken", "truncation"} & set(found), list(found)


def test_a_scorer_that_keeps_what_it_scored_is_memory_growth(sft_task, tmp_path):
    scorer = tmp_path / "leak.py"
    scorer.write_text(LEAKY)
    found = by_key(run(sft_task, tmp_path / "run", f"reward.custom_function_path={scorer}",
                       "reward.in_process=true"))  # fmt: skip
    problem = found["memory_growth"]
    assert problem.layer == "compute & environment", list(found)


def test_a_healthy_async_run_gives_no_warning(sft_task, tmp_path):
    findings = run(sft_task, tmp_path / "run", "trainer.mode=async", "async_training.max_staleness=2")
    assert alarming(findings) == [], [f.title for f in findings]


def distilled(teacher):
    return ("distillation.enabled=true", f"distillation.teacher_model_path={teacher}",
            "distillation.trajectories_per_micro_batch=16")  # fmt: skip


def test_a_random_teacher_beside_the_task_reward_is_named(task, sft_task, tmp_path):
    """The untrained 1M model as the teacher: it prefers the higher-reward response of a pair at
    chance (0.537 of 123 pairs on an EPYC; the line is 0.574 there)."""
    found = by_key(run(sft_task, tmp_path / "run", *distilled(task["model"])))
    finding = found["teacher_disagrees"]
    assert finding.layer == "config" and "distillation.distillation_loss_coef" in finding.next_step
    assert "teacher_model_path" in finding.next_step


def test_a_teacher_that_knows_the_task_is_not_named(sft_task, tmp_path):
    """The SFT model itself as the teacher agrees with the reward (0.805 of 128 pairs on an EPYC)."""
    findings = run(sft_task, tmp_path / "run", *distilled(sft_task["model"]))
    assert "teacher_disagrees" not in by_key(findings), [f.title for f in findings]
