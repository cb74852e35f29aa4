"""Scoring functions for the process-pool tests (module level, so worker processes can import them)."""

import asyncio
import os
import signal
import sys
import time


def misbehaving(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 when the response equals the truth; on request it hangs, sleeps, dies, raises or awaits."""
    if solution_str == "hang":
        while True:
            pass
    if solution_str.startswith("sleep:"):
        time.sleep(float(solution_str.split(":")[1]))
        return 0.5
    if solution_str == "die":
        os._exit(3)
    if solution_str == "exit0":
        os._exit(0)
    if solution_str == "sysexit":
        sys.exit(3)
    if solution_str == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if solution_str == "print":
        print("x" * 2**20)
        return 0.75
    if solution_str == "boom":
        raise ValueError("scorer exploded")
    if solution_str == "async":
        return _async_score(ground_truth)
    return {"score": float(solution_str == ground_truth), "pid": os.getpid()}


async def _async_score(ground_truth):
    await asyncio.sleep(0.01)
    return {"score": 0.25, "truth": ground_truth}


def returns_what_it_is_given(data_source, solution_str, ground_truth, extra_info=None):
    """Returns its ground truth as its result (a fuzz target for the return path); "unpicklable" and
    "huge" ask for a dict that cannot travel between processes, or one with 16 MB in it."""
    if ground_truth == "unpicklable":
        return {"score": 1.0, "f": lambda: 0}
    if ground_truth == "huge":
        return {"score": 1.0, "blob": "x" * 2**24}
    return ground_truth
