"""cluster.address for real: a two-node Ray cluster on this machine, started with the commands of
docs/architecture.md (loopback only, one CPU per node), runs GRPO steps with a training rank on each node.

Ray replaces a node address of 127.0.0.1 by the machine's outward address, so the nodes take two other
loopback addresses, 127.0.0.2 and 127.0.0.3; the test checks that every socket they listen on is one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from stratarl.apps.quickstart import RECIPE
from stratarl.observe.run_log import read_metrics

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
# The commands of README.md and docs/architecture.md ("Running on a multi-node Ray cluster").
HEAD = "ray start --head --node-ip-address={head_ip} --port={port} --num-cpus={cpus}"
NODE = "ray start --address={head_ip}:{port} --node-ip-address={node_ip} --num-cpus={cpus}"
DRIVER = (
    "stratarl train {recipe} cluster.backend=ray cluster.address={head_ip}:{port} "
    "cluster.training_workers={workers}"
)
DOC_VALUES = {
    "head_ip": "<head-ip>",
    "node_ip": "<node-ip>",
    "port": "6379",
    "cpus": "<cores>",
    "recipe": "RECIPE",
    "workers": "<training workers>",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Ray's daemons and workers under `ray start --block`)."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            queue += children
    return found


class LocalNode:
    """One Ray node started by `ray start --block` in a session of its own, under the private temp
    dir `temp`; `stop` ends exactly the processes this node started (its descendants that still
    name `temp` on their command line), never another Ray on the machine."""

    def __init__(self, command: str, extra: list[str], log: Path, temp: Path):
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_USAGE_STATS_ENABLED": "0"}
        argv = [str(BIN / "ray"), *command.split()[1:], "--block", *extra]
        self.log, self.temp = log.open("w"), str(temp)
        self.process = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def stop(self) -> None:
        started = descendants(self.process.pid)
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        for pid in started:
            with contextlib.suppress(OSError):  # gone already
                if self.temp in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    os.kill(pid, signal.SIGKILL)
        self.log.close()


def agent_ports() -> list[str]:
    """Two nodes on one machine must not share their agents' default ports."""
    return [
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--metrics-export-port={free_port()}",
    ]


def wait_for_nodes(address: str, count: int, timeout_s: float = 120.0) -> None:
    """Until `count` nodes are alive. A head just started may not serve its GCS yet (on a loaded
    machine `ray.init` then raises from `_init_gcs_client`), so each attempt is a fresh driver and a
    failed one is retried until the deadline; the last failure is the assertion's message."""
    script = (
        "import ray, sys, time\n"
        f"ray.init(address={address!r}, log_to_driver=False)\n"
        f"while sum(n['Alive'] for n in ray.nodes()) < {count}:\n"
        "    time.sleep(0.5)\n"
    )
    deadline, failure = time.monotonic() + timeout_s, "no attempt finished"
    while time.monotonic() < deadline:
        try:
            done = subprocess.run(
                [sys.executable, "-c", script],
                capture_output=True,
                text=True,
                timeout=max(deadline - time.monotonic(), 1.0),
            )
        except subprocess.TimeoutExpired as timeout:
            err = timeout.stderr or b""  # bytes here even with text=True
            err = err.decode(errors="replace") if isinstance(err, bytes) else err
            failure = f"nodes not alive after {timeout_s:.0f} s: {err[-3000:]}"
            break
        if done.returncode == 0:
            return
        failure = (done.stdout[-1500:] + done.stderr[-1500:]) or f"exit code {done.returncode}"
        time.sleep(2.0)
    raise AssertionError(f"{count} Ray node(s) at {address}: {failure}")


