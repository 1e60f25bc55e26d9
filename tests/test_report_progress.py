"""Progress in a log: when output is not a terminal (a GPU host's lane file), the spinner would show
nothing, so each step of the top-level work is one line, and the gate's inner stages stay quiet."""

from __future__ import annotations

from klineage import report


def test_a_log_gets_one_line_per_top_level_step(capsys):
    assert not report.console.is_terminal  # pytest captures the output: as a lane file does
    with report.progress_display() as progress:
        progress("walk", "step 3: accepted unroll at k#0")
        progress("compile", "nvcc")  # a gate stage inside the step
        progress("admit", "[2/27] ldg: 2 trial(s)")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("walk: step 3: accepted unroll at k#0") and lines[0].startswith("[")
    assert lines[1].endswith("admit: [2/27] ldg: 2 trial(s)")


def test_a_disabled_display_prints_nothing(capsys):
    with report.progress_display(enabled=False) as progress:
        progress("walk", "step 0")
    assert capsys.readouterr().out == ""
