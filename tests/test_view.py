"""`drlc view` on a run that lacks a table it reads: one line naming the table (the page itself:
tests/test_view_browser.py, in a real browser)."""
import shutil

from inprocess import drlc
from test_view_browser import make_run


def test_a_run_without_annotations_stops_with_one_line_naming_the_table(tmp_path):
    """Was DuckDB's 'Python Object "annotations" of type _Feature ... not suitable for replacement scans':
    the view's SQL found `from __future__ import annotations` in the module instead of the missing table."""
    make_run(tmp_path)
    shutil.rmtree(tmp_path / "data" / "annotations")
    done = drlc(["view", str(tmp_path)], tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "No annotations table under" in done.stderr and "drlc view RUN" in done.stderr
