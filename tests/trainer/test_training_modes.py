"""trainer.mode end to end in one process: one_step_off reproduces exactly given the seed, each
trajectory's recorded weight version is the one whose weights generated it, staleness is exactly 1
after the first step and stays within async_training.max_staleness in async, off-policy samples get
the decoupled correction, and unbuilt combinations are refused naming their keys."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM

from stratarl.assembly.run_watch import PHASE_ROLES
from stratarl.config import ConfigError, validate_config
from stratarl.observe.doctor.diagnosis import diagnose
from stratarl.observe.doctor.view import load_run
from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer
from tests.trainer.test_resume import comparable as without_timings
from tests.trainer.test_rl_trainer import small_config

# A dense reward (the share of digits in the response), so that every group has signal and every
# step moves the weights measurably.
SCORER = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
"""
STEPS = 4
ROOT = Path(__file__).resolve().parents[2]
# wall-clock readings of the overlap, and whether the next batch happened to be ready in time
TIMED = ("async/rollout_busy_s", "async/rollout_idle_s", "async/trainer_idle_s", "async/overlap")
TIMED += ("async/buffer_depth",)


def comparable(records):
    return [{k: v for k, v in r.items() if not k.startswith(TIMED)} for r in without_timings(records)]


def mode_config(task, tmp_path, mode, *extra):
    scorer = tmp_path / "digits.py"
    scorer.write_text(SCORER)
    return small_config(
        task,
        f"trainer.mode={mode}",
        f"reward.custom_function_path={scorer}",
        f"trainer.total_steps={STEPS}",
        "trainer.test_freq=2",
        "actor.lr=1e-2",
        *extra,
    )


def train(config, run_dir):
    RLTrainer(config, run_dir).fit()
    records = read_metrics(run_dir / "metrics.jsonl")
    trajectories = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    return [r for r in records if r["phase"] == "train"], records, trajectories


def test_one_step_off_reproduces_exactly_and_is_one_step_stale(task, tmp_path):
    train_a, all_a, traj_a = train(mode_config(task, tmp_path, "one_step_off"), tmp_path / "a")
    _, all_b, traj_b = train(mode_config(task, tmp_path, "one_step_off"), tmp_path / "b")
    assert comparable(all_a) == comparable(all_b)  # every metric, validation included
    assert traj_a == traj_b  # the same prompts, samples, rewards and versions

    assert [r["async/staleness_max"] for r in train_a] == [0.0] + [1.0] * (STEPS - 1)
    assert [r["async/staleness_min"] for r in train_a] == [0.0] + [1.0] * (STEPS - 1)
    assert [r["rollout/staleness/mean"] for r in train_a] == [0.0] + [1.0] * (STEPS - 1)
    # step k trains version k − 1 on rows generated with version k − 2 (step 1: version 0, its own)
    assert [{t["weight_version"] for t in traj_a if t["step"] == k} for k in range(1, STEPS + 1)] == [
        {0},
        {0},
        {1},
        {2},
    ]
    assert [r["rollout/weight_version"] for r in train_a] == [1.0, 2.0, 3.0, 4.0]  # pushed every step
    # the decoupled correction is on by itself: π_old/π_rollout weights, which differ from 1 once stale
    assert all("rollout_corr/rollout_is_mean" in r for r in train_a)
    assert train_a[-1]["rollout_corr/rollout_is_std"] > 0
    for r in train_a[1:]:  # the producer's collection overlapped the training of the step before
        assert r["async/buffer_depth"] in (0.0, 1.0) and r["async/overlap_s"] >= 0

    assert not [f for f in diagnose(load_run(tmp_path / "a")) if f.key in ("stale", "mismatch")]
    # the same staleness in a sync run is a weight-sync problem
    (tmp_path / "a" / "config.yaml").write_text(
        (tmp_path / "a" / "config.yaml").read_text().replace("mode: one_step_off", "mode: sync")
    )
    assert [f.key for f in diagnose(load_run(tmp_path / "a")) if f.key == "stale"] == ["stale"]

    sync_train, _, _ = train(mode_config(task, tmp_path, "sync"), tmp_path / "sync")
    assert [r["async/staleness_max"] for r in sync_train] == [0.0] * STEPS
    assert sync_train[1]["critic/score/mean"] != train_a[1]["critic/score/mean"]  # other weights, other rows


