"""`stratarl train` with on-policy distillation on a tiny task: GRPO + distillation and distillation
alone each train two steps and log the teacher's log-prob and the distillation loss; the trace holds
the teacher's log-prob and ℓ_t of every token (`stratarl trace` shows them, `--field teacher_log_prob`
follows the field); trainer.mode=one_step_off and async train two steps with the teacher on stale
samples; forward_kl_topk trains two steps; a teacher with another vocabulary and an unknown
loss_mode are refused with exit code 2 before any worker starts."""

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stratarl.cli import main
from stratarl.observe.run_log import read_metrics
from tests.test_cli import RECIPES, small_run, tiny_task  # noqa: F401  (the fixture)

RECIPE = str(RECIPES / "distill_arithmetic.yaml")


@pytest.fixture(scope="module")
def teacher(tiny_task, tmp_path_factory):  # noqa: F811
    """A second 1M model on the same corpus (so the same tokenizer), initialised from another seed."""
    from stratarl.data.tiny_models import build_tiny_model
    from stratarl.data.tokenizer_factory import corpus_from_parquet

    root = tmp_path_factory.mktemp("teacher")
    corpus = corpus_from_parquet([tiny_task["train"]])
    return build_tiny_model(root / "model", size="1m", corpus_texts=corpus, seed=1)


def distill_run(task, out, teacher_dir, *extra):
    return [RECIPE, *small_run(task, out)[1:], f"distillation.teacher_model_path={teacher_dir}",
            "trainer.total_steps=2", "distillation.trajectories_per_micro_batch=8", *extra]  # fmt: skip


def train_records(out: Path, name: str = "distill_arithmetic"):
    run_dir = out / "stratarl" / name
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]


def test_grpo_with_distillation_trains_two_steps_and_logs_the_teacher(tiny_task, teacher, tmp_path):  # noqa: F811
    assert main(["train", *distill_run(tiny_task, tmp_path, teacher)]) == 0
    records = train_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    for m in records:
        assert m["distillation/teacher_log_prob_mean"] < 0  # log-probs of a random 1M model: ≈ −ln V
        assert math.isfinite(m["distillation/loss"]) and m["distillation/loss"] > 0  # k3 ≥ 0, teachers differ
        assert "actor/pg_loss" in m and "timing_s/teacher" in m


