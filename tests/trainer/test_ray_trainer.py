"""The unchanged trainer on Ray (cluster.backend=ray): both placements train, checkpoint through the
ranks, resume, and report the bytes that crossed the controller; PPO's critic runs on ranks of its own."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("ray")

import ray

from stratarl.apps.quickstart import RECIPE
from stratarl.assembly import datasets, roles
from stratarl.cluster.ranks import WorkerError
from stratarl.config import load_config
from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def ray_config(task, run_dir, placement, total_steps, extra=()):
    # Two training ranks; in the split plan they take half a CPU each and the rollout replica one.
    share = "0.5" if placement == "split" else "1.0"
    return load_config(
        RECIPE,
        [
            f"data.train_files=['{task['train']}']",
            f"data.val_files=['{task['test']}']",
            f"model.path={task['model']}",
            f"trainer.run_dir={run_dir}",
            f"trainer.total_steps={total_steps}",
            "trainer.save_freq=2",
            "trainer.test_freq=2",
            "trainer.val_before_train=false",
            "data.prompts_per_step=8",
            "rollout.n=2",
            "rollout.max_response_tokens=6",
            "actor.prompts_per_mini_batch=4",
            "actor.trajectories_per_micro_batch=4",
            "cluster.backend=ray",
            f"cluster.placement={placement}",
            "cluster.training_workers=2",
            f"cluster.cpus_per_training_worker={share}",
            "cluster.num_cpus=2",
            "cluster.call_timeout_s=300",
            *extra,
        ],
    )


@pytest.mark.parametrize(
    "placement",
    # split is `long` (make test-slow only, ~55 s), out of CI's 40-minute budget; CI keeps split
    # placement in test_ray_modes (one-step-off and async on split Ray) and tests/cluster/test_ray_split.
    ["colocated", pytest.param("split", marks=pytest.mark.long)],
)
def test_trainer_trains_checkpoints_and_resumes_on_ray(task, tmp_path, placement):
    os.environ.pop("RAY_ADDRESS", None)
    run_dir = tmp_path / "run"
    RLTrainer(ray_config(task, run_dir, placement, total_steps=2), run_dir).fit()
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["controller/sent_bytes"] > 0 and r["controller/received_bytes"] > 0 for r in train)
    assert (run_dir / "checkpoints" / "global_step_2" / "huggingface" / "config.json").is_file()

    extend = ("trainer.resume_allow_changes=[trainer.total_steps]",)  # the finished run is extended
    resumed = RLTrainer(ray_config(task, run_dir, placement, total_steps=3, extra=extend), run_dir)
    resumed.fit()
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert train[-1]["rollout/weight_version"] == 3.0  # resumed at version 2, one more sync


def test_ppo_critic_ranks_train_beside_the_actor_checkpoint_and_resume_on_ray(task, tmp_path):
    """GAE with a critic: on each 1-CPU bundle a policy rank and a critic rank of half a CPU each."""
    os.environ.pop("RAY_ADDRESS", None)
    run_dir = tmp_path / "run"
    ppo = (
        "algorithm.adv_estimator=gae",
        "critic.prompts_per_mini_batch=4",
        "critic.trajectories_per_micro_batch=4",
        "critic.lr=1e-3",
    )
    RLTrainer(ray_config(task, run_dir, "colocated", total_steps=2, extra=ppo), run_dir).fit()
    critic_dir = run_dir / "checkpoints" / "global_step_2" / "critic"
    assert {p.name for p in critic_dir.iterdir()} == {"model.pt", "optimizer.pt", "extra.pt"}
    assert not list((run_dir / "checkpoints").glob(".staged-*"))

    extend = ("trainer.resume_allow_changes=[trainer.total_steps]",)  # the finished run is extended
    RLTrainer(ray_config(task, run_dir, "colocated", total_steps=3, extra=(*ppo, *extend)), run_dir).fit()
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    for record in train:
        assert {"critic/vf_loss", "critic/grad_norm", "critic/vf_explained_var"} <= set(record), record
        assert record["controller/sent_bytes"] > 0
    assert train[-1]["rollout/weight_version"] == 3.0  # resumed at version 2, one more sync


def test_a_critic_that_cannot_start_stops_the_policy_processes_too(task, tmp_path):
    """The policy's ranks are up when the critic's fail: the error names the critic, and nothing is
    left running (the local cluster the policy started is shut down)."""
    os.environ.pop("RAY_ADDRESS", None)
    not_a_model = tmp_path / "not_a_model"
    not_a_model.mkdir()  # exists, so validation passes; loading it fails on the critic's ranks
    ppo = (
        "algorithm.adv_estimator=gae",
        f"critic.model_path={not_a_model}",
        "critic.prompts_per_mini_batch=4",
    )
    cfg = ray_config(task, tmp_path / "run", "colocated", total_steps=1, extra=ppo)
    tokenizer = datasets.load_tokenizer(cfg)
    with pytest.raises(WorkerError, match="critic worker group failed in phase 'init'"):
        roles.build_workers(cfg, tokenizer, total_steps=1)
    assert not ray.is_initialized()
