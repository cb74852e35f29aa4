"""Where the training engine puts things: a module computes where its parameters are, and micro-batch
inputs (the packed rows' attention keywords too) go to the device they are asked for — checked on the
meta device, through the functions the CUDA path uses."""

import dataclasses

import torch

from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.micro_batches import model_inputs
from tests.engine.tiny_batches import ragged_batch, tiny_model


def test_a_module_computes_where_its_parameters_are():
    module = tiny_model().to("meta")
    assert DataParallel().compute_device(module) == torch.device("meta")
    assert DataParallel().compute_device(tiny_model()) == torch.device("cpu")


def test_micro_batch_inputs_go_to_the_model_device_attention_keywords_included():
    batch = ragged_batch(n=4)
    for layout in ("packed", "padded"):
        inputs = model_inputs(batch, [0, 2, 3], layout, torch.device("meta"))
        tensors = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
        tensors |= {f"attention_kwargs.{k}": v for k, v in inputs.attention_kwargs.items()}
        placed = {name: t.device.type for name, t in tensors.items() if isinstance(t, torch.Tensor)}
        assert placed and set(placed.values()) == {"meta"}, placed
        assert model_inputs(batch, [0, 2, 3], layout).input_ids.device.type == "cpu"  # None: where it is
