"""The sandbox: each escape attempt is stopped by the OS namespace (the audit hook turned off), by the
audit hook too where it applies, and fast; without bubblewrap, code is refused, never run unconfined."""

import os
import socket
import subprocess
import threading
import time
import uuid

import pytest

from stratarl.reward import sandbox_namespace
from stratarl.reward.sandbox import SandboxLimits, SandboxUnavailableError, run_python

FAST = SandboxLimits(wall_seconds=3.0, cpu_seconds=2, output_bytes=10_000)
OS_ONLY = SandboxLimits(wall_seconds=3.0, cpu_seconds=2, output_bytes=10_000, python_guard=False)
# The historical escape: the guard's policy was this module's globals, reachable as `__main__`.
TAMPER = (
    "import __main__, builtins, os.path\n"
    "for name in ('BLOCKED_PREFIXES', 'BLOCKED_IMPORTS', 'PATH_EVENTS'):\n"
    "    setattr(__main__, name, ())\n"
    "os.path.realpath = lambda p: '/work/x'\n"
    "builtins.any = lambda xs: True\n"
)


def _processes_with(marker: str) -> list[str]:
    """Host pids whose command line contains `marker` (what an escape would leave running)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def _survivor_program(marker: str, *, setsid: bool) -> str:
    """Start `sleep <marker>` detached (double fork, its own session, SIGTERM ignored) and return."""
    detach = "os.setsid()\n    " if setsid else ""
    return (
        "import os, signal, subprocess\n"
        "if os.fork() == 0:\n"
        f"    {detach}signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    if os.fork() == 0:\n"
        f"        subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "    os._exit(0)\n"
        "import time; time.sleep(0.3); print('started')\n"
    )


def test_a_normal_program_runs_with_stdin_and_files_in_its_directory():
    code = (
        "import sys, json\nn = int(sys.stdin.read())\n"
        "open('out.txt', 'w').write(str(n * 2))\nprint(open('out.txt').read())"
    )
    result = run_python(code, stdin="21\n", limits=FAST)
    assert (result.status, result.returncode, result.stdout) == ("ok", 0, "42\n")


def test_the_program_runs_as_nobody_and_outside_as_an_unprivileged_uid():
    marker = f"1000.{uuid.uuid4().int % 10**9}"
    code = f"import os, subprocess\nprint(os.getuid())\nsubprocess.run(['sleep', '{marker}'], timeout=1)"
    seen: list[int] = []

    def watch() -> None:  # the sandbox's process as the host sees it
        for _ in range(100):
            for pid in _processes_with(marker):
                with open(f"/proc/{pid}/status") as f:
                    seen.extend(int(line.split()[1]) for line in f if line.startswith("Uid:"))
            if seen:
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    result = run_python(code, limits=OS_ONLY)
    watcher.join()
    assert result.stdout.splitlines()[0] == "65534"  # nobody inside
    assert seen and all(uid != 0 and uid != os.getuid() for uid in seen), seen  # never root, nor us


def test_outside_processes_are_invisible_and_cannot_be_signalled():
    decoy = subprocess.Popen(["sleep", "30"])
    try:
        code = (
            "import os, signal\n"
            "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getppid())\n"
            f"for pid in ({decoy.pid}, {os.getpid()}):\n"
            "    try:\n"
            "        fd = os.pidfd_open(pid)\n"
            "        signal.pidfd_send_signal(fd, signal.SIGKILL)\n"
            "        print('SIGNALLED', pid)\n"
            "    except OSError as err:\n"
            "        print('refused', err.errno)\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL); print('KILLED', pid)\n"
            "    except OSError as err:\n"
            "        print('refused', err.errno)\n"
        )
        result = run_python(code, limits=OS_ONLY)
        assert result.ok, result
        assert "SIGNALLED" not in result.stdout and "KILLED" not in result.stdout
        pids = eval(result.stdout.splitlines()[0].rsplit(" ", 1)[0])  # our own output
        assert max(pids) < 10  # the namespace's own few processes, not the host's
        assert decoy.poll() is None  # alive
        with_guard = run_python(f"import os, signal\nos.pidfd_open({decoy.pid})", limits=FAST)
        assert "PermissionError" in with_guard.stderr or "ProcessLookupError" in with_guard.stderr
    finally:
        decoy.kill()


def test_the_guard_cannot_be_rewritten_from_the_program_and_the_namespace_holds_without_it(tmp_path):
    # Second layer: the tampering of the issue no longer turns the hook off.
    result = run_python(TAMPER + "import subprocess\nsubprocess.run(['true'])", limits=FAST)
    assert result.status == "error" and "PermissionError" in result.stderr, result
    # First layer: with no hook at all, a subprocess runs — inside the namespace, where it can write
    # nothing outside /work and leaves nothing behind.
    target = tmp_path / "planted.txt"
    code = (
        "import subprocess\n"
        f"r = subprocess.run(['sh', '-c', 'echo x > {target}; echo x > /usr/planted; id -u'],"
        " capture_output=True, text=True)\n"
        "print(r.stdout.strip(), r.returncode)\n"
    )
    result = run_python(code, limits=OS_ONLY)
    assert result.ok and result.stdout.split()[0] == "65534", result
    assert not target.exists() and not os.path.exists("/usr/planted")


@pytest.mark.parametrize("setsid", [False, True])
def test_a_forked_process_does_not_survive_the_run(setsid):
    marker = f"1000.{uuid.uuid4().int % 10**9}"
    result = run_python(_survivor_program(marker, setsid=setsid), limits=OS_ONLY)
    assert "started" in result.stdout, result
    time.sleep(0.2)
    assert _processes_with(marker) == []
    # the same on a timeout: the program still sleeps when the wall clock kills the namespace
    marker = f"1000.{uuid.uuid4().int % 10**9}"
    code = _survivor_program(marker, setsid=setsid) + "time.sleep(60)\n"
    timed_out = run_python(code, limits=SandboxLimits(wall_seconds=1.0, python_guard=False))
    assert timed_out.status == "timeout"
    time.sleep(0.2)
    assert _processes_with(marker) == []


def test_fork_bomb_is_refused_by_the_hook_and_capped_by_the_kernel():
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
    # without the hook: RLIMIT_NPROC stops the bomb at `processes`, inside the namespace only
    bomb = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n        n += 1\n"
        "except OSError as err:\n    print(n, err.errno)\n"
    )
    result = run_python(bomb, limits=SandboxLimits(wall_seconds=3.0, processes=8, python_guard=False))
    forks, errno = result.stdout.split()
    assert result.ok and int(forks) < 8 and errno == "11"  # EAGAIN


def test_the_work_dir_is_capped_in_total_not_per_file():
    # 64 files of 16 MB each would be 1 GB; the private filesystem holds disk_mb in all.
    code = (
        "import os\nwritten = 0\nchunk = b'x' * 2**20\n"
        "try:\n    for i in range(64):\n        with open(f'f{i}', 'wb') as f:\n"
        "            for _ in range(16):\n                f.write(chunk); written += len(chunk)\n"
        "except OSError as err:\n    print(written, err.errno)\n"
    )
    limits = SandboxLimits(wall_seconds=10.0, disk_mb=24, file_mb=16, python_guard=False)
    result = run_python(code, limits=limits)
    written, errno = result.stdout.split()
    assert result.ok and errno == "28"  # ENOSPC
    assert int(written) <= 24 * 2**20


def test_nothing_outside_the_work_dir_can_be_created(tmp_path):
    host = str(tmp_path)
    attempts = {
        "sqlite": "import sqlite3\nsqlite3.connect({p!r}).execute('create table t (a)')",
        "fifo": "import os\nos.mkfifo({p!r})",
        "xattr": "import os\nos.setxattr('/usr/bin', 'user.x', b'1')",
        "file": "open({p!r}, 'w').write('x')",
    }
    for name, template in attempts.items():
        for path in (f"{host}/{name}", f"/usr/{name}", f"/{name}"):
            for limits in (OS_ONLY, FAST):
                result = run_python(template.format(p=path), limits=limits)
                assert result.status == "error", (name, path, result)
                assert not os.path.exists(path) and not os.path.exists(f"{host}/{name}")
    # inside /work all of these work: the program is confined, not crippled
    code = "import os, sqlite3\nsqlite3.connect('db').execute('create table t (a)')\nos.mkfifo('p')"
    ok = run_python(code, limits=OS_ONLY)
    assert ok.ok, ok


def test_nested_user_namespaces_are_refused():
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())"  # CLONE_NEWUSER
    )
    result = run_python(code, limits=OS_ONLY)
    rc, errno = result.stdout.split()
    assert result.ok and rc == "-1" and int(errno) != 0


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


def test_host_files_cannot_be_read_or_listed(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    attempts = [
        f"print(open({str(secret)!r}).read())",
        "print(open('/etc/passwd').read())",
        "print(open('/root/.bashrc').read())",
        f"import os\nprint(os.listdir({str(tmp_path)!r}))",
        f"import pathlib\nprint(pathlib.Path({str(secret)!r}).read_bytes())",
        f"import os\nfd = os.open({str(secret)!r}, os.O_RDONLY)\nprint(os.read(fd, 100))",
        f"import os\nos.symlink({str(secret)!r}, 'link')\nprint(open('link').read())",
        "import ctypes\nctypes.CDLL(None).system(b'cat /etc/passwd')",
    ]
    for code in attempts:
        for limits in (FAST, OS_ONLY):
            result = run_python(code, limits=limits)
            assert "TOP-SECRET" not in result.stdout and "root:" not in result.stdout, (code, result)
            # with the hook: refused (or, under /tmp, which is /work inside, simply not there)
            assert limits is OS_ONLY or result.status == "error", (code, result)
    refused = run_python("import os\nos.chdir('..')\nprint(os.listdir('.'))", limits=FAST)
    assert "PermissionError" in refused.stderr


def test_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = (
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
    )
    # the namespace alone, the hook alone (the host's network shared), and both
    for limits in (OS_ONLY, SandboxLimits(wall_seconds=3.0, isolate_network=False), FAST):
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
    assert result.stdout.strip() == "['HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR']"


@pytest.mark.parametrize("code", ["import numpy", "import torch"])
def test_only_the_standard_library_is_importable(code):
    result = run_python(code, limits=FAST)
    assert result.status == "error" and "ModuleNotFoundError" in result.stderr


def test_without_bubblewrap_code_is_refused_not_run_unconfined(monkeypatch, tmp_path):
    from stratarl.reward import code_exec

    monkeypatch.setattr(sandbox_namespace, "BWRAP", "no-such-bwrap")
    marker = tmp_path / "ran"
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        run_python(f"open({str(marker)!r}, 'w')", limits=FAST)
    cases = {"inputs": ["1\n"], "outputs": ["1\n"]}
    with pytest.raises(SandboxUnavailableError):
        code_exec.compute_score("code", "print(input())", cases)
    assert not marker.exists()
