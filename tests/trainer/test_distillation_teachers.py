"""Several distillation teachers keyed by data_source (distillation.teachers): two different tiny
teachers and two data sources train two steps through `stratarl train`, and each traced row's
teacher log-probs are those of its own data source's teacher (a plain HF forward of the traced
tokens), not the other's; a row whose data_source has no teacher and no default is refused at data
loading naming the source and the row; every teacher's vocabulary is checked naming both paths."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM

from stratarl.cli import main
from tests.test_cli import tiny_task  # noqa: F401  (the fixture)
from tests.trainer.test_distillation_runs import distill_run, train_records

SOURCES = ("arithmetic", "math")


@pytest.fixture(scope="module")
def two_sources(tiny_task, tmp_path_factory):  # noqa: F811
    """The task's training rows, odd ones relabelled data_source=math (a registered scorer)."""
    table = pq.read_table(tiny_task["train"])
    sources = [SOURCES[i % 2] for i in range(table.num_rows)]
    table = table.set_column(table.schema.get_field_index("data_source"), "data_source", pa.array(sources))
    path = tmp_path_factory.mktemp("two-sources") / "train.parquet"
    pq.write_table(table, path)
    return {**tiny_task, "train": str(path)}


@pytest.fixture(scope="module")
def teachers(tiny_task, tmp_path_factory):  # noqa: F811
    """Two 1M models on the task's corpus (the student's tokenizer) from two other seeds."""
    from stratarl.data.tiny_models import build_tiny_model
    from stratarl.data.tokenizer_factory import corpus_from_parquet

    root = tmp_path_factory.mktemp("teachers")
    corpus = corpus_from_parquet([tiny_task["train"]])
    return {
        source: build_tiny_model(root / source, size="1m", corpus_texts=corpus, seed=seed)
        for source, seed in zip(SOURCES, (1, 2), strict=True)
    }


def teachers_setting(paths) -> list[str]:
    mapping = ", ".join(f"{source}: {path}" for source, path in paths.items())
    return ["distillation.teacher_model_path=''", f"distillation.teachers={{{mapping}}}"]


def plain_teacher_log_probs(model, row, temperature: float) -> torch.Tensor:
    """log π_teacher of the row's response tokens from one forward over prompt ++ response."""
    ids = torch.tensor(row["prompt_ids"] + row["response_ids"])
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0].float() / temperature
    n = len(row["response_ids"])
    return torch.log_softmax(logits[-n - 1 : -1], -1).gather(-1, ids[-n:, None]).squeeze(-1)


def test_each_row_is_scored_by_the_teacher_of_its_data_source(two_sources, teachers, tmp_path):
    assert main(["train", *distill_run(two_sources, tmp_path, "", *teachers_setting(teachers))]) == 0
    assert [r["step"] for r in train_records(tmp_path)] == [1, 2]
    run_dir = tmp_path / "stratarl" / "distill_arithmetic"
    rows = pq.read_table(run_dir / "traces" / "step_000002.parquet").to_pylist()
    assert {row["data_source"] for row in rows} == set(SOURCES)  # both teachers scored this step
    models = {source: AutoModelForCausalLM.from_pretrained(path).eval() for source, path in teachers.items()}
    temperature = float(__import__("json").loads(rows[0]["sampling"])["temperature"])
    for row in rows:
        n = row["response_tokens"]
        got = torch.tensor(row["teacher_log_probs"][:n])
        own = plain_teacher_log_probs(models[row["data_source"]], row, temperature)
        other = plain_teacher_log_probs(
            models[next(s for s in SOURCES if s != row["data_source"])], row, temperature
        )
        torch.testing.assert_close(got, own, atol=1e-4, rtol=1e-4)
        assert (got - other).abs().max() > 1e-2  # the other teacher would give other numbers


def test_a_data_source_without_a_teacher_is_refused_at_data_loading(two_sources, teachers, tmp_path, capsys):
    only_one = teachers_setting({"arithmetic": teachers["arithmetic"]})
    assert main(["train", *distill_run(two_sources, tmp_path / "out", "", *only_one)]) == 2
    err = capsys.readouterr().err
    assert "data_source 'math' has no teacher" in err and f"{two_sources['train']} row 1" in err
    assert "distillation.teachers" in err and "Traceback" not in err
    assert not list((tmp_path / "out").rglob("metrics.jsonl"))  # refused before the first step


def test_a_default_teacher_scores_the_sources_without_their_own(two_sources, teachers, tmp_path):
    setting = [f"distillation.teacher_model_path={teachers['math']}",
               f"distillation.teachers={{arithmetic: {teachers['arithmetic']}}}"]  # fmt: skip
    assert main(["train", *distill_run(two_sources, tmp_path, "", *setting), "trainer.total_steps=1"]) == 0
    assert train_records(tmp_path)[-1]["distillation/teacher_log_prob_mean"] < 0


def test_every_teachers_vocabulary_is_checked_naming_both_paths(two_sources, teachers, tmp_path, capsys):
    from stratarl.data.tiny_models import build_tiny_model
    from stratarl.data.tokenizer_factory import corpus_from_parquet

    corpus = corpus_from_parquet([two_sources["train"]])
    other = build_tiny_model(tmp_path / "other", size="1m", corpus_texts=corpus, seed=0, vocab_size=280)
    setting = teachers_setting({"arithmetic": teachers["arithmetic"], "math": other})
    assert main(["train", *distill_run(two_sources, tmp_path / "out", "", *setting)]) == 2
    err = capsys.readouterr().err
    assert "distillation.teachers.math" in err and str(other) in err and str(two_sources["model"]) in err
