"""Prompt loading: template applied once, over-long prompts dropped and counted, bad rows reported."""

import logging

import pytest
from tokenizers import Tokenizer, processors
from transformers import PreTrainedTokenizerFast

from stratarl.data.prompt_dataset import load_prompt_dataset, tokenize_prompt
from stratarl.data.schema import read_rows, write_rows
from stratarl.data.tokenizer_factory import IM_START


def _row(content, *, split="train", index=0, truth="3"):
    return {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": content}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index},
    }


def test_items_keep_ids_messages_truth_and_source(arithmetic_paths, tokenizer):
    dataset = load_prompt_dataset(arithmetic_paths["test"], tokenizer, max_prompt_tokens=256)
    rows = read_rows(arithmetic_paths["test"])
    assert len(dataset) == len(rows) == dataset.report.num_kept == dataset.report.num_rows
    for item, row in zip(dataset.items, rows, strict=True):
        rendered = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        assert item.prompt_ids == tokenizer.encode(rendered, add_special_tokens=False)
        assert item.messages == row["prompt"] and item.ground_truth == row["reward_model"]["ground_truth"]
        assert (item.source_split, item.source_row) == ("test", row["extra_info"]["index"])
        assert item.source_file == str(arithmetic_paths["test"])


def test_chat_template_applied_once(tokenizer):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 2+2?"}]
    ids = tokenize_prompt(tokenizer, messages)
    # 2 message headers + 1 generation header; a second template pass would double them.
    assert ids.count(tokenizer.convert_tokens_to_ids(IM_START)) == 3
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_no_double_bos_with_a_llama_style_tokenizer(tokenizer):
    """A tokenizer that adds BOS on encode AND writes {{ bos_token }} in its template."""
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())  # a copy: the fixture is shared
    bos = "<|endoftext|>"
    backend.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, 0)])
    llama_like = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        chat_template="{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
    )
    messages = [{"role": "user", "content": "1+2"}]
    ids = tokenize_prompt(llama_like, messages)
    assert ids.count(0) == 1 and ids[0] == 0
    # The mistake this guards against: render, then encode with special tokens -> two BOS.
    text = llama_like.apply_chat_template(messages, tokenize=False)
    assert llama_like(text)["input_ids"].count(0) == 2


def test_overlong_prompts_dropped_and_counted(tmp_path, tokenizer):
    contents = ["1+2", "12+34+56", "1+2+3+4+5+6+7+8", "x" * 3, "99*99*99*99*99*99*99*99"]
    path = write_rows(tmp_path / "p.parquet", [_row(c, index=i) for i, c in enumerate(contents)])
    lengths = [len(tokenize_prompt(tokenizer, [{"role": "user", "content": c}])) for c in contents]
    limit = sorted(lengths)[2]  # the median length: a prompt of exactly `limit` tokens is kept
    dataset = load_prompt_dataset(path, tokenizer, max_prompt_tokens=limit)
    expected_kept = [i for i, n in enumerate(lengths) if n <= limit]
    assert [item.source_row for item in dataset.items] == expected_kept
    assert dataset.report.num_overlong == len(contents) - len(expected_kept) > 0
    assert dataset.report.longest_kept_tokens == limit
    assert dataset.report.num_malformed == 0


def test_malformed_rows_reported_with_file_and_row_and_skipped(tmp_path, tokenizer, caplog):
    rows = [
        _row("1+1", index=0),
        {**_row("x"), "prompt": None},
        {**_row("x"), "prompt": []},
        {**_row("x"), "reward_model": None},
        {**_row("x"), "prompt": [{"role": "user", "content": None}]},
        _row("2+2", index=5),
    ]
    good = write_rows(tmp_path / "mixed.parquet", rows)
    no_prompt = write_rows(
        tmp_path / "noprompt.parquet", [{"data_source": "a", "reward_model": {"ground_truth": "1"}}]
    )
    with caplog.at_level(logging.WARNING, logger="stratarl.data.prompt_dataset"):
        dataset = load_prompt_dataset([good, no_prompt], tokenizer, max_prompt_tokens=64, max_problems=3)
    report = dataset.report
    assert [item.source_row for item in dataset.items] == [0, 5]
    assert (report.num_rows, report.num_kept, report.num_malformed) == (7, 2, 5)
    assert [(p.reason, p.count, p.rows) for p in report.problems.values()] == [
        ("prompt must be a list of chat messages", 1, [(str(good), 1)]),
        ("prompt has no messages", 1, [(str(good), 2)]),
        ("reward_model must be a dict with ground_truth", 1, [(str(good), 3)]),
        ("prompt[0].content must be a string", 1, [(str(good), 4)]),
        ("prompt column is missing", 1, [(str(no_prompt), 0)]),
    ]
    assert f"  malformed: prompt has no messages: 1 row ({good} row 2)" in report.summary()
    assert "mixed.parquet row 1" in caplog.text and len(caplog.records) == 1


