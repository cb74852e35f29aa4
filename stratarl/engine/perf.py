"""Layer 5, training engine: model FLOPs, the machine's matmul peak, MFU and memory metrics.

Model FLOPs of one forward over a row of s tokens, K of them scored by the output head (a decoder
of L blocks, width d, h_q query heads of size e, h_kv key/value heads, gated MLP width f, vocab V):

    F_fwd = 2·N_block·L·s + 2·d·V·K + 4·L·h_q·e·s²
    N_block = d·h_q·e + 2·d·h_kv·e + h_q·e·d + 3·d·f      (q, k, v, o projections; gate, up, down)

`ModelFlops.from_model` counts N_block·L from the model's own matmul weights instead (every Linear or
GPT-2 Conv1D but the head), so an ungated MLP (GPT-2, OPT: 2·d·f) or fused projections count right.
The 2·N terms are the matmuls (a multiply-add is 2 FLOPs); 4·h_q·e·s² per block is QKᵀ and A·V over
the full s×s square (verl's FlopsCounter convention; causal kernels do about half). Embedding
lookups are gathers, not FLOPs: departure from verl, which counts the embedding as a matmul. The
backward costs twice the forward, so a training step is 3·F_fwd. MFU = FLOPs / (seconds · peak):
padding and masked-out attention across packed rows do not count as model FLOPs, so they lower MFU.
"""

from __future__ import annotations

import functools
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

GIB = 1024**3

# Square fp32/bf16 matmul peak of one thread on the project's reference machine (AMD EPYC Zen-4,
# AVX-512; measured 2026-11-29 on an idle machine, square matmuls, best of 8 reps at n=2048..4096).
CPU_PEAK_FLOPS_PER_THREAD = {torch.float32: 96e9, torch.bfloat16: 207e9}


