"""The verl 0.9.1 distillation objects the distillation parity tests call, and verl's packed layout.

verl's loss module imports `verl.utils.dataset.dataset_utils` (an enum), and that package's
`__init__` pulls in its data pipeline (HF `datasets`), which the project does not install. When
`datasets` is absent the package is registered with its path but without running its `__init__`,
so the submodule loads; every verl function the tests call runs unchanged.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor


def load_verl_distillation(verl_namespace: SimpleNamespace) -> SimpleNamespace:
    import verl

    _dataset_package_without_its_init(Path(verl.__file__).parent)
    import verl.trainer.distillation.fsdp.losses as fsdp_losses
    import verl.trainer.distillation.losses as losses
    import verl.utils.tensordict_utils as tensordict_utils
    from verl.workers.config import DistillationConfig, DistillationLossConfig

    return SimpleNamespace(
        losses=losses,
        fsdp_losses=fsdp_losses,
        tu=tensordict_utils,
        DistillationConfig=DistillationConfig,
        DistillationLossConfig=DistillationLossConfig,
        **vars(verl_namespace),
    )


def _dataset_package_without_its_init(verl_root: Path) -> None:
    name = "verl.utils.dataset"
    if name in sys.modules or importlib.util.find_spec("datasets") is not None:
        return
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(verl_root / "utils" / "dataset")]
    sys.modules[name] = importlib.util.module_from_spec(spec)


def packed(per_token: Tensor, prompt_lengths: list[int], fill: float = 7.0) -> Tensor:
    """verl's no-padding model output: rows of p_i + T tokens one after another, the response's
    values at positions p_i − 1 … p_i + T − 2 of each row (outputs are shifted by one token), `fill`
    on the other positions (what verl must skip). [N, T, ...] -> [Σ (p_i + T), ...]."""
    rows = []
    for row, p in zip(per_token, prompt_lengths, strict=True):
        t = row.shape[0]
        seq = torch.full((p + t, *row.shape[1:]), fill, dtype=row.dtype)
        seq[p - 1 : p - 1 + t] = row
        rows.append(seq)
    return torch.cat(rows)


def per_row(flat: Tensor, lengths: list[int]) -> Tensor:
    """[Σ L_i, ...] as a jagged nested tensor of N rows (verl's per-row teacher columns)."""
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    return torch.nested.nested_tensor_from_jagged(flat, offsets)


def padded_inputs(prompt_lengths: list[int], response_length: int) -> dict[str, Tensor]:
    """prompts [N, P] (left-padded), responses [N, T] and attention_mask [N, P + T] of rows whose
    responses fill all T columns: what `no_padding_2_padding` reads to find each response."""
    n, width = len(prompt_lengths), max(prompt_lengths)
    prompt_mask = torch.arange(width)[None, :] >= (width - torch.tensor(prompt_lengths))[:, None]
    attention = torch.cat([prompt_mask.long(), torch.ones(n, response_length, dtype=torch.long)], dim=1)
    return {
        "prompts": torch.ones(n, width, dtype=torch.long),
        "responses": torch.ones(n, response_length, dtype=torch.long),
        "attention_mask": attention,
    }
