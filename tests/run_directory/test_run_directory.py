"""A run directory holds one run: reruns, foreign runs and second writers are refused with the choices,
overwrite moves the old run aside, and a resume lists (and refuses or records) every changed setting."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from stratarl.assembly import datasets, roles
from stratarl.cluster.run_checkpoint import RunCheckpoint
from stratarl.config import RunConfig
from stratarl.config.setting import leaf_settings
from stratarl.observe.run_log import read_metrics
from stratarl.run_directory.lock import LOCK_FILE, RunDirectoryError, RunLock
from stratarl.run_directory.resume_rules import FIXED, FREE_KEYS
from stratarl.trainer.rl_trainer import RLTrainer
from tests.trainer.test_rl_trainer import small_config


def run(task, run_dir, *extra):
    RLTrainer(
        small_config(task, "trainer.test_freq=0", "trainer.val_before_train=false", *extra), run_dir
    ).fit()


def train_steps(run_dir):
    return [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]


def refusal(task, run_dir, *extra):
    with pytest.raises(RunDirectoryError) as info:
        run(task, run_dir, *extra)
    return " ".join(str(info.value).split())


def test_rerunning_a_finished_run_is_refused_with_the_choices(task, tmp_path):
    """Was: the rerun appended, and metrics.jsonl read steps [1, 2, 3, 1, 2, 3]."""
    run_dir = tmp_path / "run"
    run(task, run_dir, "trainer.save_freq=0")
    message = refusal(task, run_dir, "trainer.save_freq=0")
    assert (
        "holds a finished run with no checkpoint to resume from (it ran with trainer.save_freq=0)" in message
    )
    assert "trainer.experiment_name=<new name>" in message and "trainer.overwrite=true" in message
    assert train_steps(run_dir) == [1, 2, 3]


def test_a_finished_run_with_a_checkpoint_can_only_be_extended_deliberately(task, tmp_path):
    run_dir = tmp_path / "run"
    run(task, run_dir, "trainer.save_freq=3")
    message = refusal(task, run_dir, "trainer.save_freq=3")
    assert "holds a finished run of 3 steps" in message
    assert (
        "raise trainer.total_steps above 3 and add trainer.resume_allow_changes=[trainer.total_steps]"
        in message
    )
    message = refusal(task, run_dir, "trainer.save_freq=3", "trainer.total_steps=4")
    assert (
        "trainer.resume_allow_changes=[trainer.total_steps]" in message
        and "trainer.total_steps: 3 → 4" in message
    )
    run(
        task,
        run_dir,
        "trainer.save_freq=3",
        "trainer.total_steps=4",
        "trainer.resume_allow_changes=[trainer.total_steps]",
    )
    assert train_steps(run_dir) == [1, 2, 3, 4]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished" and record["steps_done"] == 4
    assert [leg["start_step"] for leg in record["legs"]] == [0, 3]
    assert record["legs"][1]["changes"] == {"trainer.total_steps": [3, 4]}  # the history of accepted changes


def test_resume_mode_disable_where_a_run_lives_is_refused(task, tmp_path):
    """Was: a second run appended to the first (steps [1..6, 1, 2, 3]), and its retention deleted the
    new run's checkpoints while keeping the old run's."""
    run_dir = tmp_path / "run"
    run(task, run_dir, "trainer.save_freq=1", "trainer.total_steps=6", "trainer.max_checkpoints_to_keep=2")
    message = refusal(
        task,
        run_dir,
        "trainer.save_freq=1",
        "trainer.resume_mode=disable",
        "trainer.max_checkpoints_to_keep=2",
    )
    assert (
        "trainer.resume_mode=disable asks for a new one" in message
        and "resume it: trainer.resume_mode=auto" in message
    )
    assert train_steps(run_dir) == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("global_step_*")) == [
        "global_step_5",
        "global_step_6",
    ]


def test_a_run_stopped_before_its_first_checkpoint_is_not_appended_to(task, tmp_path, monkeypatch):
    """Was: the rerun logged steps 1.. again after the dead run's steps."""
    run_dir = tmp_path / "run"
    trainer = RLTrainer(small_config(task, "trainer.test_freq=0", "trainer.save_freq=3"), run_dir)
    real_step = trainer.train_step

    def dies_at_step_2(step):
        if step == 2:
            raise KeyboardInterrupt  # as a kill would stop it (the lock goes with the process)
        return real_step(step)

    monkeypatch.setattr(trainer, "train_step", dies_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    message = refusal(task, run_dir, "trainer.save_freq=3")
    assert (
        "holds a stopped (unfinished) run with no checkpoint to resume from (it ran with trainer.save_freq=3)"
        in message
    )
    assert train_steps(run_dir) == [1]


def test_overwrite_moves_the_old_run_aside_and_starts_clean(task, tmp_path):
    """Was: old val_generations stayed beside the new ones while final/ and curves.png were replaced."""
    run_dir = tmp_path / "run"
    run(task, run_dir, "trainer.test_freq=1", "trainer.total_steps=2")
    run(task, run_dir, "trainer.overwrite=true", "trainer.test_freq=0", "trainer.total_steps=1")
    (aside,) = tmp_path.glob("run.old-*")
    assert train_steps(aside) == [1, 2] and len(list((aside / "val_generations").iterdir())) == 2
    assert train_steps(run_dir) == [1] and not (run_dir / "val_generations").exists()
    assert (run_dir / "final" / "config.json").is_file() and (aside / "final" / "config.json").is_file()
    assert (
        json.loads((run_dir / "run.json").read_text())["run_id"]
        != json.loads((aside / "run.json").read_text())["run_id"]
    )


def test_changed_settings_are_listed_and_refused_and_config_yaml_is_kept(task, tmp_path):
    """Was: lr, n and the train files changed silently, and config.yaml took the new seed even when
    the resume then failed."""
    run_dir = tmp_path / "run"
    base = ("trainer.save_freq=1", "trainer.total_steps=2")
    run(task, run_dir, *base, "trainer.total_steps=1")
    saved = (run_dir / "config.yaml").read_text()
    message = refusal(task, run_dir, *base, "trainer.seed=7", "rollout.n=2", "actor.prompts_per_mini_batch=4",
                      "actor.lr=0.01", "trainer.resume_allow_changes=[trainer.total_steps]")  # fmt: skip
    assert "cannot change within a run" in message
    assert "trainer.seed: 0 → 7" in message and "rollout.n: 4 → 2" in message
    assert "resume_allow_changes=[trainer.total_steps,actor.lr,actor.prompts_per_mini_batch]:" in message
    assert "actor.lr: 0.001 → 0.01" in message and "trainer.total_steps: 1 → 2" not in message  # allowed
    assert (run_dir / "config.yaml").read_text() == saved  # not written by a refused resume

    message = refusal(task, run_dir, *base, "actor.lr=0.01")
    assert "resume_allow_changes=[actor.lr,trainer.total_steps]:" in message
    run(
        task,
        run_dir,
        *base,
        "actor.lr=0.01",
        "trainer.test_freq=5",
        "trainer.resume_allow_changes=[actor.lr,trainer.total_steps]",
    )
    assert train_steps(run_dir) == [1, 2]
    legs = json.loads((run_dir / "run.json").read_text())["legs"]
    assert legs[1]["changes"] == {
        "actor.lr": [0.001, 0.01], "trainer.total_steps": [1, 2], "trainer.test_freq": [0, 5],
    }  # fmt: skip
    assert "lr: 0.01" in (run_dir / "config.yaml").read_text()


def test_a_lora_rank_change_is_refused_by_name_not_by_a_state_dict_error(task, tmp_path):
    run_dir = tmp_path / "run"
    lora = ("actor.lora.rank=4", "actor.lora.alpha=8", "actor.lr=1e-2", "trainer.save_freq=1")
    run(task, run_dir, *lora, "trainer.total_steps=1")
    message = refusal(task, run_dir, *lora, "actor.lora.rank=8", "trainer.total_steps=2",
                      "trainer.resume_allow_changes=[trainer.total_steps]")  # fmt: skip
    assert "actor.lora.rank: 4 → 8 (the checkpoint holds adapters of this shape)" in message
    assert "state_dict" not in message and "size mismatch" not in message


def test_an_allowance_for_an_unknown_or_fixed_setting_is_refused(task, tmp_path):
    run_dir = tmp_path / "run"
    run(task, run_dir, "trainer.save_freq=1", "trainer.total_steps=1")
    allow = "trainer.resume_allow_changes=[actor.lrr,trainer.seed,trainer.total_steps]"
    message = refusal(task, run_dir, "trainer.save_freq=1", "trainer.total_steps=2", allow)
    assert (
        "'actor.lrr' is not a setting" in message and "'trainer.seed' cannot change within a run" in message
    )


def test_a_second_writer_is_refused_at_once_naming_the_holder(task, tmp_path):
    """Was: two runs on one directory; one died on a missing manifest.json.tmp, the logs held step 1 twice."""
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from stratarl.run_directory.lock import RunLock; "
         "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)", str(run_dir)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.perf_counter()
        message = refusal(task, run_dir)
        assert time.perf_counter() - started < 5  # before any model loads
        assert f"is being written by pid {holder.pid} on host" in message
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = RunLock(run_dir).acquire()  # the holder died: its stale lock is taken over
    assert lock.taken_over["pid"] == holder.pid
    lock.release()
    assert (run_dir / LOCK_FILE).read_text() == ""  # released: nobody named
    run(task, run_dir, "trainer.total_steps=1")
    assert train_steps(run_dir) == [1]


def test_a_lock_left_by_another_host_is_not_taken_over(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere", "since": "t"}))
    with pytest.raises(RunDirectoryError, match="on another host: it may still be running there"):
        RunLock(tmp_path).acquire()


def test_retention_deletes_only_checkpoints_of_the_run_that_saves(task, tmp_path):
    """Another run's newer-numbered checkpoints in the same directory survive this run's retention."""
    cfg = small_config(task)
    tokenizer = datasets.load_tokenizer(cfg)
    worker = roles.build_policy_worker(cfg, tokenizer, total_steps=3)
    root = tmp_path / "checkpoints"
    other = RunCheckpoint(root, policy=worker, lineage="old-run")
    for step in (5, 6):
        other.save(step, tokenizer=tokenizer, trainer_state={})
    ours = RunCheckpoint(root, policy=worker, max_to_keep=2, lineage="new-run")
    for step in (1, 2, 3):
        ours.save(step, tokenizer=tokenizer, trainer_state={})
    assert ours.steps() == [6, 5, 3, 2]
    lineages = {
        s: torch.load(root / f"global_step_{s}" / "trainer_state.pt")["lineage"] for s in ours.steps()
    }
    assert lineages == {6: "old-run", 5: "old-run", 3: "new-run", 2: "new-run"}


def test_every_setting_named_by_the_resume_rules_exists():
    leaves = leaf_settings(RunConfig)
    assert set(FIXED) <= set(leaves) and set(leaves) >= FREE_KEYS
    assert not FREE_KEYS & set(FIXED)


def test_resume_path_to_an_older_checkpoint_moves_the_newer_ones_aside_and_a_fork_starts_elsewhere(
    task, tmp_path
):
    run_dir = tmp_path / "run"
    run(task, run_dir, "trainer.save_freq=1")
    back = f"trainer.resume_from_path={run_dir / 'checkpoints' / 'global_step_1'}"
    run(task, run_dir, "trainer.save_freq=1", "trainer.resume_mode=resume_path", back)
    assert train_steps(run_dir) == [1, 2, 3]  # steps 2 and 3 of the first leg were cut from the log
    (aside,) = (run_dir / "checkpoints").glob(".abandoned-*")
    assert sorted(p.name for p in aside.iterdir()) == ["global_step_2", "global_step_3"]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("global_step_*")) == [
        "global_step_1", "global_step_2", "global_step_3",
    ]  # fmt: skip

    fork = tmp_path / "fork"
    start = f"trainer.resume_from_path={run_dir / 'checkpoints' / 'global_step_2'}"
    run(task, fork, "trainer.resume_mode=resume_path", start, "trainer.save_freq=1")
    assert train_steps(fork) == [3]
    record = json.loads((fork / "run.json").read_text())
    assert record["forked_from"].endswith("global_step_2") and record["legs"][0]["start_step"] == 2
