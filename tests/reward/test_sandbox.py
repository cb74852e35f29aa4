"""The sandbox: what each escape attempt does, that it is stopped, and that it is stopped fast."""

import os
import socket
import time

import pytest

from stratarl.reward.sandbox import SandboxLimits, run_python

FAST = SandboxLimits(wall_seconds=3.0, cpu_seconds=2, output_bytes=10_000)


def test_a_normal_program_runs_with_stdin_and_files_in_its_directory():
    code = (
        "import sys, json\nn = int(sys.stdin.read())\n"
        "open('out.txt', 'w').write(str(n * 2))\nprint(open('out.txt').read())"
    )
    result = run_python(code, stdin="21\n", limits=FAST)
    assert (result.status, result.returncode, result.stdout) == ("ok", 0, "42\n")


def _sandbox_sleepers() -> set[str]:
    """pids of `sleep 100` processes (what the escape attempts below would leave running)."""
    return {pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid).startswith("sleep 100")}


def test_fork_bomb_is_refused_and_leaves_no_process():
    # Compared with the sleepers before, so that unrelated `sleep` processes on the machine don't count.
    sleepers_before = _sandbox_sleepers()
    for code in (
        "import os\nwhile True:\n    os.fork()",
        "import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])",
        "import multiprocessing as m\nm.Process(target=print).start()",
        "import os\nos.system('sleep 100 &')",
        "import os\nos.posix_spawn('/bin/sleep', ['sleep', '100'], {})",
    ):
        started = time.monotonic()
        result = run_python(code, limits=FAST)
        assert result.status == "error" and "PermissionError" in result.stderr, (code, result)
        assert time.monotonic() - started < 2.5
    assert not _sandbox_sleepers() - sleepers_before


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_infinite_loop_is_stopped_by_the_cpu_or_wall_limit():
    started = time.monotonic()
    result = run_python("while True:\n    pass", limits=SandboxLimits(wall_seconds=1.0, cpu_seconds=1))
    assert result.status == "timeout"
    assert time.monotonic() - started < 2.5
    sleeper = run_python("import time\ntime.sleep(30)", limits=SandboxLimits(wall_seconds=0.5, cpu_seconds=5))
    assert sleeper.status == "timeout" and sleeper.duration_s < 2.0  # no CPU used: the wall clock stops it


def test_huge_output_is_cut_and_the_program_killed():
    started = time.monotonic()
    result = run_python("while True:\n    print('x' * 1000)", limits=FAST)
    assert result.status == "output_limit"
    assert len(result.stdout) <= FAST.output_bytes
    assert time.monotonic() - started < 2.5


def test_memory_limit():
    result = run_python("x = bytearray(2 * 1024**3)", limits=SandboxLimits(memory_mb=256))
    assert result.status == "error" and "MemoryError" in result.stderr


def test_files_outside_its_directory_cannot_be_read_listed_or_written(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    attempts = [
        f"print(open({str(secret)!r}).read())",
        "print(open('/etc/passwd').read())",
        f"import os\nprint(os.listdir({str(tmp_path)!r}))",
        f"import pathlib\nprint(pathlib.Path({str(secret)!r}).read_bytes())",
        f"import os\nfd = os.open({str(secret)!r}, os.O_RDONLY)\nprint(os.read(fd, 100))",
        f"open({str(tmp_path / 'planted.txt')!r}, 'w').write('x')",
        f"import os\nos.symlink({str(secret)!r}, 'link')\nprint(open('link').read())",
        "import os\nos.chdir('..')\nprint(os.listdir('.'))",
        "import ctypes\nctypes.CDLL(None).system(b'cat /etc/passwd')",
    ]
    for code in attempts:
        result = run_python(code, limits=FAST)
        assert result.status == "error" and "PermissionError" in result.stderr, (code, result)
        assert "TOP-SECRET" not in result.stdout and "root:" not in result.stdout
    assert not (tmp_path / "planted.txt").exists()


def test_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = (
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
    )
    # with the network namespace and without it (the audit hook alone)
    for limits in (FAST, SandboxLimits(wall_seconds=3.0, isolate_network=False)):
        result = run_python(code, limits=limits)
        assert result.status == "error" and "connected" not in result.stdout
    server.setblocking(False)
    with pytest.raises(BlockingIOError):  # nothing ever reached the listening socket
        server.accept()
    server.close()


def test_environment_is_clean(monkeypatch):
    monkeypatch.setenv("STRATARL_TEST_SECRET", "hunter2")
    result = run_python("import os\nprint(sorted(os.environ))", limits=FAST)
    assert result.ok and "STRATARL_TEST_SECRET" not in result.stdout
    assert result.stdout.strip() == "['HOME', 'LANG', 'PATH', 'TMPDIR']"


def test_signals_to_other_processes_are_refused():
    result = run_python(f"import os\nos.kill({os.getpid()}, 9)", limits=FAST)
    assert result.status == "error" and "PermissionError" in result.stderr


@pytest.mark.parametrize("code", ["import numpy", "import torch"])
def test_only_the_standard_library_is_importable(code):
    result = run_python(code, limits=FAST)
    assert result.status == "error" and "ModuleNotFoundError" in result.stderr
