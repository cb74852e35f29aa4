"""tensor_codec: tensors become numpy views without copies and come back with their dtype (bf16, fp8 too)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stratarl.transport.tensor_codec import array_to_tensor, dtype_name, tensor_to_array, torch_dtype


def test_a_cpu_tensor_is_encoded_as_a_view_of_its_memory():
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    array, name = tensor_to_array(tensor)
    assert name == "float32" and array.shape == (2, 3)
    tensor[0, 0] = 42.0
    assert array[0, 0] == 42.0, "no copy was made"
    back = array_to_tensor(array, name)
    assert back.data_ptr() == tensor.data_ptr()


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float16, torch.bool, torch.int32]
)
def test_round_trip_keeps_dtype_and_bits(dtype):
    source = torch.tensor([[0.5, -1.0], [2.0, 0.0]]).to(dtype)
    array, name = tensor_to_array(source)
    assert isinstance(array, np.ndarray) and array.itemsize == source.element_size()
    back = array_to_tensor(array, name)
    assert back.dtype == dtype and torch.equal(back.view(torch.uint8), source.view(torch.uint8))


def test_read_only_and_reversed_arrays_are_copied_once():
    frozen = np.arange(4, dtype=np.int64)
    frozen.setflags(write=False)
    tensor = array_to_tensor(frozen, "int64")
    tensor[0] = 9  # writable, and the frozen buffer is untouched
    assert frozen[0] == 0
    assert array_to_tensor(np.arange(4)[::-1], "int64").tolist() == [3, 2, 1, 0]


def test_dtype_names_round_trip_and_unknown_names_fail():
    assert torch_dtype(dtype_name(torch.bfloat16)) is torch.bfloat16
    with pytest.raises(ValueError, match="unknown torch dtype name 'float33'"):
        torch_dtype("float33")
    with pytest.raises(ValueError, match="unknown torch dtype"):
        torch_dtype("nn")  # an attribute of torch that is not a dtype
