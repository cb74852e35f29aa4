"""Agent SFT: a multi-turn demonstration trains the assistant turns only, the tool result is read but
masked out of the loss, in the exact token layout of a rollout."""

from types import SimpleNamespace

import pytest
import torch

from stratarl.data.prompt_dataset import load_prompt_dataset
from stratarl.data.schema import read_rows, write_rows
from stratarl.data.tasks.tool_arithmetic import make_tool_dataset, tool_call_text
from stratarl.data.tokenizer_factory import corpus_from_parquet, train_tokenizer
from stratarl.trainer.agent_sft import agent_sft_batch
from stratarl.trainer.sft import sft_loss


@pytest.fixture(scope="module")
def tool_data(tmp_path_factory):
    paths = make_tool_dataset(
        tmp_path_factory.mktemp("tool"), n_train=12, n_test=2, digits=(3, 3), tool_fraction=0.5, seed=3
    )
    tokenizer = train_tokenizer(corpus_from_parquet([paths["train"]]), vocab_size=400)
    dataset = load_prompt_dataset(paths["train"], tokenizer, max_prompt_tokens=128)
    return paths, tokenizer, dataset


def spans(tokenizer, ids, mask, value):
    return tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == value])


def test_tool_result_is_in_context_but_out_of_the_loss(tool_data):
    _, tokenizer, dataset = tool_data
    rows = list(range(len(dataset)))
    batch = agent_sft_batch(dataset, rows, tokenizer)
    T = batch["responses"].shape[1]
    seen_tool = seen_direct = False
    for i in rows:
        info = dataset[i].extra_info
        expression = info["expression"]
        a, b = (int(x) for x in expression.split("*"))
        value = a * b
        n = int(batch["attention_mask"][i, -T:].sum())  # real response tokens
        ids, mask = batch["responses"][i, :n].tolist(), batch["response_mask"][i, :n].tolist()
        assert batch["response_mask"][i, n:].sum() == 0  # padding is never trained
        if info["uses_tool"]:
            seen_tool = True
            # trained: the call and the answer, each closed with EOS, nothing else
            assert (
                spans(tokenizer, ids, mask, 1)
                == f"{tool_call_text(expression)}<|im_end|>Answer: {value}<|im_end|>"
            )
            # read, not trained: the template's bridge, the tool turn with the result, the next header
            assert (
                spans(tokenizer, ids, mask, 0)
                == f"\n<|im_start|>tool\n{value}<|im_end|>\n<|im_start|>assistant\n"
            )
            first_zero, last_zero = mask.index(0), n - 1 - mask[::-1].index(0)
            assert set(mask[first_zero : last_zero + 1]) == {0}  # one contiguous observation span
        else:
            seen_direct = True
            assert set(mask) == {1}
            assert spans(tokenizer, ids, mask, 1) == f"Answer: {value}<|im_end|>"
        prompt = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()[:-n]
        assert prompt == list(dataset[i].prompt_ids)
    assert seen_tool and seen_direct


def test_loss_ignores_the_tool_result_tokens(tool_data):
    _, tokenizer, dataset = tool_data
    batch = agent_sft_batch(dataset, list(range(len(dataset))), tokenizer)
    log_prob = -torch.rand(batch["responses"].shape)  # per-token log-probs as a model returns them [N, T]
    totals = SimpleNamespace(num_tokens=int(batch["response_mask"].sum()))
    loss, _ = sft_loss(batch, SimpleNamespace(log_prob=log_prob), totals)
    changed = log_prob.clone()
    changed[batch["response_mask"] == 0] = -100.0  # whatever the model says about the tool result
    loss_changed, _ = sft_loss(batch, SimpleNamespace(log_prob=changed), totals)
    assert loss_changed == pytest.approx(loss.item())
    mask = batch["response_mask"].float()
    assert loss.item() == pytest.approx((-(log_prob * mask).sum() / mask.sum()).item(), rel=1e-6)


def test_a_row_without_answer_messages_falls_back_to_the_answer_text(tool_data, tmp_path):
    paths, tokenizer, _ = tool_data
    rows = read_rows(paths["train"])[:2]
    for row in rows:
        row["extra_info"] = {k: v for k, v in row["extra_info"].items() if k != "answer_messages"}
        row["extra_info"]["answer"] = "Answer: 7"
    write_rows(tmp_path / "plain.parquet", rows)
    dataset = load_prompt_dataset(tmp_path / "plain.parquet", tokenizer, max_prompt_tokens=128)
    batch = agent_sft_batch(dataset, [0, 1], tokenizer)
    n = int(batch["response_mask"][0].sum())
    assert tokenizer.decode(batch["responses"][0, :n].tolist()) == "Answer: 7<|im_end|>"


def test_a_demonstration_that_ends_with_a_tool_message_is_rejected_naming_the_row(tool_data, tmp_path):
    paths, tokenizer, _ = tool_data
    rows = read_rows(paths["train"])[:1]
    rows[0]["extra_info"]["answer_messages"] = [
        {"role": "assistant", "content": "x"},
        {"role": "tool", "content": "1"},
    ]
    write_rows(tmp_path / "bad.parquet", rows)
    dataset = load_prompt_dataset(tmp_path / "bad.parquet", tokenizer, max_prompt_tokens=128)
    with pytest.raises(ValueError, match=r"bad\.parquet row 0: .*end with an assistant"):
        agent_sft_batch(dataset, [0], tokenizer)
