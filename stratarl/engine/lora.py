"""Layer 5, training engine: LoRA adapters through peft, and their weights in sync and export.

LoRA (Hu et al., arXiv:2106.09685) trains a low-rank update of chosen linear layers,
W' = W + s·B·A with A [r, d_in], B [d_out, r] and s = α/r (α/√r with rsLoRA), W frozen. Here:

* `apply_lora` wraps a causal LM with peft (rank, alpha, target modules from config);
* the reference policy is the same model with the adapter disabled (`Reference.base_of`), no copy;
* `merge_lora_state` turns a peft state dict into the plain HF one with W' merged in (first weight
  sync, HF export); `adapter_update` / `apply_adapter_update` carry only A, B and s afterwards,
  and let the receiver rebuild W' from the base weights it already holds.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor, nn

ADAPTER = "default"
_BASE = ".base_layer."
_LORA_A = f".lora_A.{ADAPTER}.weight"
_LORA_B = f".lora_B.{ADAPTER}.weight"


def apply_lora(
    model: nn.Module,
    *,
    rank: int,
    alpha: float,
    target_modules: Sequence[str] | str = "all-linear",
    dropout: float = 0.0,
) -> nn.Module:
    """A peft `PeftModel` with LoRA adapters on `target_modules` (peft names, e.g. ["q_proj", "v_proj"],
    or "all-linear"); only the adapters train. B starts at 0, so the wrapped model equals the base."""
    from peft import LoraConfig, get_peft_model  # imported on use: peft takes seconds to import

    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=targets,
        lora_dropout=dropout,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def is_lora(model: nn.Module) -> bool:
    """Whether `model` is a peft model (peft is not imported for the check: without it, none is)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def lora_scalings(lm: nn.Module) -> dict[str, float]:
    """{module name: s} for every LoRA layer of `lm` (the peft-injected base model), names as in `lm`."""
    from peft.tuners.lora import LoraLayer

    return {name: float(m.scaling[ADAPTER]) for name, m in lm.named_modules() if isinstance(m, LoraLayer)}


@dataclass
class AdapterUpdate:
    """The trainable part of a LoRA policy: per adapted module, A, B and the scale s."""

    lora_a: dict[str, Tensor]  # module name -> A [r, d_in]
    lora_b: dict[str, Tensor]  # module name -> B [d_out, r]
    scaling: dict[str, float]

    @property
    def num_bytes(self) -> int:
        tensors = [*self.lora_a.values(), *self.lora_b.values()]
        return sum(t.numel() * t.element_size() for t in tensors)


def adapter_update(state: dict[str, Tensor], scaling: dict[str, float]) -> AdapterUpdate:
    """The A and B tensors of a peft state dict (names as in the base model)."""
    lora_a = {k[: -len(_LORA_A)]: v for k, v in state.items() if k.endswith(_LORA_A)}
    lora_b = {k[: -len(_LORA_B)]: v for k, v in state.items() if k.endswith(_LORA_B)}
    if set(lora_a) != set(lora_b) or set(lora_a) != set(scaling):
        raise ValueError("LoRA A, B and scaling must cover the same modules")
    return AdapterUpdate(lora_a=lora_a, lora_b=lora_b, scaling=dict(scaling))


def _delta(update: AdapterUpdate, module: str) -> Tensor:
    a, b = update.lora_a[module], update.lora_b[module]
    return (b.float() @ a.float()) * update.scaling[module]  # s·B·A [d_out, d_in]


def merge_lora_state(state: dict[str, Tensor], scaling: dict[str, float]) -> dict[str, Tensor]:
    """A peft-injected state dict -> the plain HF state dict, W' = W + s·B·A (peft's merge)."""
    update = adapter_update(state, scaling)
    merged: dict[str, Tensor] = {}
    for key, tensor in state.items():
        if key.endswith((_LORA_A, _LORA_B)):
            continue
        if _BASE not in key:
            merged[key] = tensor
            continue
        module, param = key.split(_BASE)
        plain = f"{module}.{param}"
        merged[plain] = (
            (tensor.float() + _delta(update, module)).to(tensor.dtype) if param == "weight" else tensor
        )
    return merged


def base_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The frozen base weights of a peft-injected state dict, under plain HF names (no adapter)."""
    return {k.replace(_BASE, "."): v for k, v in state.items() if not k.endswith((_LORA_A, _LORA_B))}


def apply_adapter_update(base: dict[str, Tensor], update: AdapterUpdate) -> dict[str, Tensor]:
    """What a weight receiver holding the base weights does with an update: W' = W + s·B·A for the
    adapted modules, in new tensors (`base` is not modified). Other weights are returned as they are."""
    merged = dict(base)
    for module in update.lora_a:
        key = f"{module}.weight"
        merged[key] = (base[key].float() + _delta(update, module)).to(base[key].dtype)
    return merged


def strip_prefix(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """Keys without `prefix` (the scorer's `lm.`), tensors shared."""
    return {k.removeprefix(prefix): v for k, v in state.items()}
