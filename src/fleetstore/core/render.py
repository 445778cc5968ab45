"""Output for people: tables, live screens and progress bars, drawn by rich.

rich is loaded inside these functions only, never when the package or the
``fleetstore`` command is imported (tests/cli/test_startup.py).  Colour and
boxes only on a terminal: when the stream is not a terminal (a pipe, a file), or
``NO_COLOR`` is set (https://no-color.org), or ``TERM=dumb``, a table is plain
text, columns aligned with spaces, no escape codes and no line cut to a width, so
scripts that read it keep working; a progress bar is not drawn at all.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console


#: Control characters but tab and line feed, as the characters that picture them (one for
#: one, so a snippet's highlights stay where they were): C0 as U+2400.., DEL as U+2421, C1
#: (no pictures of their own) as U+FFFD.
_PICTURES = {
    **{c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)},
    0x7F: 0x2421,
    **{c: 0xFFFD for c in range(0x80, 0xA0)},
}


def printable(text: str) -> str:
    """*text* with its control characters shown as their pictures (ESC as "␛"): a
    title or a tool's output holding ``ESC [2J`` cleared the screen of whoever listed or
    read it, and could rewrite what the terminal showed before."""
    return text.translate(_PICTURES)


def is_terminal(stream: TextIO | None) -> bool:
    """Is *stream* a terminal a person reads (not a pipe, a file, or ``TERM=dumb``)?"""
    try:
        tty = stream is not None and stream.isatty()
    except (ValueError, OSError):  # closed, or not a real file
        tty = False
    return tty and os.environ.get("TERM") != "dumb"


def use_color(stream: TextIO | None) -> bool:
    """Styles (bold headers, colours) on *stream*: a terminal, and ``NO_COLOR`` unset."""
    return is_terminal(stream) and not os.environ.get("NO_COLOR")


def console(stream: TextIO, *, color: bool | None = None, width: int | None = None) -> Console:
    """A rich console writing to *stream*, styled if *color* (default:
    ``use_color(stream)``)."""
    from rich.console import Console

    styled = use_color(stream) if color is None else color
    return Console(
        file=stream,
        force_terminal=styled,
        no_color=not styled,
        color_system="standard" if styled else None,
        width=width,
        highlight=False,
        markup=False,
        emoji=False,
    )


def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    right: Collection[str] = (),
    indent: int = 2,
    stream: TextIO | None = None,
    styled: bool | None = None,
    width: int | None = None,
) -> str:
    """*rows* under *columns* as text for *stream* (default: standard output): on a
    terminal a rich table (bold header, fitted to its width); elsewhere plain
    columns two spaces apart, no line cut.  Columns named in *right* are
    right-aligned (numbers).  Every line is indented by *indent* spaces; a header
    of empty names is left out.  *styled* and *width* override what the stream says."""
    from rich import box
    from rich.table import Table

    target = sys.stdout if stream is None else stream
    styled = use_color(target) if styled is None else styled
    grid = Table(
        box=box.SIMPLE_HEAD if styled else None,
        show_header=any(columns),
        show_edge=False,
        pad_edge=False,
        padding=(0, 1) if styled else (0, 2, 0, 0),
        header_style="bold" if styled else "",
        highlight=False,
    )
    if width is None:
        width = _terminal_width(target) if styled else 1_000_000
    # On a terminal a line break inside a cell (a `python -c` program's command line, a
    # title) would make one row several lines: shown as spaces there.
    cells = [
        [printable(" ".join(str(c).split()) if styled else str(c)) for c in row] for row in rows
    ]
    caps = _text_caps(columns, cells, right, width - indent) if styled else {}
    for i, name in enumerate(columns):
        # One line a row (a process, a session): a cell too wide for the terminal is cut
        # with an ellipsis, never wrapped; plain output is never cut.  Only text columns
        # are cut (to ``caps``): left to rich, a long command line took its share from
        # every column, "BATCH" became "BAT…" and narrow columns went altogether.
        grid.add_column(
            name,
            justify="right" if name in right else "left",
            no_wrap=True,
            max_width=caps.get(i),
        )
    for row in cells:
        grid.add_row(*row)
    out = io.StringIO()
    console(out, color=styled, width=max(width - indent, 20)).print(grid)
    lines = [" " * indent + line.rstrip() for line in out.getvalue().splitlines()]
    return "\n".join(line for line in lines if line.strip())


def _text_caps(
    columns: Sequence[str], cells: list[list[str]], right: Collection[str], room: int
) -> dict[int, int]:
    """The widths to cut the text (not right-aligned) columns to, by index, so that the
    numbers keep theirs within *room* characters; none when everything fits."""
    natural = [
        max([len(name), *(len(row[i]) for row in cells if i < len(row))])
        for i, name in enumerate(columns)
    ]
    texts = [i for i, name in enumerate(columns) if name not in right]
    # Each column is padded by a space on either side and ruled off by one (box SIMPLE_HEAD).
    left = room - sum(w for i, w in enumerate(natural) if i not in texts) - 3 * len(columns)
    wanted = sum(natural[i] for i in texts)
    if not texts or wanted <= left:
        return {}
    return {i: max(len(columns[i]), 1, left * natural[i] // wanted) for i in texts}


def _terminal_width(stream: TextIO) -> int:
    """The terminal's columns ($COLUMNS first); 100 when it does not say (a
    pseudo-terminal made without a size reports 0)."""
    import shutil

    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"]) or 100
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        columns = 0
    return columns or shutil.get_terminal_size((100, 30)).columns or 100


class Bar:
    """One progress bar on *stream* (standard error by default), drawn by rich and
    redrawn in place, only when the stream is a terminal (``enabled``); elsewhere
    every call is a no-op and ``print`` writes a plain line."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = is_terminal(self.stream)
        self._progress: Any = None
        self._task: Any = None
        self._label = ""

    def update(self, label: str, done: float, total: float, note: str = "") -> None:
        """Show *label* (and *note*, which may change) at *done* of *total*; a new
        label starts a new bar (the previous one stays on screen, finished)."""
        if not self.enabled:
            return
        if self._progress is None:
            from rich.progress import (
                BarColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[note]}"),
                console=console(self.stream),
                transient=False,
            )
            self._progress.start()
        if label != self._label or self._task is None:
            if self._task is not None:
                self._progress.stop_task(self._task)  # its clock stops; it stays shown
            self._task = self._progress.add_task(
                label, total=max(total, 1), completed=done, note=note
            )
            self._label = label
        self._progress.update(self._task, completed=done, total=max(total, 1), note=note)

    def print(self, text: str) -> None:
        """A line that stays, above the bar."""
        if self._progress is not None:
            self._progress.console.print(text)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = self._task = None
            self._label = ""


__all__ = ["Bar", "console", "is_terminal", "table", "use_color"]
