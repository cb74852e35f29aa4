"""Layer 5, training engine: the host allocator of a process that trains — freed blocks kept for reuse.

glibc's malloc serves every block above its mmap threshold (which it raises dynamically, but never
past 32 MiB on 64-bit) with a fresh `mmap`, and unmaps it on free. On CPU the activations of a
packed micro-batch are such blocks as soon as sequences are long: 64 rows × 290 tokens × an MLP
width of 1024 in fp32 is 74 MB per tensor. Each forward and backward then writes fresh pages, and
the kernel zero-fills every 4 KiB page on its first write (a minor page fault), so an element-wise
op over such a tensor runs at a fraction of memory bandwidth.

`keep` sets, through glibc's `mallopt`,

    M_MMAP_MAX = 0                 no block is mmapped: all come from the heap (threads' arenas fall
                                   back to the main one for blocks larger than their 64 MiB heaps)
    M_TRIM_THRESHOLD = 2³¹ − 1     the heap's free top is not handed back to the OS (below 2 GiB)

so a freed activation's pages are reused by the next pass. The process's resident memory then stays
at its peak instead of shrinking between passes (the peak itself does not grow: the same blocks are
reused). Measured on the 10M model, 64 rows × (≈ 27 prompt + 256 response) tokens, one update on 2
threads (docs/benchmarks.md, "Quiet machine, generation on the calling thread, host allocator"):
minor page faults of a 3-step run 3.93 M → 1.68 M, the update 14.1 s → 9.1 s. Below 32 MiB per
tensor the dynamic threshold already keeps blocks in the heap, and the 32-token rows of the same
benchmark do not change.

`system` leaves glibc's settings as the process has them. Other C libraries have no `mallopt`, and
glibc may refuse a setting: `keep` then warns and changes nothing more.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import warnings

HOST_ALLOCATORS = ("keep", "system")

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
KEEP_TOP = 2**31 - 1  # the largest int mallopt takes: a free top below 2 GiB stays in the heap

_kept = [False]  # whether this process already applied `keep`


def _glibc_mallopt():
    """glibc's `mallopt(param, value) -> 1 on success`, or None where the C library is not glibc."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt


def use_host_allocator(mode: str) -> bool:
    """Apply `mode` (HOST_ALLOCATORS) to this process; True when glibc now keeps freed blocks.

    Idempotent: a process that builds several workers (the policy and the critic) applies it once."""
    if mode not in HOST_ALLOCATORS:
        raise ValueError(f"unknown host allocator {mode!r}; valid: {', '.join(HOST_ALLOCATORS)}")
    if mode == "system":
        return False
    if _kept[0]:
        return True
    mallopt = _glibc_mallopt()
    if mallopt is None:
        why = "needs glibc's mallopt, which this C library lacks"
    elif mallopt(M_MMAP_MAX, 0) != 1 or mallopt(M_TRIM_THRESHOLD, KEEP_TOP) != 1:
        why = "was refused by glibc's mallopt"
    else:
        _kept[0] = True
        return True
    warnings.warn(
        f"cluster.host_allocator=keep {why}: freed host memory is managed by the system allocator as it is",
        RuntimeWarning,
        stacklevel=2,
    )
    return False