def mean_log_prob(model, prompt_ids, response_ids, action_tokens, temperature):
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    token_log_probs = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt_ids) :, None])[:, 0]
    return token_log_probs[:action_tokens].mean().item()


def test_each_trajectory_was_generated_by_the_weights_of_its_recorded_version(task, tmp_path):
    run = tmp_path / "run"
    config = mode_config(task, tmp_path, "one_step_off", "trainer.save_freq=1")
    train(config, run)
    weights = {0: task["model"]} | {
        v: run / "checkpoints" / f"global_step_{v}" / "huggingface" for v in range(1, STEPS)
    }
    models = {v: AutoModelForCausalLM.from_pretrained(path).eval() for v, path in weights.items()}
    temperature = config.rollout.temperature
    for step in (3, 4):
        rows = pq.read_table(run / "traces" / f"step_{step:06d}.parquet").to_pylist()[:4]
        for row in rows:
            version = row["weight_version"]
            assert version == step - 2 and row["staleness"] == 1
            args = (row["prompt_ids"], row["response_ids"], row["action_tokens"], temperature)
            recorded = row["rollout_log_prob_mean"]
            same = abs(mean_log_prob(models[version], *args) - recorded)
            newer = abs(mean_log_prob(models[version + 1], *args) - recorded)
            assert same < 1e-4, (step, same)  # these weights produced the rollout's log-probs
            assert newer > 10 * same  # and the next version's do not


def test_async_keeps_staleness_within_its_bound_and_pushes_every_k_steps(task, tmp_path):
    extra = ["async_training.max_staleness=2", "async_training.weight_sync_interval=2"]
    train_records, _, trajectories = train(
        mode_config(task, tmp_path, "async", *extra, "trainer.total_steps=6"), tmp_path / "run"
    )
    assert [r["step"] for r in train_records] == list(range(1, 7))
    for r in train_records:
        assert 0 <= r["async/staleness_min"] <= r["async/staleness_max"] <= 2
        assert r["async/dropped_samples"] == 0  # stale_strategy=wait: paced, nothing thrown away
        assert 0 <= r["async/buffer_depth"] <= 2  # async_training.buffer_batches
    pushed = [r["step"] for r in train_records if "rollout/weight_version" in r]
    assert pushed == [2, 4, 6]
    assert [r["rollout/weight_version"] for r in train_records if "rollout/weight_version" in r] == [2, 4, 6]
    for t in trajectories:  # the recorded version is one the rollout served: 0 until step 2's push
        assert t["weight_version"] in (0, 2, 4) and t["step"] - 1 - t["weight_version"] <= 2
    # the doctor reads the mode's bound and the push interval: no weight-sync finding for this run
    assert not [f for f in diagnose(load_run(tmp_path / "run")) if f.key in ("stale", "mismatch")]


def test_async_drop_counts_what_it_throws_away(task, tmp_path):
    # max_staleness=0 under drop: only batches generated with the step's own weights are trained
    extra = ["async_training.max_staleness=0", "async_training.stale_strategy=drop"]
    train_records, _, _ = train(mode_config(task, tmp_path, "async", *extra), tmp_path / "run")
    assert all(r["async/staleness_max"] == 0 for r in train_records)
    total = train_records[-1]["async/dropped_samples_total"]
    assert total == sum(r["async/dropped_samples"] for r in train_records)
    assert total % 16 == 0  # whole batches of B·n rows


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        (["trainer.mode=fully_async"], "trainer.mode"),
        (
            ["trainer.mode=async", "async_training.max_staleness=1", "async_training.weight_sync_interval=4"],
            "async_training.max_staleness, async_training.weight_sync_interval",
        ),
        (["async_training.stale_strategy=correct"], "async_training.stale_strategy"),
        (
            ["async_training.deterministic=true", "async_training.stale_strategy=drop"],
            "async_training.deterministic, async_training.stale_strategy",
        ),
        (
            ["trainer.mode=async", "async_training.deterministic=true", "async_training.max_staleness=3"],
            "async_training.deterministic, async_training.buffer_batches",
        ),
    ],
)
def test_unbuilt_mode_choices_are_refused_naming_the_keys(task, overrides, keys):
    with pytest.raises(ConfigError) as error:
        validate_config(small_config(task, *overrides))
    assert keys in str(error.value)


