"""Layer 5, data: a byte-level BPE tokenizer trained locally on a task's text, with a ChatML template.

Digits are split into one token each before BPE (as Qwen2 and Llama-3 do): a number's tokens are
then its digits, so "68" and "168" share the tokens of their digits and a tiny model can learn
column arithmetic. Without the split, BPE merges frequent numbers into opaque tokens and the same
digit gets a different token depending on its neighbours. Byte-level coverage means any text
encodes, even text the tokenizer never saw.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from stratarl.data.schema import check_row, read_rows

ENDOFTEXT, IM_START, IM_END, PAD = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, PAD)  # ids 0..3, in this order

# ChatML as Qwen2 writes it, without a default system prompt. A response ends with <|im_end|> (EOS);
# the newline after it belongs to the template, not to what the model generates.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_ROLE_HEADERS = ("system\n", "user\n", "assistant\n")


def train_tokenizer(corpus_texts: Iterable[str], *, vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `corpus_texts` and wrap it as a HF fast tokenizer.

    `vocab_size` is an upper bound: a narrow corpus (one task) runs out of merges earlier.
    EOS is <|im_end|>, pad is <|pad|>, there is no BOS; padding_side="left" is passed to the
    constructor because transformers 5.x does not save it when set afterwards.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size must cover the 256 bytes and {len(SPECIAL_TOKENS)} specials, got {vocab_size}"
        )
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_with_role_headers(corpus_texts), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[ENDOFTEXT, IM_START],
        chat_template=CHATML_TEMPLATE,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def _with_role_headers(texts: Iterable[str]) -> Iterator[str]:
    """The corpus, plus the role lines the chat template writes, so "assistant\\n" merges too."""
    for text in texts:
        yield text
        yield from _ROLE_HEADERS


def corpus_from_parquet(paths: Sequence[str | Path]) -> list[str]:
    """Texts to train a tokenizer on: every message content, plus extra_info["answer"] (the
    reference response, verl's SFT convention) when a row has one. Malformed rows are skipped."""
    texts: list[str] = []
    for path in paths:
        for row in read_rows(path):
            try:
                verl_row = check_row(row)
            except ValueError:
                continue
            texts.extend(message["content"] for message in verl_row.messages)
            answer = verl_row.extra_info.get("answer")
            if isinstance(answer, str):
                texts.append(answer)
    return texts
