"""The quickstart's promise, end to end (slow): GRPO raises held-out greedy accuracy over SFT."""

import json

import pytest

from stratarl.apps.quickstart import TaskSettings, run_quickstart
from stratarl.observe.doctor.diagnosis import diagnose
from stratarl.observe.doctor.view import load_run


def problems_gained(summary: dict) -> int:
    """Held-out problems GRPO solved beyond SFT: a count, so that 2 of 40 is 2 (0.075 − 0.025 is not
    0.05 in floats; seed 1 failed the bar on that rounding)."""
    gain = summary["accuracy_after_grpo"] - summary["accuracy_after_sft"]
    return round(gain * TaskSettings().n_test)


@pytest.mark.slow
def test_make_demo_learns_on_seed_0(tmp_path):
    # What `make demo` runs, once (CI's slow tier): GRPO adds at least 2 of the 40 held-out problems
    # to SFT. Seed 0 gained 3 to 9 on the CPUs measured so far (docs/benchmarks.md, "quickstart").
    summary = run_quickstart(tmp_path, seed=0)
    assert summary["accuracy_after_sft"] > 0 and problems_gained(summary) >= 2, summary
    assert [f.title for f in diagnose(load_run(tmp_path)) if f.severity != "info"] == []


@pytest.mark.slow
@pytest.mark.long
def test_grpo_beats_the_sft_checkpoint_on_held_out_problems(tmp_path):
    # One held-out problem is 2.5 points, and where SFT lands moves with the CPU type (the float
    # reduction order), so one seed's gain is a noisy promise (docs/benchmarks.md, "quickstart"): the
    # bar is on three seeds — 5 problems gained on average, and at least 2 on every seed.
    gains = {}
    for seed in (0, 1, 2):
        summary = run_quickstart(tmp_path / f"seed{seed}", seed=seed)
        gains[seed] = problems_gained(summary)
        assert json.loads((tmp_path / f"seed{seed}" / "summary.json").read_text())["seed"] == seed
    assert sum(gains.values()) / 3 >= 5 and min(gains.values()) >= 2, gains
    assert (tmp_path / "seed0" / "grpo" / "curves.png").exists()
    # the doctor finds nothing alarming on the quickstart (docs/debugging.md shows its output)
    assert [f.title for f in diagnose(load_run(tmp_path / "seed0")) if f.severity != "info"] == []


@pytest.mark.slow
@pytest.mark.long
def test_ppo_with_a_critic_beats_the_sft_checkpoint_too(tmp_path):
    # recipes/ppo_arithmetic.yaml's settings on the quickstart's task: GAE, a critic from the SFT
    # policy's body, 2 critic-only steps first.
    ppo = ["algorithm.adv_estimator=gae", "algorithm.gamma=1.0", "algorithm.lam=1.0", "critic.lr=1e-3"]
    ppo += ["critic.prompts_per_mini_batch=32", "critic.trajectories_per_micro_batch=64"]
    summary = run_quickstart(tmp_path, seed=0, overrides=[*ppo, "critic.warmup_training_steps=2"])
    assert problems_gained(summary) >= 4, summary
    metrics = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in metrics if m["phase"] == "train"]
    assert "actor/pg_loss" not in train[0] and "actor/pg_loss" in train[2]  # critic warm-up: steps 1-2
    assert train[-1]["critic/vf_loss"] < train[0]["critic/vf_loss"]  # the value head fits the returns
    # a healthy PPO run: the doctor's critic, KL and signal checks find nothing alarming
    assert [f.title for f in diagnose(load_run(tmp_path)) if f.severity != "info"] == []


RAY_PLANS = {
    "colocated": ["cluster.training_workers=2"],
    "split": [
        "cluster.placement=split",
        "cluster.training_workers=2",
        "cluster.cpus_per_training_worker=0.5",
    ],
}


@pytest.mark.slow
@pytest.mark.long  # ~3 min each: out of CI's slow tier to keep .ci/run under 40 min (2026-12-03)
@pytest.mark.ray
@pytest.mark.parametrize("plan", sorted(RAY_PLANS))
def test_the_quickstart_learns_on_ray_with_the_queue_and_counts_the_controller_bytes(tmp_path, plan):
    # Issue 8's acceptance: the same recipe on 2 FSDP2 ranks (gloo), colocated or with a separate
    # rollout replica; the batches pass through the TransferQueue.
    overrides = ["cluster.backend=ray", "cluster.num_cpus=2", *RAY_PLANS[plan]]
    summary = run_quickstart(tmp_path, seed=0, overrides=overrides)
    # seed 0 gains +7.5 in one process on this CPU type (docs/benchmarks.md): at least 2 problems here
    assert problems_gained(summary) >= 2, summary
    metrics = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in metrics if m["phase"] == "train"]
    sent = [m["controller/sent_bytes"] for m in train]
    assert all(0 < s < 200_000 for s in sent), sent  # references and computed columns, not the rows
