"""Layer 5, data: load a tokenizer by directory, with a pad token the batches can use.

Many causal-LM tokenizers (Llama, GPT-2, Mistral) ship without a pad token; batching needs one.
Padding is masked out everywhere (attention_mask 0, response_mask 0), so any existing special
token will do: we take EOS, else UNK, and say so in the log. A tokenizer with none of them is an
error naming the directory. A directory that transformers cannot read is an error naming it too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

logger = logging.getLogger(__name__)


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False) -> Any:
    """`AutoTokenizer.from_pretrained(path)` with a pad token (see the module docstring)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise ValueError(f"cannot load the tokenizer in {path}: {type(err).__name__}: {err}") from err
    ensure_pad_token(tokenizer, str(path))
    return tokenizer


def ensure_pad_token(tokenizer: Any, source: str) -> None:
    """Give `tokenizer` a pad token when it has none (EOS, else UNK), and log the choice."""
    if tokenizer.pad_token_id is not None:
        return
    for role in ("eos", "unk"):
        token = getattr(tokenizer, f"{role}_token", None)
        if token is not None:
            tokenizer.pad_token = token
            logger.warning(
                "the tokenizer in %s has no pad token; padding with its %s token %r (id %d): padded "
                "positions are masked out, so the choice does not change training",
                source, role.upper(), token, tokenizer.pad_token_id,
            )  # fmt: skip
            return
    raise ValueError(
        f"the tokenizer in {source} has no pad, EOS or UNK token to pad batches with; add one to its "
        "tokenizer_config.json (pad_token)"
    )