@pytest.fixture
def two_nodes(tmp_path):
    """A head and a second node, one CPU each, on 127.0.0.1 with private temp dirs; torn down always."""
    port, temp = free_port(), Path(tempfile.mkdtemp(prefix="srl-2n-", dir="/tmp"))  # short socket paths
    values = {"head_ip": "127.0.0.2", "node_ip": "127.0.0.3", "port": port, "cpus": 1}
    nodes = []
    try:
        private = ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp / 'head'}"]
        nodes.append(
            LocalNode(HEAD.format(**values), [*private, *agent_ports()], tmp_path / "head.log", temp)
        )
        wait_for_nodes(f"127.0.0.2:{port}", 1)
        second = ["--disable-usage-stats", f"--temp-dir={temp / 'node'}", *agent_ports()]
        nodes.append(LocalNode(NODE.format(**values), second, tmp_path / "node.log", temp))
        wait_for_nodes(f"127.0.0.2:{port}", 2)
        yield values
        pids = [pid for node in nodes for pid in [node.process.pid, *descendants(node.process.pid)]]
        outward = [a for a in listening_addresses(pids) if not a.startswith("127.")]
        # Ray's own daemons bind some gRPC ports on every interface when the node address is not
        # exactly 127.0.0.1 (ray-project/ray#65867); what the run started must stay on loopback.
        ours = [a for a in outward if not any(daemon in a for daemon in RAY_DAEMONS)]
        assert not ours, f"the run's processes listen beyond loopback: {ours}"
    finally:
        for node in reversed(nodes):
            node.stop()
        left = [pid for pid in leftovers(temp) if pid != os.getpid()]
        for pid in left:  # ours: they run under this test's private temp dir
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"Ray processes outlived their node: {left}"


RAY_DAEMONS = ("/raylet/raylet ", "/gcs/gcs_server ")


def listening_addresses(pids: list[int]) -> list[str]:
    """The local addresses of the TCP sockets `pids` listen on (/proc/net/tcp and tcp6), each with
    the command of the process that holds it."""
    inodes: dict[str, str] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = f"pid {pid}: {command}"
    addresses = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            host, port = local.split(":")
            if table == "tcp":
                ip = _ipv4(host)
            elif host.startswith("0000000000000000FFFF0000"):  # ::ffff:a.b.c.d, an IPv4 address
                ip = _ipv4(host[24:])
            else:  # ::1 is loopback; anything else is reported by its raw form
                ip = "127.0.0.1" if host == "00000000000000000000000001000000" else f"[{host}]"
            addresses.append(f"{ip}:{int(port, 16)} ({inodes[inode]})")
    return addresses


def _ipv4(little_endian_hex: str) -> str:
    return ".".join(str(int(little_endian_hex[i : i + 2], 16)) for i in (6, 4, 2, 0))


def leftovers(temp: Path) -> list[int]:
    """Processes whose command line names the private temp dir (none, once the nodes stopped)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if str(temp) in cmdline.read_bytes().decode(errors="replace"):
                found.append(int(cmdline.parent.name))
    return found


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md"])
def test_the_docs_give_the_commands_this_test_runs(doc):
    text = (ROOT / doc).read_text()
    for template in (HEAD, NODE, DRIVER):
        assert template.format(**DOC_VALUES) in text, template


@pytest.mark.ray
@pytest.mark.slow
def test_grpo_steps_run_with_a_training_rank_on_each_node(task, two_nodes, tmp_path):
    run_dir = tmp_path / "run"
    driver = DRIVER.format(**two_nodes, recipe=RECIPE, workers=2).split()
    overrides = [
        f"data.train_files=['{task['train']}']",
        f"data.val_files=['{task['test']}']",
        f"model.path={task['model']}",
        f"trainer.run_dir={run_dir}",
        "trainer.total_steps=2",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "data.prompts_per_step=4",
        "rollout.n=2",
        "rollout.max_response_tokens=6",
        "actor.prompts_per_mini_batch=2",
        "actor.trajectories_per_micro_batch=4",
        "cluster.call_timeout_s=300",
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    done = subprocess.run(
        [str(BIN / driver[0]), *driver[1:], *overrides], capture_output=True, text=True, env=env, timeout=900
    )
    print(f"\ntwo-node run: {time.monotonic() - start:.1f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    placement = json.loads((run_dir / "placement.json").read_text())
    print(f"placement: {placement}")
    assert len(placement["actor"]) == 2 and len(set(placement["actor"])) == 2  # one rank per node
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2] and train[-1]["rollout/weight_version"] == 2.0
    assert all(r["controller/sent_bytes"] > 0 for r in train)
    assert (run_dir / "final" / "config.json").is_file()
