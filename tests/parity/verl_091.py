"""What the parity tests share: the installed verl 0.9.1 (imported lazily, so the default test run never
imports it), its real config objects, seeded batches with awkward masks, and the comparison that
records the largest deviation seen per family (printed by conftest.py at the end of the run).
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

VERL_VERSION = "0.9.1"
RTOL = 1e-5  # the agreement required, relative to verl's value
ATOL = 1e-8  # numpy's default: below it, values count as equal

# family -> [max |ours − verl|, max |ours − verl| / |verl| over entries with |verl| ≥ 1e-3, count]
DEVIATIONS: dict[str, list[float]] = {}

# Group sizes of the default batch (N = 16): groups of one, a pair, and two large groups whose rows
# interleave (uids_for); row 1 (in the group of three) is fully masked.
GROUP_SIZES = (1, 3, 2, 1, 4, 5)
# The same without groups of one, for estimators that need two samples per group (grpo_passk).
GROUP_SIZES_NO_SINGLETON = (2, 3, 2, 4, 5)
RESPONSE_LENGTH = 12  # T
# How a (micro-)batch is normalised, by verl's names; its ppo_loss puts them in config.global_batch_info
# and its critic passes them to compute_value_loss. The local batches have 14-16 rows of T = 12.
NORMALIZERS = {
    "local": {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None, "loss_scale_factor": None},
    "dp4_global_counts": {
        "dp_size": 4,
        "batch_num_tokens": 450,
        "global_batch_size": 64,
        "loss_scale_factor": None,
    },
    "dp2_tensor_counts_scale": {
        "dp_size": 2,
        "batch_num_tokens": torch.tensor(230),
        "global_batch_size": torch.tensor(31),
        "loss_scale_factor": 20,
    },
}


def load_verl() -> SimpleNamespace:
    """The verl objects the tests call; skips when verl is not installed or is not 0.9.1."""
    verl = pytest.importorskip("verl")
    if verl.__version__ != VERL_VERSION:
        pytest.skip(f"parity tests need verl=={VERL_VERSION}, found {verl.__version__}")
    import verl.trainer.ppo.core_algos as core_algos
    import verl.trainer.ppo.metric_utils as metric_utils
    import verl.trainer.ppo.rollout_corr_helper as rollout_corr_helper
    import verl.utils.torch_functional as torch_functional
    from verl.protocol import DataProto
    from verl.trainer.config import AlgoConfig, KLControlConfig, RolloutCorrectionConfig
    from verl.workers.config import ActorConfig, PolicyLossConfig

    namespace = SimpleNamespace(
        core_algos=core_algos,
        metric_utils=metric_utils,
        rollout_corr_helper=rollout_corr_helper,
        F=torch_functional,
        DataProto=DataProto,
        AlgoConfig=AlgoConfig,
        KLControlConfig=KLControlConfig,
        RolloutCorrectionConfig=RolloutCorrectionConfig,
        ActorConfig=ActorConfig,
        PolicyLossConfig=PolicyLossConfig,
    )
    namespace.ray_trainer = _ray_trainer_functions(verl, namespace)
    return namespace


def _ray_trainer_functions(verl: Any, ns: SimpleNamespace) -> SimpleNamespace:
    """verl's `apply_kl_penalty` and `compute_advantage`, compiled from the installed ray_trainer.py.

    Importing that module pulls in its data pipeline (torchdata, datasets), which the project does not
    need. The two functions use none of it: they are compiled from the installed file's own source, in
    a namespace that holds the verl objects the module imports for them. verl's code runs unchanged.
    """
    path = Path(verl.__file__).parent / "trainer" / "ppo" / "ray_trainer.py"
    wanted = {"apply_kl_penalty", "compute_advantage", "compute_response_mask"}
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in wanted]
    assert {node.name for node in nodes} == wanted, "ray_trainer.py no longer defines the expected functions"
    scope: dict[str, Any] = {
        "torch": torch,
        "np": np,
        "Optional": typing.Optional,
        "DataProto": ns.DataProto,
        "AlgoConfig": ns.AlgoConfig,
        "core_algos": ns.core_algos,
        "AdvantageEstimator": ns.core_algos.AdvantageEstimator,
        "masked_mean": ns.F.masked_mean,
    }
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), scope)
    return SimpleNamespace(**{name: scope[name] for name in wanted})


def actor_config(verl: SimpleNamespace, **overrides: Any) -> Any:
    """A real verl `ActorConfig` (the fields every loss reads), with the given overrides."""
    policy_loss = overrides.pop("policy_loss", {})
    fields = {"strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": 1, **overrides}
    return verl.ActorConfig(policy_loss=verl.PolicyLossConfig(**policy_loss), **fields)


# ---------------------------------------------------------------------------------------------- inputs


def uids_for(group_sizes: tuple[int, ...]) -> list[str]:
    """One uid per row, rows of a group adjacent except that the last two groups interleave."""
    uids = [f"prompt-{g}" for g, size in enumerate(group_sizes) for _ in range(size)]
    tail = len(group_sizes) - 2
    head = [u for u in uids if u not in (f"prompt-{tail}", f"prompt-{tail + 1}")]
    a = [u for u in uids if u == f"prompt-{tail}"]
    b = [u for u in uids if u == f"prompt-{tail + 1}"]
    mixed = [u for pair in zip(a, b, strict=False) for u in pair] + a[len(b) :] + b[len(a) :]
    return head + mixed


def response_mask(gen: torch.Generator, num_rows: int, length: int = RESPONSE_LENGTH) -> Tensor:
    """[N, T] float mask: right padding of random lengths, multi-turn gaps (observation tokens inside a
    response) in every third row, row 1 fully masked, and one row that fills every column."""
    lengths = torch.randint(2, length + 1, (num_rows,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    for row in range(0, num_rows, 3):
        if lengths[row] >= 6:
            start = int(torch.randint(1, int(lengths[row]) - 3, (1,), generator=gen))
            mask[row, start : start + 2] = 0.0
    mask[1] = 0.0
    mask[-1] = 1.0
    return mask


def log_probs(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """Log-probabilities in (−4, 0)."""
    return (-4.0 * torch.rand(shape, generator=gen) - 1e-3).to(dtype)


def nearby_log_probs(gen: torch.Generator, base: Tensor, scale: float) -> Tensor:
    """base + Gaussian noise of std `scale`, kept ≤ 0 (so that exp() is a probability)."""
    noise = scale * torch.randn(base.shape, generator=gen).to(base.dtype)
    return (base + noise).clamp(max=-1e-3)


def with_extreme_ratios(log_prob: Tensor, old_log_prob: Tensor) -> tuple[Tensor, Tensor]:
    """Copies where three valid tokens have log π − log π_old = +25, +22 and −25: the ±20 clamps bind,
    and asymmetrically, so that a different bound would change the ppo_kl metric."""
    log_prob, old_log_prob = log_prob.clone(), old_log_prob.clone()
    old_log_prob[0, 0] = log_prob[0, 0] - 25.0
    old_log_prob[-1, 2] = log_prob[-1, 2] - 22.0
    log_prob[-1, 1] = old_log_prob[-1, 1] - 25.0
    return log_prob, old_log_prob


# ------------------------------------------------------------------------------------------ comparison


def _as_float64(value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value.detach().to(torch.float64)
    return torch.as_tensor(np.asarray(value, dtype=np.float64))


def check(
    family: str, ours: Any, theirs: Any, *, rtol: float = RTOL, atol: float = ATOL, what: str = ""
) -> None:
    """Assert |ours − verl| ≤ atol + rtol·|verl| elementwise (NaN only where verl has NaN) and record the
    deviation under `family`. Dicts are compared key by key, and must have the same keys."""
    if isinstance(theirs, dict):
        assert set(ours) == set(theirs), f"{family} {what}: keys differ: {sorted(set(ours) ^ set(theirs))}"
        for key in theirs:
            check(family, ours[key], theirs[key], rtol=rtol, atol=atol, what=f"{what}[{key}]")
        return
    if theirs is None or ours is None:
        assert ours is None and theirs is None, f"{family} {what}: one side is None"
        return
    a, b = _as_float64(ours), _as_float64(theirs)
    assert a.shape == b.shape, f"{family} {what}: shape {tuple(a.shape)} != verl {tuple(b.shape)}"
    if a.numel() == 0:
        return
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    assert torch.equal(nan_a, nan_b), f"{family} {what}: NaN positions differ"
    inf_b = torch.isinf(b)
    same_inf = torch.equal(torch.isinf(a), inf_b) and torch.equal(a[inf_b], b[inf_b])
    assert same_inf, f"{family} {what}: infinities differ"
    a, b = torch.where(nan_b | inf_b, 0.0, a), torch.where(nan_b | inf_b, 0.0, b)
    diff = (a - b).abs()
    big = b.abs() >= 1e-3
    rel = (diff[big] / b.abs()[big]).max().item() if big.any() else 0.0
    record = DEVIATIONS.setdefault(family, [0.0, 0.0, 0])
    record[0], record[1], record[2] = max(record[0], diff.max().item()), max(record[1], rel), record[2] + 1
    bad = diff > atol + rtol * b.abs()
    assert not bad.any(), (
        f"{family} {what}: {int(bad.sum())} of {b.numel()} values differ; max |Δ| {diff.max().item():.3e}; "
        f"ours {a[bad][:4].tolist()} verl {b[bad][:4].tolist()}"
    )


def normwise(theirs: Tensor) -> float:
    """An absolute tolerance of RTOL × the largest |verl| value of the tensor.

    For float32 results that come out of cancellation (an advantage R − b, the centred logits of an
    entropy gradient), any change of summation order moves a value near zero by a few ulp of the
    tensor's scale, so only a tolerance relative to that scale means anything. Used only where a test
    says why; everything else is compared element by element.
    """
    return RTOL * _as_float64(theirs).abs().max().item()


def deviation_table() -> list[str]:
    """Lines of the per-family table printed after a parity run."""
    lines = [f"{'family':42s} {'max |Δ|':>10s} {'max rel':>10s} {'checks':>7s}"]
    for family, (dev_abs, dev_rel, count) in sorted(DEVIATIONS.items()):
        lines.append(f"{family:42s} {dev_abs:10.2e} {dev_rel:10.2e} {int(count):7d}")
    return lines
