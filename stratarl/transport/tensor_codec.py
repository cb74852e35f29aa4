"""Layer 4, data transport: how a torch tensor becomes a numpy buffer and back, without copies.

Pickle protocol 5 and Ray's object store move numpy arrays as raw out-of-band buffers (zero-copy),
whereas a torch tensor is pickled through `torch.save` into one opaque byte string. Every tensor
that leaves a process therefore travels as `(array, dtype_name)`: a numpy view of its memory and
the torch dtype to restore. Dtypes numpy lacks (bfloat16, float8) travel as integers of the same
width and are viewed back on arrival.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

# numpy integer dtype with the same element width, for torch dtypes numpy cannot represent.
_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> "float32"; the inverse of `torch_dtype`."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """ "float32" -> `torch.float32`; raises ValueError for a name torch does not know."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype name {name!r}")
    return dtype


def tensor_to_array(tensor: Tensor) -> tuple[np.ndarray, str]:
    """A numpy view of a CPU tensor's memory (a copy only for GPU or autograd tensors) and its dtype name."""
    cpu = tensor.detach().cpu()
    try:
        array = cpu.numpy()
    except TypeError:  # bfloat16 / float8: reinterpret the bits as an integer of the same width
        array = cpu.view(_SAME_WIDTH_INT[cpu.element_size()]).numpy()
    return array, dtype_name(tensor.dtype)


def array_to_tensor(array: np.ndarray, name: str) -> Tensor:
    """The tensor `tensor_to_array` encoded. Shares memory with `array` when the array is writable.

    Arrays Ray hands out are read-only views of its object store; those are copied once, because a
    tensor that someone later edits in place must not write into shared, immutable memory.
    """
    if not array.flags.writeable or any(stride < 0 for stride in array.strides):
        array = array.copy()
    tensor = torch.from_numpy(array)
    dtype = torch_dtype(name)
    return tensor if tensor.dtype == dtype else tensor.view(dtype)
