"""`stratarl train` with on-policy distillation on a tiny task: GRPO + distillation and distillation
alone each train two steps and log the teacher's log-prob and the distillation loss; a teacher with
another vocabulary and an unknown loss_mode are refused with exit code 2 before any worker starts."""

import math
from pathlib import Path

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


def test_distillation_alone_in_the_policy_gradient_form(tiny_task, teacher, tmp_path):  # noqa: F811
    extra = ["distillation.use_task_rewards=false", "distillation.use_policy_gradient=true",
             "distillation.loss_mode=k1"]  # fmt: skip
    assert main(["train", *distill_run(tiny_task, tmp_path, teacher, *extra)]) == 0
    records = train_records(tmp_path)
    m = records[-1]
    assert len(records) == 2 and math.isfinite(m["distillation/loss"])
    assert "distillation/pg_clipfrac" in m


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
