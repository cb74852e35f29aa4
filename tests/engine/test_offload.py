"""The optimizer half of the colocated hand-off: per-parameter state moves to a device and back with
the bytes counted, `step` stays where torch keeps it (each AdamW kernel), and on a CPU actor
offloading is a no-op."""

import pytest
import torch

from stratarl.engine.actor import Actor, OptimizerSettings
from stratarl.engine.offload import move_optimizer_state, optimizer_state_devices
from stratarl.engine.optim import ADAMW_IMPLS, build_optimizer
from stratarl.engine.requests import UpdateRequest
from tests.engine.tiny_batches import policy_gradient_loss, ragged_batch, tiny_model


def stepped_optimizer(adamw_impl: str = "loop") -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    layer = torch.nn.Linear(4, 3)
    optimizer = build_optimizer(layer.parameters(), lr=1e-2, adamw_impl=adamw_impl)
    layer(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return layer, optimizer


@pytest.mark.parametrize("adamw_impl", ADAMW_IMPLS)
def test_state_moves_with_its_bytes_counted_and_step_stays(adamw_impl):
    _, optimizer = stepped_optimizer(adamw_impl)
    steps = [state["step"] for state in optimizer.state.values()]
    # exp_avg and exp_avg_sq of a 3×4 weight and a 3-bias, fp32: 2·(12 + 3)·4 bytes
    assert move_optimizer_state(optimizer, "meta") == 2 * 15 * 4
    assert optimizer_state_devices(optimizer) == {torch.device("meta")}
    # the very same counters, where torch put them (for fused: the parameter's device, here CPU)
    assert all(state["step"] is step for state, step in zip(optimizer.state.values(), steps, strict=True))
    assert all(step.device.type == "cpu" for step in steps)
    assert move_optimizer_state(optimizer, "meta") == 0  # already there


def test_offloading_a_cpu_actor_moves_nothing_and_trains_the_same():
    batch = ragged_batch(n=4)
    plain, handed = (
        Actor(tiny_model(), optim=OptimizerSettings(lr=1e-2), micro_batch_size=2) for _ in range(2)
    )
    for actor in (plain, handed):
        actor.update(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=4))
    assert handed.offload_optimizer() == 0 and handed.reload_optimizer() == 0
    assert optimizer_state_devices(handed.optimizer) == {torch.device("cpu")}
    for actor in (plain, handed):
        actor.update(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=4))
    for p, q in zip(plain.module.parameters(), handed.module.parameters(), strict=True):
        assert torch.equal(p, q)
