"""A process armed with faulthandler dumps every thread's stack on request, even while its main
thread sleeps in C; the controller copies each dump into the hang folder (plus py-spy's, if installed)."""

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stratarl.observe.stack_dumps import ArmedProcess, dump_armed


def test_an_armed_child_dumps_its_stacks_into_the_hang_folder(tmp_path):
    child = textwrap.dedent(f"""
        import json, sys, time
        from stratarl.observe.stack_dumps import arm_stack_dumps
        armed = arm_stack_dumps({str(tmp_path / "ranks")!r}, "actor", 1)
        print(json.dumps(armed), flush=True)
        def stuck_in_a_collective():
            time.sleep(60)
        stuck_in_a_collective()
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})  # fmt: skip
    try:
        armed = __import__("json").loads(proc.stdout.readline())
        time.sleep(0.3)
        process = ArmedProcess("actor", 1, armed["pid"], armed["path"])
        lines = dump_armed(
            [process], tmp_path / "event", "test dump", {1: "last call update_actor, no answer yet"}
        )
        (copied,) = (tmp_path / "event").glob("stacks-actor-rank1-pid*.txt")
        text = copied.read_text()
        assert "in stuck_in_a_collective" in text and "test dump" in text
        assert lines[0].startswith("actor rank 1 (last call update_actor, no answer yet)")
        if shutil.which("py-spy"):
            assert list((tmp_path / "event").glob("py-spy-actor-rank1-*.txt"))
    finally:
        proc.kill()
        proc.wait()
    gone = dump_armed([ArmedProcess("actor", 1, armed["pid"], armed["path"])], tmp_path / "after", "again")
    assert "no such process" in gone[0]


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed")
def test_py_spy_dump_names_the_frame():
    from stratarl.observe.stack_dumps import py_spy_dump

    proc = subprocess.Popen(
        [sys.executable, "-c", "import time\ndef waiting():\n    time.sleep(30)\nwaiting()"]
    )
    try:
        time.sleep(0.5)
        out = os.path.join(os.getcwd(), ".pytest-py-spy.txt")
        assert "written" in py_spy_dump(proc.pid, out)
        assert "waiting" in Path(out).read_text()
        os.remove(out)
    finally:
        proc.kill()
        proc.wait()
