"""Layer 5, training engine: data parallelism over processes with FSDP2, and the reductions it needs.

`DataParallel` says how a role's model is spread: over the ranks of a device mesh with FSDP2
(`torch.distributed.fsdp.fully_shard`, one unit per decoder block plus the root; gloo on CPU, nccl on
GPU), or in one process (mesh None). The model code has no distributed code of its own: sharding is
applied from outside, to the scorer module that is the root of every forward (gpt-fast's rule).
FSDP1 is not offered: it needs an accelerator and crashes gathering state dicts on CPU.

Gradients: FSDP2 averages them over the D ranks (reduce-scatter ÷ D). The losses therefore carry
the factor D of `algo.aggregation` with global token / sequence counts, and the average over ranks
equals the gradient of the whole batch on one rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


@dataclass(frozen=True)
class DataParallel:
    """One process (mesh None) or the D ranks of a 1-D device mesh, sharded with FSDP2.

    param_dtype: compute dtype ("bfloat16", "float16") while master weights, gradients and the
        optimizer stay fp32 — FSDP2's MixedPrecisionPolicy with fp32 gradient reduction; in one
        process, torch.autocast around the model body.
    offload_params: FSDP2 CPUOffloadPolicy — sharded parameters, gradients and the optimizer step
        live in CPU memory (GPU meshes only: rejected on CPU, where it has nothing to move).
    reshard_after_forward: free each block's gathered parameters after its forward (ZeRO-3) rather
        than keeping them for the backward (ZeRO-2: faster, more memory).
    """

    mesh: DeviceMesh | None = None
    param_dtype: str | None = None
    offload_params: bool = False
    reshard_after_forward: bool = True

    def __post_init__(self):
        if self.param_dtype is not None and self.param_dtype not in DTYPES:
            raise ValueError(f"unknown param_dtype {self.param_dtype!r}; valid: {sorted(DTYPES)}")
        if self.offload_params and (self.mesh is None or self.mesh.device_type == "cpu"):
            # FSDP2's CPUOffloadPolicy moves shards off an accelerator; on a CPU mesh it fails
            # ("Cannot access accelerator device"), and the parameters are in CPU memory already.
            raise ValueError(
                "offload_params needs FSDP2 on a GPU mesh; on CPU the parameters already live in RAM"
            )

    @classmethod
    def over_world(cls, **kwargs: Any) -> DataParallel:
        """All ranks of the initialised default process group as one data-parallel mesh."""
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: call init_process_group first")
        device = "cuda" if "nccl" in dist.get_backend() else "cpu"  # "nccl" or "cpu:gloo,cuda:nccl"
        return cls(mesh=init_device_mesh(device, (dist.get_world_size(),)), **kwargs)

    @property
    def size(self) -> int:
        return 1 if self.mesh is None else self.mesh.size()

    @property
    def rank(self) -> int:
        return 0 if self.mesh is None else self.mesh.get_local_rank()

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype for torch.autocast: only in one process (FSDP2 casts the parameters itself)."""
        return DTYPES[self.param_dtype] if self.mesh is None and self.param_dtype else None

    def compute_device(self, module: nn.Module) -> torch.device:
        """Where `module` computes, so where its batches go: its parameters' device, except under FSDP2
        CPU offload, whose shards live in CPU memory and are gathered on this rank's GPU to compute."""
        if self.offload_params and self.mesh is not None:
            return torch.device(self.mesh.device_type, torch.cuda.current_device())
        return next(module.parameters()).device

    # --- reductions ----------------------------------------------------------------------------
    def reduce(self, values: Sequence[float], op: str) -> list[float]:
        """Element-wise all-reduce ("sum", "max", "min") over the ranks, in float64."""
        if self.mesh is None:
            return [float(v) for v in values]
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self.mesh.device_type)
        dist.all_reduce(tensor, op=REDUCE_OPS[op], group=self.mesh.get_group())
        return tensor.tolist()

    def mean(self, metrics: dict[str, float]) -> dict[str, float]:
        """Each metric averaged over the ranks; a rank without a metric counts 0 for it (a rank that
        ran only zero-weight passes reports no loss shares)."""
        if self.mesh is None:
            return dict(metrics)
        gathered: list[list[str] | None] = [None] * self.size
        dist.all_gather_object(gathered, sorted(metrics), group=self.mesh.get_group())
        names = sorted(set().union(*gathered))
        totals = self.reduce([metrics.get(n, 0.0) for n in names], "sum")
        return {n: t / self.size for n, t in zip(names, totals, strict=True)}

    def barrier(self) -> None:
        if self.mesh is not None:
            dist.barrier(group=self.mesh.get_group())

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.mesh is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, group_src=0, group=self.mesh.get_group())
        return box[0]

    # --- sharding ------------------------------------------------------------------------------
    def shard(self, root: nn.Module, block_class_names: Sequence[str]) -> nn.Module:
        """fully_shard each block (module whose class name is listed) and then the root, in place."""
        if self.mesh is None:
            return root
        mp = MixedPrecisionPolicy(
            param_dtype=DTYPES[self.param_dtype] if self.param_dtype else None, reduce_dtype=torch.float32
        )
        offload = CPUOffloadPolicy() if self.offload_params else OffloadPolicy()
        kwargs = dict(mesh=self.mesh, mp_policy=mp, offload_policy=offload)
        blocks = [m for m in root.modules() if type(m).__name__ in set(block_class_names)]
        if not blocks:
            raise ValueError(
                f"no module of classes {list(block_class_names)} to shard in {type(root).__name__}"
            )
        for block in blocks:
            fully_shard(block, reshard_after_forward=self.reshard_after_forward, **kwargs)
        fully_shard(root, reshard_after_forward=False, **kwargs)  # the root is used again at once
        return root

    # --- full state dicts (weight sync, checkpoints) ---------------------------------------------
    def _options(self, **kwargs: Any) -> StateDictOptions:
        return StateDictOptions(full_state_dict=True, **kwargs)

    def full_model_state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """Unsharded CPU tensors on rank 0 ({} on the other ranks); a collective when sharded."""
        state = get_model_state_dict(module, options=self._options(cpu_offload=True))
        return {name: tensor.detach() for name, tensor in state.items()}

    def load_full_model_state(self, module: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load rank 0's full state into every rank's shard (other ranks may pass {})."""
        for sub in module.modules():  # a forward without a backward leaves the root unsharded
            if isinstance(sub, FSDPModule):  # (reshard_after_forward=False): shard it to load
                sub.reshard()
        options = self._options(broadcast_from_rank0=self.mesh is not None, strict=True)
        set_model_state_dict(module, state, options=options)

    def full_optimizer_state(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        return get_optimizer_state_dict(module, optimizer, options=self._options(cpu_offload=True))

    def load_full_optimizer_state(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, state: dict
    ) -> None:
        options = self._options(broadcast_from_rank0=self.mesh is not None)
        set_optimizer_state_dict(module, optimizer, state, options=options)


def clip_grad_norm(parameters: Sequence[nn.Parameter], max_norm: float) -> float:
    """Clip to the global gradient norm (over all ranks' shards) and return that norm."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)
