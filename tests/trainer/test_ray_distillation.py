"""On-policy distillation with the teacher on Ray (cluster.backend=ray): the teacher runs in a
process of its own on the plan's teacher pool (placement.json lists it), reads its rows' tokens
from the TransferQueue, and a 2-step run (forward_kl_topk, so the [N, T, K] columns travel through
the queue) gives the same teacher log-probs, token for token, as the same run in one process."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

pytest.importorskip("ray")

from stratarl.config import load_config
from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer
from tests.test_cli import RECIPES

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def teacher(task, tmp_path_factory):
    from stratarl.data.tiny_models import build_tiny_model
    from stratarl.data.tokenizer_factory import corpus_from_parquet

    corpus = corpus_from_parquet([task["train"]])
    return build_tiny_model(
        tmp_path_factory.mktemp("teacher") / "model", size="1m", corpus_texts=corpus, seed=1
    )


def distill_config(task, teacher, run_dir, backend: str):
    ray = ["cluster.backend=ray", "cluster.training_workers=1", "cluster.num_cpus=2",
           "cluster.call_timeout_s=300", "distillation.cpus=1"]  # fmt: skip
    return load_config(
        RECIPES / "distill_arithmetic.yaml",
        [
            f"data.train_files=['{task['train']}']",
            f"data.val_files=['{task['test']}']",
            f"model.path={task['model']}",
            f"distillation.teacher_model_path={teacher}",
            "distillation.loss_mode=forward_kl_topk",
            "distillation.topk=4",
            f"trainer.run_dir={run_dir}",
            "trainer.total_steps=2",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "data.prompts_per_step=4",
            "rollout.n=2",
            "rollout.max_response_tokens=6",
            "actor.prompts_per_mini_batch=4",
            "actor.trajectories_per_micro_batch=4",
            *(ray if backend == "ray" else []),
        ],
    )


def traced(run_dir, step):
    rows = pq.read_table(run_dir / "traces" / f"step_{step:06d}.parquet").to_pylist()
    return {(tuple(r["prompt_ids"]), r["sample_index"], tuple(r["response_ids"])): r for r in rows}


def test_the_ray_teachers_log_probs_equal_the_in_process_ones(task, teacher, tmp_path):
    os.environ.pop("RAY_ADDRESS", None)
    runs = {backend: tmp_path / backend for backend in ("in-process", "ray")}
    for backend, run_dir in runs.items():
        RLTrainer(distill_config(task, teacher, run_dir, backend), run_dir).fit()
    placement = json.loads((runs["ray"] / "placement.json").read_text())
    assert len(placement["teacher"]) == 1  # its own process, on its pool
    metrics = {
        b: [r for r in read_metrics(d / "metrics.jsonl") if r["phase"] == "train"] for b, d in runs.items()
    }
    assert [r["step"] for r in metrics["ray"]] == [1, 2]
    compared = 0
    for step in (1, 2):
        local, remote = traced(runs["in-process"], step), traced(runs["ray"], step)
        if step == 1:  # the same weights and seeds: the same samples
            assert local.keys() == remote.keys()
        for key in local.keys() & remote.keys():
            n = local[key]["response_tokens"]
            assert remote[key]["teacher_log_probs"][:n] == pytest.approx(
                local[key]["teacher_log_probs"][:n], rel=1e-5, abs=1e-5
            )
            compared += 1
    assert compared >= 8
    one, other = metrics["in-process"][0], metrics["ray"][0]
    for name in ("distillation/teacher_log_prob_mean", "distillation/teacher_mass", "distillation/loss"):
        assert other[name] == pytest.approx(one[name], rel=1e-4, abs=1e-6)
