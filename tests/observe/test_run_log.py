"""The run log: files rewritten atomically (the old one survives a failed rewrite), tables never cut."""

import io

import pytest
from rich.console import Console

from stratarl.observe.run_log import RunLog, replace_atomically, write_atomically


def test_a_rewrite_that_fails_leaves_the_old_file_whole(tmp_path):
    path = write_atomically(tmp_path / "summary.json", "old\n")
    with pytest.raises(RuntimeError), replace_atomically(path) as f:
        f.write("half of the new")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old\n" and not list(tmp_path.glob("*.tmp"))
    write_atomically(path, "new\n")
    assert path.read_text() == "new\n"


def test_the_summary_table_never_cuts_a_path_or_a_metric_name(tmp_path):
    """Was: an 80-column console cut the table (`final weights │ .../sort_grp…`)."""
    out = io.StringIO()
    log = RunLog(tmp_path, console=Console(file=out, width=80))
    path = "/runs/" + "a_long_project_name/" * 6 + "final"
    metric = "val-core/sort_numbers_with_a_long_data_source_name/acc/mean@1"
    log.print_table("run summary", {"final weights": path, metric: 0.875})
    text = out.getvalue()
    assert path in text and metric in text and "…" not in text
    short = io.StringIO()
    RunLog(tmp_path, console=Console(file=short, width=80)).print_table("s", {"a": "b"})
    assert max(len(line) for line in short.getvalue().splitlines()) < 20  # no padding to the width