def test_the_trace_holds_the_teacher_and_the_distillation_term_per_token(
    tiny_task,  # noqa: F811
    teacher,
    tmp_path,
    capsys,
):
    assert main(["train", *distill_run(tiny_task, tmp_path, teacher)]) == 0
    run_dir = tmp_path / "stratarl" / "distill_arithmetic"
    records = train_records(tmp_path)
    rows = pq.read_table(run_dir / "traces" / "step_000002.parquet").to_pylist()
    assert len(rows) == 8  # 4 prompts × n = 2, all traced
    for row in rows:
        actions = [t for t, m in enumerate(_action_mask(row)) if m]
        teacher_lp, losses = row["teacher_log_probs"], row["distillation_losses"]
        assert len(teacher_lp) == len(losses) == row["response_tokens"]
        assert all(teacher_lp[t] < 0 for t in actions)  # log-probs of sampled tokens under a 1M model
        assert all(losses[t] >= 0 for t in actions)  # k3 ≥ 0
        mean = sum(teacher_lp[t] for t in actions) / len(actions)
        assert math.isclose(row["teacher_log_prob_mean"], mean, rel_tol=1e-5)
        assert math.isclose(row["distillation_loss_mean"], sum(losses[t] for t in actions) / len(actions),
                            rel_tol=1e-5)  # fmt: skip
        assert row["distillation_loss_mode"] == "k3"
    # the trace's per-token means average to the step's metric (token-weighted over all rows)
    tokens = [
        t for row in rows for t, m in zip(row["teacher_log_probs"], _action_mask(row), strict=True) if m
    ]
    assert math.isclose(sum(tokens) / len(tokens), records[-1]["distillation/teacher_log_prob_mean"],
                        rel_tol=1e-4)  # fmt: skip
    capsys.readouterr()
    assert main(["trace", str(run_dir), "--field", "teacher_log_prob"]) == 0
    report = capsys.readouterr().out
    assert "producer   teacher.log_prob" in report and "teacher_log_prob_mean" in report
    step_lines = [line.split() for line in report.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert [int(line[0]) for line in step_lines] == [1, 2] and all(float(line[2]) < 0 for line in step_lines)
    assert main(["trace", str(run_dir), "--sample", "0"]) == 0
    view = capsys.readouterr().out
    assert "teacher log-prob (mean)" in view and "distillation ℓ_t (k3)" in view
    assert f"{rows[0]['teacher_log_prob_mean']:.4g}" in view


def _action_mask(row):
    """1 on the row's action tokens, over its real response tokens (from its mask spans)."""
    mask = [0] * row["response_tokens"]
    for kind, a, b in json.loads(row["mask_spans"]):
        for t in range(a, min(b, len(mask))):
            mask[t] = int(kind == "action")
    return mask


PINNED_ASYNC = ["trainer.mode=async", "async_training.deterministic=true"]


@pytest.mark.parametrize(
    ("mode", "pinned"),
    [(["trainer.mode=one_step_off"], True), (PINNED_ASYNC, True),
     (["trainer.mode=async", "async_training.partial_rollout=continue"], False)],
    ids=["one_step_off", "async", "async-partial"],
)  # fmt: skip
def test_distillation_in_the_off_policy_modes(tiny_task, teacher, tmp_path, mode, pinned):  # noqa: F811
    """one_step_off, and async pinned (deterministic: each batch from the oldest version the bound
    allows), train step 2 on samples of staleness 1 whatever the threads' speeds; async with
    partial_rollout=continue (which cannot be pinned) within max_staleness = 1."""
    assert main(["train", *distill_run(tiny_task, tmp_path, teacher, *mode)]) == 0
    records = train_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    for m in records:
        assert m["distillation/teacher_log_prob_mean"] < 0
        assert math.isfinite(m["distillation/loss"]) and m["distillation/loss"] > 0
    run_dir = tmp_path / "stratarl" / "distill_arithmetic"
    rows = pq.read_table(run_dir / "traces" / "step_000002.parquet").to_pylist()
    staleness = {row["staleness"] for row in rows}
    assert staleness == {1} if pinned else staleness <= {0, 1}
    assert records[-1]["async/staleness_max"] == max(staleness)
    assert all(row["teacher_log_prob_mean"] < 0 and row["distillation_loss_mean"] >= 0 for row in rows)


def test_distillation_alone_in_the_policy_gradient_form(tiny_task, teacher, tmp_path):  # noqa: F811
    extra = ["distillation.use_task_rewards=false", "distillation.use_policy_gradient=true",
             "distillation.loss_mode=k1"]  # fmt: skip
    assert main(["train", *distill_run(tiny_task, tmp_path, teacher, *extra)]) == 0
    records = train_records(tmp_path)
    m = records[-1]
    assert len(records) == 2 and math.isfinite(m["distillation/loss"])
    assert "distillation/pg_clipfrac" in m


def test_forward_kl_top_k_trains_two_steps_from_the_cli(tiny_task, teacher, tmp_path):  # noqa: F811
    """The teacher hands over its top-8 per token, the student scores those ids in its update."""
    extra = ["distillation.loss_mode=forward_kl_topk", "distillation.topk=8",
             "distillation.log_prob_min_clamp=-20"]  # fmt: skip
    assert main(["train", *distill_run(tiny_task, tmp_path, teacher, *extra)]) == 0
    records = train_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    for m in records:
        assert math.isfinite(m["distillation/loss"]) and m["distillation/loss"] > 0  # two random models
        assert (
            0 < m["distillation/teacher_mass"] <= 1 + 1e-6 and 0 < m["distillation/student_mass"] <= 1 + 1e-6
        )
        assert 0 <= m["distillation/overlap_ratio"] <= 1
        assert m["distillation/teacher_log_prob_mean"] < 0
    run_dir = tmp_path / "stratarl" / "distill_arithmetic"
    rows = pq.read_table(run_dir / "traces" / "step_000002.parquet").to_pylist()
    assert {row["distillation_loss_mode"] for row in rows} == {"forward_kl_topk"}
    assert all(row["distillation_loss_mean"] >= 0 for row in rows)  # clamped at 0 per token


def test_a_teacher_with_another_vocabulary_is_refused_naming_both_paths(tiny_task, tmp_path, capsys):  # noqa: F811
    from stratarl.data.tiny_models import build_tiny_model
    from stratarl.data.tokenizer_factory import corpus_from_parquet

    corpus = corpus_from_parquet([tiny_task["train"]])  # a tokenizer of 299 tokens on this corpus
    other = build_tiny_model(tmp_path / "other", size="1m", corpus_texts=corpus, seed=0, vocab_size=280)
    assert main(["train", *distill_run(tiny_task, tmp_path / "out", other)]) == 2
    err = capsys.readouterr().err
    assert "distillation.teacher_model_path" in err and str(other) in err and str(tiny_task["model"]) in err
    assert not (tmp_path / "out").exists()


def test_an_unknown_loss_mode_is_refused_naming_the_key(tiny_task, teacher, tmp_path, capsys):  # noqa: F811
    assert (
        main(["train", *distill_run(tiny_task, tmp_path, teacher, "distillation.loss_mode=reverse_kl")]) == 2
    )
    err = capsys.readouterr().err
    assert "distillation.loss_mode" in err and "'k3'" in err and "Traceback" not in err
