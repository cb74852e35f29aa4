"""A Ray rank's CUDA device: the local index of the GPU Ray assigned it, read from CUDA_VISIBLE_DEVICES."""

import pytest

from stratarl.cluster.rank_process import cuda_device_index


@pytest.mark.parametrize(
    ("gpu_ids", "visible", "index"),
    [
        ([], None, None),  # no GPU assigned: the rank stays on the CPU
        (["3"], "3", 0),  # Ray narrowed the variable to this rank's GPU: it is cuda:0 here
        ([5], "4,5", 1),  # two GPUs in the variable (a bundle of 2): the first assigned one
        (["2"], None, 2),  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: every GPU visible, id = index
        (["1"], "0,1,2,3", 1),
    ],
)
def test_the_assigned_gpu_becomes_the_local_cuda_index(gpu_ids, visible, index):
    assert cuda_device_index(gpu_ids, visible) == index