def _pyarrow_parquet(path, n, *, drop=(), **columns):
    """`n` arithmetic rows written with pyarrow itself, without the `drop` columns; `columns`: per-row
    values replacing those columns (None entries are nulls)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([_row(f"{i}+1", index=i, truth=str(i + 1)) for i in range(n)])
    for name, values in columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values))
    pq.write_table(table.drop_columns(list(drop)), path)
    return path


def test_a_missing_column_is_one_line_with_its_rows_counted_and_printed_once(tmp_path, tokenizer, caplog):
    """Was: the same message once per row (five rows, then "... and 1995 more"), and the block twice:
    logged as a warning, then again in the error."""
    path = _pyarrow_parquet(tmp_path / "train.parquet", 2000, drop=["reward_model"])
    with (
        caplog.at_level(logging.INFO, logger="stratarl.data.prompt_dataset"),
        pytest.raises(ValueError) as err,
    ):
        load_prompt_dataset(path, tokenizer, max_prompt_tokens=64)
    message = str(err.value)
    assert f"  malformed: reward_model column is missing: 2000 rows ({path} rows 0, 1, 2, 3, 4, …)" in message
    assert message.count("malformed:") == 1 and "more" not in message
    assert not caplog.records  # the report is in the error only


def test_wrong_values_are_grouped_and_a_null_data_source_reads_as_missing(tmp_path, tokenizer):
    n = 50
    text = _pyarrow_parquet(tmp_path / "text.parquet", n, prompt=[f"{i}+1" for i in range(n)])
    with pytest.raises(ValueError) as err:
        load_prompt_dataset(text, tokenizer, max_prompt_tokens=64)
    assert [line for line in str(err.value).splitlines() if "malformed:" in line] == [
        f"  malformed: prompt must be a list of chat messages: 50 rows ({text} rows 0, 1, 2, 3, 4, …; "
        "first value: str '0+1')"
    ]
    sources = [None if 10 <= i < 20 else "arithmetic" for i in range(n)]
    path = _pyarrow_parquet(tmp_path / "s.parquet", n, data_source=sources)
    report = load_prompt_dataset(path, tokenizer, max_prompt_tokens=64).report
    assert [str(p) for p in report.problems.values()] == [
        f"data_source is missing (null): 10 rows ({path} rows 10, 11, 12, 13, 14, …)"
    ]
    assert "NoneType" not in report.summary() and report.num_kept == 40


def test_template_failure_is_a_reported_row(tmp_path, tokenizer):
    strict = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer.backend_tokenizer.to_str()),
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        chat_template="{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('no tools here') }}{% endif %}{{ m['content'] }}{% endfor %}",
    )
    rows = [_row("1+1"), {**_row("x"), "prompt": [{"role": "tool", "content": "42"}]}]
    dataset = load_prompt_dataset(write_rows(tmp_path / "t.parquet", rows), strict, max_prompt_tokens=64)
    assert len(dataset) == 1 and dataset.report.num_malformed == 1
    [problem] = dataset.report.problems.values()
    assert "no tools here" in problem.reason and problem.rows == [(str(dataset.report.files[0]), 1)]


def test_no_usable_rows_is_an_error_with_the_report(tmp_path, tokenizer):
    path = write_rows(tmp_path / "long.parquet", [_row("1+2+3+4+5+6+7+8+9")])
    with pytest.raises(ValueError, match="over 5 prompt tokens 1"):
        load_prompt_dataset(path, tokenizer, max_prompt_tokens=5)


def test_split_falls_back_to_file_stem(tmp_path, tokenizer):
    row = {k: v for k, v in _row("1+1").items() if k != "extra_info"}
    dataset = load_prompt_dataset(
        write_rows(tmp_path / "valid.parquet", [row]), tokenizer, max_prompt_tokens=64
    )
    assert dataset[0].source_split == "valid" and dataset[0].extra_info == {}


def test_prompt_and_data_source_columns_are_read_from_the_configured_keys(tmp_path, tokenizer):
    row = _row("1+1")
    renamed = {k: v for k, v in row.items() if k not in ("prompt", "data_source")}
    renamed |= {"question": row["prompt"], "task": "arithmetic"}
    path = write_rows(tmp_path / "renamed.parquet", [renamed])
    dataset = load_prompt_dataset(
        path, tokenizer, max_prompt_tokens=64, prompt_key="question", data_source_key="task"
    )
    assert dataset[0].messages == row["prompt"] and dataset[0].data_source == "arithmetic"
    with pytest.raises(ValueError, match="no usable prompts"):  # default keys: both columns missing
        load_prompt_dataset(path, tokenizer, max_prompt_tokens=64)


def test_an_overlong_prompt_is_an_error_naming_file_and_row_without_filter_overlong(tmp_path, tokenizer):
    path = write_rows(tmp_path / "mixed.parquet", [_row("1+1"), _row("1+2+3+4+5+6+7+8+9")])
    assert len(load_prompt_dataset(path, tokenizer, max_prompt_tokens=12)) == 1  # dropped, counted
    with pytest.raises(ValueError, match=r"mixed\.parquet row 1: the prompt has \d+ tokens.*filter_overlong"):
        load_prompt_dataset(path, tokenizer, max_prompt_tokens=12, filter_overlong=False)


def test_every_dropped_row_is_counted_with_its_reason_row_and_length(tmp_path, tokenizer):
    """Three quarters over the limit and two off-schema rows: the counts, the start-up line and each
    row's reason are what a user reads (metrics.jsonl, the console, dropped_rows.jsonl)."""
    rows = [_row("1+2" if i % 4 == 0 else "9*9*" * 20, index=i) for i in range(40)]
    rows[5] = {**_row("x"), "prompt": []}  # malformed; it would have been over the limit
    rows[6] = {**_row("x"), "data_source": None}
    path = write_rows(tmp_path / "train.parquet", rows)
    short = len(tokenize_prompt(tokenizer, [{"role": "user", "content": "1+2"}]))
    long = len(tokenize_prompt(tokenizer, [{"role": "user", "content": "9*9*" * 20}]))
    dataset = load_prompt_dataset(path, tokenizer, max_prompt_tokens=short + 1)
    report = dataset.report

    # 10 short rows kept (i % 4 == 0); 28 long ones dropped as too long, rows 5 and 6 as malformed
    assert len(dataset) == 10
    assert dataset.metrics() == {
        "data/prompts_dropped": 30.0,
        "data/prompts_kept": 10.0,
        "data/longest_prompt_tokens": float(long),
        "data/prompts_dropped/too_long": 28.0,
        "data/prompts_dropped/malformed": 2.0,
        "data/prompts_unsampled": 0.0,
    }
    assert report.start_line() == (
        f"dropped 30 of 40 prompts: 28 over data.max_prompt_tokens={short + 1} (longest {long} tokens); "
        "2 malformed (prompt has no messages: 1, data_source is missing (null): 1)"
    )
    by_row = {dropped.row: dropped for dropped in report.dropped}
    assert sorted(by_row) == [i for i in range(40) if i % 4 != 0]
    assert by_row[1].record("train") == {
        "split": "train",
        "file": str(path),
        "row": 1,
        "reason": "too_long",
        "detail": f"{long} prompt tokens > max_prompt_tokens={short + 1}",
        "data_source": "arithmetic",
        "prompt_tokens": long,
    }
    assert (by_row[5].reason, by_row[5].detail, by_row[5].data_source) == (
        "malformed", "prompt has no messages", "arithmetic"
    )  # fmt: skip
    assert (by_row[6].reason, by_row[6].data_source, by_row[6].prompt_tokens) == ("malformed", None, None)


def test_the_start_line_of_a_dataset_that_lost_only_long_prompts_reads_as_one_phrase(tmp_path, tokenizer):
    rows = [_row("1+2" if i % 4 == 0 else "9*9*" * 20, index=i) for i in range(2000)]
    short = len(tokenize_prompt(tokenizer, [{"role": "user", "content": "1+2"}]))
    long = len(tokenize_prompt(tokenizer, [{"role": "user", "content": "9*9*" * 20}]))
    report = load_prompt_dataset(
        write_rows(tmp_path / "t.parquet", rows), tokenizer, max_prompt_tokens=short
    ).report
    assert report.start_line() == (
        f"dropped 1,500 of 2,000 prompts over data.max_prompt_tokens={short} (longest {long} tokens)"
    )
    kept = load_prompt_dataset(
        write_rows(tmp_path / "k.parquet", rows[::4]), tokenizer, max_prompt_tokens=short
    )
    assert kept.report.start_line() == (
        f"kept all 500 prompts (longest {short} tokens, data.max_prompt_tokens={short})"
    )
    assert kept.metrics()["data/prompts_dropped"] == 0.0 and kept.report.dropped == []
