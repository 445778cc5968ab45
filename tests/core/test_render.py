"""Output for people (core/render.py, core/units.py): rich on a terminal, plain text
everywhere else, and one unit system for sizes.

Tables, the top screen and progress bars are drawn by rich; a pipe, a file, ``NO_COLOR``
or ``TERM=dumb`` get plain columns with no escape codes and no line cut to a width, so
scripts that read the output keep working.  Real terminals here are pseudo-terminals.
"""

from __future__ import annotations

import io
import os
import re
import select
from collections.abc import Iterator

import pytest

from fleetstore.core.render import Bar, table, use_color
from fleetstore.core.units import size

ESCAPE = re.compile(r"\x1b\[")
COLUMNS = ("name", "rows", "note")
ROWS = [("sessions", "1,000", "x" * 300), ("applied_ops", "20,200", "ok")]


MASTERS: dict[int, int] = {}


@pytest.fixture
def terminal() -> Iterator[io.TextIOWrapper]:
    """A pseudo-terminal's slave end as a text stream (isatty() is True); what is
    written to it is read from ``MASTERS[stream.fileno()]``."""
    master, slave = os.openpty()
    stream = open(slave, "w", encoding="utf-8", closefd=True)  # noqa: SIM115
    MASTERS[slave] = master
    try:
        yield stream
    finally:
        del MASTERS[slave]
        stream.close()
        os.close(master)


@pytest.fixture(autouse=True)
def colour_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")


def test_a_table_for_a_pipe_is_plain_aligned_and_never_cut() -> None:
    text = table(COLUMNS, ROWS, right={"rows"}, stream=io.StringIO())
    assert not ESCAPE.search(text) and "─" not in text and "│" not in text
    lines = text.splitlines()
    assert lines[0].split() == ["name", "rows", "note"]
    assert "x" * 300 in lines[1]  # no width: a long cell is whole
    # Right-aligned numbers end in the same column as their header.
    cells = ("rows", "1,000", "20,200")
    ends = {line.index(cell) + len(cell) for line, cell in zip(lines, cells, strict=True)}
    assert len(ends) == 1
    assert all(line.startswith("  ") for line in lines)  # the indent


def test_a_table_on_a_terminal_is_styled_and_fitted_to_it(terminal: io.TextIOWrapper) -> None:
    assert use_color(terminal)
    text = table(COLUMNS, ROWS, stream=terminal)
    assert "\x1b[1m" in text  # a bold header
    assert "x" * 300 not in text  # cut to the terminal's width, with an ellipsis
    assert "…" in text


@pytest.mark.parametrize(("var", "value"), [("NO_COLOR", "1"), ("TERM", "dumb")])
def test_no_color_or_a_dumb_terminal_get_plain_text(
    terminal: io.TextIOWrapper, monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    assert not use_color(terminal)
    text = table(COLUMNS, ROWS, stream=terminal)
    assert not ESCAPE.search(text) and "x" * 300 in text


def test_a_progress_bar_draws_nothing_off_a_terminal() -> None:
    out = io.StringIO()
    bar = Bar(out)
    assert not bar.enabled
    bar.update("copy", 5, 10)
    bar.close()
    assert out.getvalue() == ""
    bar.print("a line that stays")
    assert out.getvalue() == "a line that stays\n"


def test_a_progress_bar_on_a_terminal_is_drawn(terminal: io.TextIOWrapper) -> None:
    bar = Bar(terminal)
    assert bar.enabled
    bar.update("copying", 5, 10, "5 of 10")
    bar.close()
    terminal.flush()
    master, drawn = MASTERS[terminal.fileno()], b""
    while select.select([master], [], [], 0.2)[0]:
        drawn += os.read(master, 65536)
    assert b"copying" in drawn and b"50%" in drawn and b"5 of 10" in drawn


def test_sizes_are_iec() -> None:
    assert [size(n) for n in (0, 1023, 1024, 64 * 1024, 49_000, 64 << 20, 3 << 30)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "64.0 KiB",
        "47.9 KiB",
        "64.0 MiB",
        "3.0 GiB",
    ]
