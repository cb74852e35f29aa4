"""Layer 5, training engine: which Hugging Face model a role loads, and loading it.

`ModelSpec` names a local HF directory and how to load it: the dtype of its weights, whether code
shipped inside the directory may run (`trust_remote_code`), and the device its models and batches
live on. The training engine, the rollout engines and the value model all load through it, so a
setting of the spec reaches every place a model is made.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from stratarl.engine.data_parallel import DTYPES
from stratarl.engine.host_memory import HOST_ALLOCATORS

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class ModelSpec:
    """A local HF model directory and how to load it.

    dtype: of the loaded weights ("float32", "bfloat16", "float16").
    trust_remote_code: let transformers (and vLLM) run model code found in the directory.
    device: where models and the batches they read are placed ("cpu" or "cuda", already resolved).
    gradient_checkpointing: recompute activations in a trained model's backward.
    host_allocator: what the process that trains the model does with freed host memory
        (`host_memory.HOST_ALLOCATORS`: keep for reuse, or the system allocator's defaults).
    """

    path: str
    dtype: str = "float32"
    trust_remote_code: bool = False
    device: str = "cpu"
    gradient_checkpointing: bool = False
    host_allocator: str = "keep"

    def __post_init__(self) -> None:
        if self.host_allocator not in HOST_ALLOCATORS:
            valid = list(HOST_ALLOCATORS)
            raise ValueError(f"unknown host_allocator {self.host_allocator!r}; valid: {valid}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; valid: {sorted(DTYPES)}")
        if self.device not in DEVICES:
            raise ValueError(f"unknown device {self.device!r}; valid: {list(DEVICES)} (resolve 'auto' first)")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def load_causal_lm(model: ModelSpec) -> nn.Module:
    """The causal LM of `model.path` in `model.dtype`, on `model.device`."""
    lm = AutoModelForCausalLM.from_pretrained(
        model.path, dtype=model.torch_dtype, trust_remote_code=model.trust_remote_code
    )
    return lm.to(model.device)
