"""Layer 6, RL math: shape checks for the batch fields that advantage estimators read.

Every estimator calls these at its entry, so a wrong shape fails with the argument's name instead
of a broadcasting error (or, worse, a silent broadcast) deep inside the math.
"""

from __future__ import annotations

from torch import Tensor

from stratarl.algo.groups import check_group


def check_token_fields(**fields: Tensor | None) -> tuple[int, int]:
    """Raise ValueError unless every given field is a 2-D tensor of one shape [N, T]; return (N, T).

    Fields passed as None (optional inputs that are absent) are skipped.
    """
    present = {name: value for name, value in fields.items() if value is not None}
    first_name, first = next(iter(present.items()))
    for name, value in present.items():
        if not isinstance(value, Tensor) or value.dim() != 2:
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"{name} must be a [N, T] tensor, got {shape}")
        if value.shape != first.shape:
            raise ValueError(
                f"{name} has shape {tuple(value.shape)} but {first_name} has {tuple(first.shape)}; "
                "per-token fields must share one [N, T] shape"
            )
    return first.shape[0], first.shape[1]


def check_row_field(name: str, value: Tensor, num_rows: int) -> None:
    """Raise ValueError unless `value` is a [N] tensor (one number per trajectory)."""
    if not isinstance(value, Tensor) or value.dim() != 1 or value.shape[0] != num_rows:
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(f"{name} must be a [N={num_rows}] tensor, got {shape}")


def check_grouped_outcome(token_level_rewards: Tensor, response_mask: Tensor, group: Tensor) -> None:
    """The inputs of every outcome estimator that compares a trajectory with its group."""
    num_rows, _ = check_token_fields(token_level_rewards=token_level_rewards, response_mask=response_mask)
    check_group(group, num_rows)
