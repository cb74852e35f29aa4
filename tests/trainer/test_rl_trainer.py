"""End to end in one process: a 1M-parameter model trains 3 GRPO steps, and bad input is survived."""

import io
import json

import pytest
import torch
from rich.console import Console
from transformers import AutoModelForCausalLM

from stratarl.apps.quickstart import RECIPE
from stratarl.config import ConfigError, load_config
from stratarl.data.schema import read_rows, write_rows
from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer


def small_config(task, *extra):
    return load_config(
        RECIPE,
        [
            f"data.train_files=[{task['train']}]",
            f"data.val_files=[{task['test']}]",
            f"model.path={task['model']}",
            "data.prompts_per_step=4",
            "rollout.n=4",
            "rollout.max_response_tokens=8",
            "actor.prompts_per_mini_batch=2",
            "actor.trajectories_per_micro_batch=4",
            "actor.lr=1e-3",
            "trainer.total_steps=3",
            "trainer.test_freq=3",
            *extra,
        ],
    )


def test_three_grpo_steps_train_log_and_save_a_reloadable_model(task, tmp_path):
    trainer = RLTrainer(small_config(task), tmp_path / "run")
    before = {k: v.clone() for k, v in trainer.worker.local_worker().actor.model.state_dict().items()}
    last_val = trainer.fit()

    after = trainer.worker.local_worker().actor.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight changed"
    assert trainer.worker.weight_version == 3  # one sync per step

    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train = [r for r in records if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    expected = ["critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm"]
    expected += ["response_length/mean", "timing_s/gen", "timing_s/update_actor", "perf/throughput"]
    for name in expected:
        assert all(name in r for r in train), name
    assert "val-core/arithmetic/acc/mean@1" in last_val

    lines = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 3 * 16  # steps × B·n
    first = json.loads(lines[0])
    assert {"source_split", "source_row", "uid", "sample_index", "prompt", "ground_truth", "response",
            "reward", "reward_extra", "advantage", "weight_version"} <= first.keys()  # fmt: skip
    assert (tmp_path / "run" / "config.yaml").exists() and (tmp_path / "run" / "curves.png").exists()

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")
    for name, tensor in reloaded.state_dict().items():
        torch.testing.assert_close(tensor, after[name])


def test_two_grpo_steps_with_pf_ppo_train_on_the_redrawn_rows(task, tmp_path):
    # Three score levels (response length mod 3): max_min draws only rows at the batch's max or min.
    scorer = tmp_path / "length_mod_3.py"
    scorer.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(len(solution_str) % 3)\n")  # fmt: skip
    cfg = small_config(task, f"reward.custom_function_path={scorer}", "trainer.total_steps=2",
                       "trainer.test_freq=0", "trainer.val_before_train=false", "algorithm.use_pf_ppo=true",
                       "algorithm.pf_ppo.reweight_method=max_min")  # fmt: skip
    trainer = RLTrainer(cfg, tmp_path / "run")
    before = {k: v.clone() for k, v in trainer.worker.local_worker().actor.model.state_dict().items()}
    trainer.fit()
    after = trainer.worker.local_worker().actor.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight changed"

    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for record in train:
        assert 1 <= record["batch/pf_ppo_distinct_rows"] <= 16 and "timing_s/adv" in record
        assert record["actor/grad_norm"] > 0
    lines = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 2 * 16  # the batch keeps its N = B·n rows
    for step in (1, 2):
        rewards = {r["reward"] for r in records if r["step"] == step}
        assert len(rewards) <= 2  # only the max and the min of the step's three levels were drawn


def test_config_error_names_the_keys_before_anything_loads(task):
    with pytest.raises(ConfigError) as err:
        small_config(task, "actor.prompts_per_mini_batch=3")  # 4 prompts do not split into 3s
        RLTrainer(small_config(task, "actor.prompts_per_mini_batch=3"), task["root"] / "never")
    assert "prompts_per_mini_batch" in str(err.value)
    with pytest.raises(ConfigError, match=r"rollout\.n"):
        load_config(RECIPE, ["rollout.nn=4"])


def test_malformed_rows_are_skipped_and_reported(task, tmp_path, caplog):
    rows = read_rows(task["train"])
    rows[3]["prompt"] = None  # missing
    rows[5]["prompt"] = []  # no messages
    bad = tmp_path / "bad.parquet"
    write_rows(bad, rows)
    trainer = RLTrainer(
        small_config(task, f"data.train_files=[{bad}]", "trainer.total_steps=1"), tmp_path / "run"
    )
    report = trainer.train_set.report
    assert report.num_malformed == 2 and report.num_kept == len(rows) - 2
    assert "row 3" in report.summary() and str(bad) in report.summary()
    trainer.fit()


def test_raising_reward_function_scores_zero_counts_and_goes_on(task, tmp_path):
    scorer = tmp_path / "flaky.py"
    scorer.write_text(
        "calls = [0]\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    calls[0] += 1\n"
        "    if calls[0] % 2:\n"
        "        raise RuntimeError('scorer crashed')\n"
        "    return 1.0\n"
    )
    cfg = small_config(
        task, f"reward.custom_function_path={scorer}", "trainer.total_steps=1", "trainer.test_freq=0"
    )
    trainer = RLTrainer(cfg, tmp_path / "run")
    trainer.fit()
    (record,) = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "train"]
    assert record["reward/failures/RuntimeError"] > 0
    assert record["reward/failures/total"] == record["reward/failures/RuntimeError"]
    assert 0 < record["critic/score/mean"] < 1


def test_records_carry_ground_truth_and_scorer_extras_and_cut_responses_are_warned(task, tmp_path):
    """Was: validation records had no prompt or ground truth, trajectory records no ground truth or
    `acc`, and responses cut at rollout.max_response_tokens went unnoticed in validation. Was also:
    validation's warnings about the settings were computed and never shown."""
    out = io.StringIO()
    unread = "async_training.buffer_batches=3"  # trainer.mode=sync reads no async_training key
    cfg = small_config(task, "trainer.total_steps=1", "rollout.max_response_tokens=4", unread)
    RLTrainer(cfg, tmp_path / "run", console=Console(file=out, width=200)).fit()
    trajectory = json.loads((tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()[0])
    row = read_rows(task["train"])[trajectory["source_row"]]
    assert trajectory["ground_truth"] == row["reward_model"]["ground_truth"]
    assert set(trajectory["reward_extra"]) == {"acc", "format_ok"}  # the arithmetic scorer's extras
    generation = json.loads(
        (tmp_path / "run" / "val_generations" / "step_1.jsonl").read_text().splitlines()[0]
    )
    val_row = read_rows(task["test"])[generation["source_row"]]
    assert generation["ground_truth"] == val_row["reward_model"]["ground_truth"]
    assert val_row["prompt"][0]["content"] in generation["prompt"]
    assert generation["finish_reason"] in ("length", "stop") and generation["response_tokens"] <= 4
    (val,) = [
        r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "val" and r["step"] == 1
    ]
    ratio = val["val-aux/response_length/clip_ratio"]
    assert ratio > 0.5  # an untrained model rarely ends within 4 tokens
    assert (
        f"warning: {ratio:.0%} of the validation responses stopped at rollout.max_response_tokens=4"
        in out.getvalue()
    )
    assert "warning: async_training.buffer_batches=3 has no effect with trainer.mode=sync" in out.getvalue()
