"""Scorers that attack their own worker as hostile user code would (module level: workers import them)."""

import os
import stat
import struct
import subprocess
import time

TOKEN_VARIABLE = "STRATARL_FAULT_TOKEN"  # set by a test; every process a scorer starts inherits it


class NeedsTwoArguments(Exception):
    """Pickles as NeedsTwoArguments(message) and so cannot be unpickled: __init__ wants two arguments."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


def worker_socket() -> int:
    """The descriptor of the worker's socket to the pool, found as user code would find it."""
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                return fd
        except OSError:
            continue
    raise RuntimeError("no socket")


def hostile(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 when the response equals the truth; otherwise the attack the response names."""
    if solution_str == "half_message":  # a header promising 64 KiB, then 5 bytes, then silence
        os.write(worker_socket(), struct.pack("!Q", 65536) + b"hello")
        time.sleep(60)
    if solution_str == "half_message_then_return":  # the real result is swallowed by the false header
        os.write(worker_socket(), struct.pack("!Q", 65536) + b"hello")
        return 1.0
    if solution_str == "garbage_header":
        os.write(worker_socket(), b"\xff" * 8)
        time.sleep(60)
    if solution_str == "close_socket":
        os.close(worker_socket())
        time.sleep(60)
    if solution_str == "return_unpicklable_error":
        return {"score": 1.0, "error": NeedsTwoArguments(1, 2)}
    if solution_str == "raise_unpicklable_error":
        raise NeedsTwoArguments(1, 2)
    if solution_str == "kill_parent":
        os.kill(os.getppid(), 9)
        return 0.5
    if solution_str == "setsid_child":  # a grandchild in a session of its own, then the call returns
        subprocess.Popen(["setsid", "sleep", "300"], start_new_session=True)
        return 0.25
    if solution_str == "setsid_child_and_hang":
        subprocess.Popen(["setsid", "sleep", "300"], start_new_session=True)
        time.sleep(300)
    if solution_str == "sleep_forever":
        time.sleep(300)
    return float(solution_str == ground_truth)
