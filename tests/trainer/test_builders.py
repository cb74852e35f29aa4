"""Builders: data.max_*_prompts keeps every prompt at -1 and a seeded subsample below the total."""

from transformers import AutoTokenizer

from stratarl.trainer.builders import load_prompts


def test_max_prompts_minus_one_keeps_all_and_a_limit_subsamples_with_a_seed(task):
    tokenizer = AutoTokenizer.from_pretrained(task["model"])
    files = [str(task["train"])]

    def rows(limit, seed=0):
        dataset = load_prompts(files, tokenizer, max_prompt_tokens=64, limit=limit, seed=seed)
        return [item.source_row for item in dataset.items]

    everything = rows(None)
    assert len(everything) == 64
    assert rows(-1) == everything  # -1 once dropped the last prompt (items[:-1])
    ten = rows(10)
    assert len(ten) == 10 and ten == sorted(ten) and set(ten) <= set(everything)
    assert rows(10) == ten and rows(10, seed=1) != ten
    assert rows(64) == everything and rows(0) == []