@dataclass(frozen=True)
class ModelFlops:
    """The FLOP coefficients of a decoder, from its HF config."""

    block_params: int  # N_block·L: matmul parameters of all blocks
    head_params: int  # d·V (1·d for a value head)
    attention_coeff: int  # 4·L·h_q·e: forward FLOPs per s² of one sequence

    @classmethod
    def from_config(cls, config, *, head_outputs: int | None = None) -> ModelFlops:
        """head_outputs: V for a causal LM (default: config.vocab_size), 1 for a value head."""
        d, layers = config.hidden_size, config.num_hidden_layers
        h_q = config.num_attention_heads
        h_kv = getattr(config, "num_key_value_heads", None) or h_q
        e = getattr(config, "head_dim", None) or d // h_q
        block = d * h_q * e + 2 * d * h_kv * e + h_q * e * d + 3 * d * config.intermediate_size
        outputs = config.vocab_size if head_outputs is None else head_outputs
        return cls(block_params=block * layers, head_params=d * outputs, attention_coeff=4 * layers * h_q * e)

    @classmethod
    def from_model(cls, model: nn.Module, head: nn.Module, *, head_outputs: int | None = None) -> ModelFlops:
        """The coefficients of `model` (an HF model, peft-wrapped or not) whose output head is `head`:
        N_block·L = the weights of every matmul module but the head."""
        config = model.config
        d, layers, h_q = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
        e = getattr(config, "head_dim", None) or d // h_q
        matmuls = sum(
            m.weight.numel()
            for m in model.modules()
            if m is not head and (isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D")
        )
        outputs = config.vocab_size if head_outputs is None else head_outputs
        return cls(block_params=matmuls, head_params=d * outputs, attention_coeff=4 * layers * h_q * e)

    def forward_flops(self, seq_lens: Sequence[int], scored_tokens: int) -> float:
        """F_fwd summed over rows of lengths `seq_lens`, `scored_tokens` of them through the head."""
        tokens = sum(seq_lens)
        squares = sum(s * s for s in seq_lens)
        return (
            2.0 * self.block_params * tokens
            + 2.0 * self.head_params * scored_tokens
            + self.attention_coeff * squares
        )

    def train_flops(self, seq_lens: Sequence[int], scored_tokens: int) -> float:
        """Forward + backward: 3·F_fwd."""
        return 3.0 * self.forward_flops(seq_lens, scored_tokens)


@functools.cache
def measured_matmul_peak(dtype: torch.dtype = torch.float32, device: str = "cpu", n: int = 2048) -> float:
    """Best FLOP/s of an n×n matmul over a few repetitions, measured once per process (cached per
    dtype, device and size; the thread count in force at the first call applies)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for rep in range(6):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        torch.mm(a, b)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if rep:  # the first call warms up
            best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best


# Dense (no sparsity) peak FLOP/s by the vendors' datasheets: bf16/fp16 on the tensor cores, and plain
# fp32 (PyTorch leaves TF32 matmuls off by default, so fp32 training runs on the fp32 units). Keyed on
# words of `torch.cuda.get_device_name` ("NVIDIA H100 80GB HBM3" -> {nvidia, h100, 80gb, hbm3}); the
# first row whose words all appear wins, so the PCIe/NVL variants come before their SXM row.
GPU_PEAK_FLOPS: tuple[tuple[frozenset[str], float, float], ...] = tuple(
    (frozenset(words.split()), bf16 * 1e12, fp32 * 1e12)
    for words, bf16, fp32 in (
        ("h100 pcie", 756.0, 51.2),
        ("h100 nvl", 835.0, 60.0),
        ("h100", 989.4, 66.9),  # SXM5 (reported as "NVIDIA H100 80GB HBM3")
        ("h200 nvl", 835.0, 60.0),
        ("h200", 989.4, 66.9),  # SXM (reported as "NVIDIA H200"): an H100's compute, more memory
        ("gh200", 989.4, 66.9),
        ("h800", 989.4, 66.9),
        ("a100", 312.0, 19.5),  # SXM4 and PCIe, 40 and 80 GB
        ("a800", 312.0, 19.5),
        ("l40s", 362.0, 91.6),
        ("l4", 121.0, 30.3),
        ("a10", 125.0, 31.2),
    )
)


def gpu_peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    """The datasheet peak of the GPU called `device_name` in `dtype`; None for a GPU not in the table."""
    words = set(device_name.lower().replace("-", " ").split())
    for keys, bf16, fp32 in GPU_PEAK_FLOPS:
        if keys <= words:
            return fp32 if dtype == torch.float32 else bf16
    return None


def default_peak_flops(dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> float:
    """The MFU denominator when none is configured, for a model on `device` computing in `dtype`.

    cuda: the datasheet peak of that GPU (`GPU_PEAK_FLOPS`); a GPU not in the table gets a measured
    n×n matmul peak instead (below the datasheet's, so its MFU reads high). cpu: the reference
    machine's per-thread peak × torch threads."""
    device = torch.device(device)
    if device.type == "cuda":
        peak = gpu_peak_flops(torch.cuda.get_device_name(device), dtype)
        return peak if peak is not None else measured_matmul_peak(dtype, str(device))
    return (
        CPU_PEAK_FLOPS_PER_THREAD.get(dtype, CPU_PEAK_FLOPS_PER_THREAD[torch.float32])
        * torch.get_num_threads()
    )


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak."""
    return 0.0 if seconds <= 0 else flops / seconds / peak_flops


def memory_metrics(device: torch.device | str = "cpu") -> dict[str, float]:
    """`perf/max_memory_allocated_gb`: the CUDA allocator's peak on `device` when the model lives on a
    GPU, else this process's peak resident memory (the CPU is the device). `perf/cpu_memory_used_gb`:
    this process's resident memory now."""
    device = torch.device(device)
    peak_rss = _peak_rss_bytes()
    device_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss
    return {
        "perf/max_memory_allocated_gb": device_peak / GIB,
        "perf/cpu_memory_used_gb": _current_rss_bytes(peak_rss) / GIB,
    }


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def _current_rss_bytes(fallback: int) -> int:
    statm = Path("/proc/self/statm")
    if not statm.exists():
        return fallback
    return int(statm.read_text().split()[1]) * resource.getpagesize()