SLEEPY = "import time\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
SLEEPY += "    time.sleep(60)\n    return 0.0\n"


def test_a_stalled_producer_is_named_by_the_watchdog_not_a_silent_hang(task, tmp_path):
    """one_step_off collects on the producer thread, step 1's batch too: its reward phase sleeping
    past the deadline stops the run, naming the producer's phase while the trainer waits for it."""
    scorer, run_dir = tmp_path / "sleepy.py", tmp_path / "run"
    scorer.write_text(SLEEPY)
    overrides = [
        f"data.train_files=['{task['train']}']",
        f"data.val_files=['{task['test']}']",
        f"model.path={task['model']}",
        f"trainer.run_dir={run_dir}",
        "trainer.mode=one_step_off",
        "trainer.total_steps=2",
        "trainer.val_before_train=false",
        "data.prompts_per_step=4",
        "rollout.n=2",
        "rollout.max_response_tokens=4",
        "actor.prompts_per_mini_batch=4",
        "actor.trajectories_per_micro_batch=8",
        f"reward.custom_function_path={scorer}",
        "watchdog.phase_timeouts_s={reward: 2}",
    ]
    cmd = [
        sys.executable,
        "-m",
        "stratarl",
        "train",
        str(ROOT / "recipes" / "grpo_arithmetic.yaml"),
        *overrides,
    ]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode != 0 and time.monotonic() - start < 120, done.stderr[-3000:]
    assert "phase 'reward' (role reward, step 1) passed its deadline of 2 s" in done.stderr, done.stderr[
        -3000:
    ]
    (report_path,) = (run_dir / "hang").glob("*/report.json")
    active = {(p["phase"], p["role"]) for p in json.loads(report_path.read_text())["active_phases"]}
    assert ("reward", "reward") in active  # the producer's phase
    assert ("wait_rollout", PHASE_ROLES["wait_rollout"]) in active  # the trainer, waiting for it
    stacks = next(report_path.parent.glob("stacks-controller-*.txt")).read_text()
    assert "stratarl-rollout" in stacks or "batch_sources.py" in stacks  # the producer thread's stack


def test_async_resumes_from_its_checkpoint_with_the_buffer_it_saved(task, tmp_path):
    """A checkpoint under async holds the producer: the finished batches in the buffer are saved
    with the sampler position after them, and the resumed run trains them first, within the bound."""
    extra = ["async_training.max_staleness=2", "trainer.save_freq=2"]
    first, _, _ = train(mode_config(task, tmp_path, "async", *extra), tmp_path / "run")
    assert [r["step"] for r in first] == [1, 2, 3, 4]
    state = torch.load(
        tmp_path / "run" / "checkpoints" / "global_step_4" / "trainer_state.pt", weights_only=False
    )
    saved = state["batches"]["ready"]
    assert [b.step for b in saved] == list(range(5, 5 + len(saved)))  # the steps after the checkpoint
    longer = ["trainer.total_steps=6", "trainer.resume_allow_changes=[trainer.total_steps]"]
    resumed, _, trajectories = train(mode_config(task, tmp_path, "async", *extra, *longer), tmp_path / "run")
    assert [r["step"] for r in resumed] == list(range(1, 7))
    assert all(r["async/staleness_max"] <= 2 for r in resumed)
    for batch in saved:  # each saved batch was trained at its step, as generated before the kill
        rows = [t for t in trajectories if t["step"] == batch.step]
        assert {t["weight_version"] for t in rows} == {batch.version}
        assert [t["uid"] for t in rows] == [str(u) for u in batch.item.batch["uid"]]
