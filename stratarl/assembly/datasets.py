"""Assembly: the run's tokenizer and prompt datasets from `model.*` and `data.*`, and the seeding.

What the config names is loaded here, once, into plain objects (a tokenizer, a `PromptDataset`) the
trainer and the phases are handed; nothing below this package reads the config.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from stratarl.config import RunConfig
from stratarl.data import tokenizer_loading
from stratarl.data.collate import collate_prompts
from stratarl.data.prompt_dataset import PromptDataset, load_prompt_dataset
from stratarl.transport.data_proto import DataProto


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's and torch's global generators (a run's first act)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_tokenizer(cfg: RunConfig) -> Any:
    """The policy's tokenizer, with a pad token (`data.tokenizer_loading`)."""
    return tokenizer_loading.load_tokenizer(
        cfg.model.tokenizer_path or cfg.model.path, trust_remote_code=cfg.model.trust_remote_code
    )


def eos_token_ids(tokenizer: Any) -> list[int]:
    ids = tokenizer.eos_token_id
    return [ids] if isinstance(ids, int) else list(ids)


def data_columns(cfg: RunConfig) -> dict[str, Any]:
    """How rows are read (data.prompt_key, data.data_source_key, data.filter_overlong), as the keyword
    arguments of `load_prompts`."""
    d = cfg.data
    return {
        "prompt_key": d.prompt_key,
        "data_source_key": d.data_source_key,
        "filter_overlong": d.filter_overlong,
    }


def load_prompts(
    files: list[str],
    tokenizer: Any,
    *,
    max_prompt_tokens: int,
    limit: int | None,
    seed: int = 0,
    **columns: Any,
) -> PromptDataset:
    """The prompts of `files`; with 0 ≤ limit < their number, a seeded subsample of `limit` of them in
    file order (data.max_*_prompts; a negative limit or None keeps all). `columns`: `data_columns`."""
    dataset = load_prompt_dataset(files, tokenizer, max_prompt_tokens=max_prompt_tokens, **columns)
    if limit is not None and 0 <= limit < len(dataset):
        keep = np.sort(np.random.default_rng(seed).choice(len(dataset), size=limit, replace=False))
        dataset = PromptDataset([dataset.items[i] for i in keep], dataset.report)
    return dataset


def prompts_batch(dataset: PromptDataset, indices: list[int], pad_token_id: int) -> DataProto:
    """B dataset rows as a DataProto of their non-tensor columns (prompt ids, sources, answers)."""
    batch = collate_prompts([dataset[i] for i in indices], pad_token_id=pad_token_id)
    return DataProto.from_dict(non_tensors=batch.non_tensors)
