"""Layer 5, rollout: loading new weights into a served model in place, and proving that it happened.

A silent failure to sync (wrong key names, a copy of the model updated instead of the served one,
a dtype cast dropped) leaves the rollout sampling from stale weights while the trainer believes
otherwise. So the key sets are checked strictly, and after the copy every served tensor is compared
with what was sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn


class WeightSyncError(RuntimeError):
    """The weights sent do not fit the served model, or did not land in it."""


@dataclass(frozen=True)
class WeightLoadReport:
    """What one load did: the version now served, tensors sent, tensors whose values changed, and a
    checksum of the served tensors (comparable with `parameter_checksum` of the sender's dict)."""

    version: int
    num_tensors: int
    num_changed: int
    checksum: float


def parameter_checksum(tensors: Mapping[str, Tensor]) -> float:
    """Σ_k Σ_i (x_ki + |x_ki|) in float64: a cheap fingerprint to compare sender and receiver."""
    total = torch.zeros((), dtype=torch.float64)
    for tensor in tensors.values():
        x = tensor.detach().double()
        total += (x.sum() + x.abs().sum()).cpu()
    return float(total)


def _tied_aliases(model: nn.Module) -> dict[str, set[str]]:
    """For each parameter name, the other names of the same tensor (tied embeddings, shared layers)."""
    names_by_tensor: dict[int, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_tensor.setdefault(id(param), set()).add(name)
    return {name: names - {name} for names in names_by_tensor.values() for name in names}


def check_state_dict_keys(model: nn.Module, state_dict: Mapping[str, Tensor]) -> None:
    """Raise `WeightSyncError` naming missing keys, unexpected keys and shape mismatches.

    A key may be omitted when a tied alias of it is sent (e.g. `lm_head.weight` with tied
    embeddings, which safetensors checkpoints store once).
    """
    served = model.state_dict()
    aliases = _tied_aliases(model)
    sent = state_dict.keys()
    missing = sorted(k for k in served if k not in sent and not (aliases.get(k, set()) & sent))
    unexpected = sorted(k for k in state_dict if k not in served)
    wrong_shape = sorted(
        f"{k}: sent {tuple(state_dict[k].shape)}, served {tuple(served[k].shape)}"
        for k in state_dict
        if k in served and state_dict[k].shape != served[k].shape
    )
    found = {"missing keys": missing, "unexpected keys": unexpected, "shapes": wrong_shape}
    problems = [
        f"{label} ({len(items)}): {', '.join(items[:10])}{' …' if len(items) > 10 else ''}"
        for label, items in found.items()
        if items
    ]
    if problems:
        raise WeightSyncError("state_dict does not fit the served model: " + "; ".join(problems))


@torch.no_grad()
def load_in_place(model: nn.Module, state_dict: Mapping[str, Tensor], version: int) -> WeightLoadReport:
    """Copy `state_dict` into the served model's tensors (cast to their dtype/device) and verify.

    Raises `WeightSyncError` if the keys do not fit, or if any served tensor differs from what was
    sent after the copy.
    """
    check_state_dict_keys(model, state_dict)
    served = model.state_dict()
    num_changed = sum(not torch.equal(served[k], _as_served(v, served[k])) for k, v in state_dict.items())
    model.load_state_dict(dict(state_dict), strict=False)
    served = model.state_dict()
    not_landed = sorted(
        k for k, v in state_dict.items() if not torch.equal(served[k], _as_served(v, served[k]))
    )
    if not_landed:
        raise WeightSyncError(
            f"weights for version {version} did not land in the served model: {', '.join(not_landed[:10])}"
        )
    checksum = parameter_checksum({k: served[k] for k in state_dict})
    return WeightLoadReport(
        version=version, num_tensors=len(state_dict), num_changed=num_changed, checksum=checksum
    )


def _as_served(sent: Tensor, served: Tensor) -> Tensor:
    return sent.detach().to(device=served.device, dtype=served.dtype)
