"""Rank-0 output echo: each distinct framework warning once per sweep, the log keeps everything."""

from __future__ import annotations

import io
import warnings

from runner.sweep import spawn as launch
from runner.world.worker import one_line_warning


def test_each_distinct_warning_is_echoed_once(capsys):
    output = (
        b"step 1\n"
        b"[warning] UserWarning: echo-once test (a.py:1)\n"
        b"[warning] UserWarning: echo-once test (a.py:1)\n"
        b"[W1202 10:00:00.100 123 gloo.cpp:9] echo-once slow path\n"
        b"[W1202 10:00:01.200 456 gloo.cpp:9] echo-once slow path\n"
        b"step 2\n"
    )
    log = io.BytesIO()
    launch._echo(io.BytesIO(output), log)
    shown = capsys.readouterr().out
    assert shown.count("echo-once test") == 1
    assert shown.count("echo-once slow path") == 1
    assert shown.startswith("step 1\n") and shown.endswith("step 2\n")
    assert log.getvalue() == output


def test_warnings_of_a_rank_take_one_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("collective is slow", UserWarning, stacklevel=1)
    w = caught[0]
    line = one_line_warning(w.message, w.category, w.filename, w.lineno)
    assert line == f"[warning] UserWarning: collective is slow (test_launch.py:{w.lineno})\n"
