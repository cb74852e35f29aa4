"""The AdamW kernels of `build_optimizer`: each name sets torch's flags, loop and foreach give the same
bits, fused the same update within rounding, and an unknown name is refused with the valid ones."""

import pytest
import torch

from stratarl.engine.optim import ADAMW_IMPLS, build_optimizer
from tests.engine.tiny_batches import tiny_model

STEPS = 6


def parameters_after_steps(adamw_impl: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(start, end) of a tiny model's parameters over STEPS AdamW steps with weight decay, the same
    seeded gradients whatever the kernel."""
    model = tiny_model()
    params = list(model.parameters())
    start = [p.detach().clone() for p in params]
    optimizer = build_optimizer(params, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), adamw_impl=adamw_impl)
    g = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()
    return start, [p.detach().clone() for p in params]


@pytest.mark.parametrize(
    ("adamw_impl", "foreach", "fused"),
    [("loop", False, False), ("foreach", True, False), ("fused", False, True)],
)
def test_each_name_sets_torchs_kernel_flags(adamw_impl, foreach, fused):
    optimizer = build_optimizer(tiny_model().parameters(), lr=1e-3, adamw_impl=adamw_impl)
    assert (optimizer.defaults["foreach"], optimizer.defaults["fused"]) == (foreach, fused)


def test_the_default_leaves_torch_to_choose_which_is_the_loop_on_cpu():
    optimizer = build_optimizer(tiny_model().parameters(), lr=1e-3)
    assert (optimizer.defaults["foreach"], optimizer.defaults["fused"]) == (None, None)
    _, auto = parameters_after_steps("auto")
    _, loop = parameters_after_steps("loop")
    assert all(torch.equal(a, b) for a, b in zip(auto, loop, strict=True))


def test_loop_and_foreach_give_the_same_bits():
    start, loop = parameters_after_steps("loop")
    _, foreach = parameters_after_steps("foreach")
    assert any(not torch.equal(a, b) for a, b in zip(start, loop, strict=True))  # the steps moved them
    assert all(torch.equal(a, b) for a, b in zip(loop, foreach, strict=True))


def test_fused_agrees_with_loop_within_rounding():
    start, loop = parameters_after_steps("loop")
    _, fused = parameters_after_steps("fused")
    for s, a, b in zip(start, loop, fused, strict=True):
        # lr 1e-2 for 6 steps moves each weight by up to ~6e-2, far above the tolerance
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
        assert (a - s).abs().max() > 1e-3


def test_an_unknown_kernel_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match="'apex'") as err:
        build_optimizer(tiny_model().parameters(), lr=1e-3, adamw_impl="apex")
    assert all(repr(name) in str(err.value) for name in ADAMW_IMPLS)
