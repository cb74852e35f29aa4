"""The AdamW we build: fused on CPU, and its steps equal torch's per-parameter reference loop."""

import torch

from stratarl.engine.optim import build_optimizer


def twin_layers(seed=0):
    torch.manual_seed(seed)
    layer = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    twin.load_state_dict(layer.state_dict())
    return layer, twin


def test_cpu_adamw_is_fused_and_steps_like_the_per_parameter_loop():
    layer, twin = twin_layers()
    ours = build_optimizer(layer.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95))
    reference = torch.optim.AdamW(
        twin.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95), eps=1e-8, foreach=False
    )
    assert ours.defaults["fused"] is True
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        for model, opt in ((layer, ours), (twin, reference)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    moved = [
        (a - b).abs().max() for a, b in zip(layer.parameters(), twin_layers()[0].parameters(), strict=True)
    ]
    assert min(moved) > 1e-3  # three steps of lr 1e-2 moved every tensor
    for a, b in zip(layer.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_frozen_parameters_are_left_out():
    layer, _ = twin_layers()
    layer[0].weight.requires_grad_(False)
    opt = build_optimizer(layer.parameters(), lr=1e-2)
    assert sum(len(g["params"]) for g in opt.param_groups) == 3
