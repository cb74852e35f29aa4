"""Cutting a run's logs back to a checkpoint's step: the right records stay; a kill mid-rewrite loses none."""

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stratarl.observe.run_log import read_metrics
from stratarl.run_directory.checkpointing import should_save, truncate_logs

ROOT = Path(__file__).resolve().parents[2]


def test_truncate_keeps_the_steps_up_to_the_checkpoint_and_drops_a_cut_line(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "phase": p, "x": s}) for s in (1, 2, 3) for p in ("train", "val")]
    metrics.write_text("\n".join(lines) + '\n{"step": 4, "pha')  # the kill cut the last line
    (tmp_path / "trajectories.jsonl").write_text(
        "".join(json.dumps({"step": s, "uid": f"{s}-0"}) + "\n" for s in (1, 2, 3))
    )
    kept = truncate_logs(tmp_path, 2)
    assert [(r["step"], r["phase"]) for r in kept] == [(1, "train"), (1, "val"), (2, "train"), (2, "val")]
    assert read_metrics(metrics) == kept
    assert [r["step"] for r in read_metrics(tmp_path / "trajectories.jsonl")] == [1, 2]
    assert not list(tmp_path.glob("*.tmp"))


def test_should_save_every_freq_steps_and_at_the_end():
    assert [s for s in range(1, 8) if should_save(s, 7, 3)] == [3, 6, 7]
    assert not any(should_save(s, 7, 0) for s in range(1, 8))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_kill_during_the_rewrite_of_a_150_mb_log_leaves_the_whole_log(tmp_path):
    """The reported loss: SIGKILL while a resume shrank a 150 MB metrics.jsonl left it at 0 bytes."""
    metrics = tmp_path / "metrics.jsonl"
    with metrics.open("w") as f:  # 400k records of ~380 bytes, steps 1..400000
        for step in range(1, 400_001):
            f.write(json.dumps({"step": step, "phase": "train", "pad": "x" * 350}) + "\n")
    size, digest = metrics.stat().st_size, _sha256(metrics)
    assert size > 150e6
    code = (
        "from pathlib import Path; from stratarl.run_directory.checkpointing import truncate_logs; "
        f"truncate_logs(Path({str(tmp_path)!r}), 200_000)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    tmp = metrics.with_name("metrics.jsonl.tmp")
    deadline = time.monotonic() + 120
    # Kill once the rewrite has visibly begun: a file beside it, or (an in-place rewrite) a change.
    while not tmp.exists() and metrics.stat().st_size == size:
        assert proc.poll() is None, "the rewrite ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the rewrite finished before the kill: nothing was tested"
    assert metrics.stat().st_size == size and _sha256(metrics) == digest  # every line is still there

    kept = truncate_logs(tmp_path, 200_000)  # the next resume cuts it, completely
    assert len(kept) == 200_000 and kept[-1]["step"] == 200_000
    assert not tmp.exists()
    with metrics.open() as f:
        assert sum(1 for _ in f) == 200_000
