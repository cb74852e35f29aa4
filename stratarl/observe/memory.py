"""Cross-cutting: which phase drove a process's memory to its peak, host and device.

The kernel keeps a process's resident high-water mark (VmHWM), and the CUDA allocator its peak
allocation; neither is reset here (the engine's `perf/max_memory_*` metrics read the same
counters). A phase during which a high-water mark rose is the phase that set the peak, at exactly
the new value: `memory/host_peak_gb/<phase>` and `memory/device_peak_gb/<phase>` are logged for
those phases only, beside the peaks so far and the machine's totals.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

GIB = 2**30


def host_high_water_bytes() -> int:
    """This process's peak resident memory so far (VmHWM; getrusage where /proc is missing)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def host_total_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cuda():
    """torch.cuda when this process uses a GPU; None otherwise. A process that never touched CUDA
    (a Ray driver on a GPU node) is left without a CUDA context: asking for device properties would
    create one, ~0.5 GB on GPU 0."""
    import torch

    return torch.cuda if torch.cuda.is_available() and torch.cuda.is_initialized() else None


def device_high_water_bytes() -> int | None:
    cuda = _cuda()
    return None if cuda is None else int(cuda.max_memory_allocated())


class PeakTracker:
    """Per step: the phases that raised this process's host or device high-water mark."""

    def __init__(self) -> None:
        self.raised: dict[str, float] = {}

    def marks(self) -> tuple[int, int | None]:
        cuda = _cuda()  # asked each time: the models may reach the GPU after this tracker is made
        device = None if cuda is None else int(cuda.max_memory_allocated())
        return host_high_water_bytes(), device

    def after(self, phase: str, before: tuple[int, int | None]) -> None:
        host, device = self.marks()
        if host > before[0]:
            self.raised[f"memory/host_peak_gb/{phase}"] = host / GIB
        if device is not None and before[1] is not None and device > before[1]:
            self.raised[f"memory/device_peak_gb/{phase}"] = device / GIB

    def take_metrics(self) -> dict[str, float]:
        """The step's raised peaks, the peaks so far and the totals; the record starts again."""
        host, device = self.marks()
        metrics = self.raised | {
            "memory/host_peak_gb": host / GIB,
            "memory/host_total_gb": host_total_bytes() / GIB,
        }
        cuda = _cuda()
        if device is not None and cuda is not None:
            metrics["memory/device_peak_gb"] = device / GIB
            metrics["memory/device_total_gb"] = (
                cuda.get_device_properties(cuda.current_device()).total_memory / GIB
            )
        self.raised = {}
        return metrics
