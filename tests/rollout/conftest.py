"""Fixtures for the rollout tests: a shared tiny model and an engine factory."""

from collections.abc import Callable

import pytest
import torch

from stratarl.rollout.torch_engine import TorchRolloutEngine
from tests.rollout.tiny_lm import EOS, PAD, build_tiny_qwen2


@pytest.fixture(scope="module")
def tiny_model() -> torch.nn.Module:
    """Read-only in the tests that use it; tests that load weights build their own."""
    return build_tiny_qwen2(seed=0)


@pytest.fixture
def make_engine() -> Callable[..., TorchRolloutEngine]:
    def make(model: torch.nn.Module, **kwargs) -> TorchRolloutEngine:
        return TorchRolloutEngine(model, **{"eos_token_ids": EOS, "pad_token_id": PAD, "seed": 0, **kwargs})

    return make
