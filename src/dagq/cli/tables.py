"""Tables and text for people and for pipes, with nothing dropped and nothing raw.

On a terminal a listing is a rich table: coloured, and a long value folds onto the next
line rather than being cut to an ellipsis. Piped (``dagq list | grep failed``) the same
listing is plain text: a header line, then one line per row, the cells separated by tabs,
every value whole, no colour and no box characters.

Text that came from outside (task names, errors, outputs, a damaged message's body) is
passed through :func:`printable` first: a control character is shown as its escape
(``\\x1b``, ``\\x00``), so what is printed can never move the cursor, recolour the
terminal or hide the rest of a line.

This module does not import rich: piped output is written here, and only drawing on a
terminal goes through :mod:`dagq.cli.terminal` (rich), imported by :func:`show` and
:func:`emit` when they draw.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any, TypeAlias

import msgspec

from dagq.cli.printable import printable, printable_bytes, printable_json
from dagq.cli.styled import Bar, Styled

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.text import Text

#: Also the names of dagq.cli.printable, re-exported: the commands took them from here.
__all__ = ["print_json", "printable", "printable_bytes", "printable_json", "when"]


def print_json(value: Any) -> None:
    """Stable JSON on stdout, one document."""
    print(msgspec.json.encode(value).decode())


def when(timestamp: float | None) -> str:
    """A local wall-clock time (just the time of day if today), or '-'."""
    if timestamp is None:
        return "-"
    moment = datetime.fromtimestamp(timestamp, UTC).astimezone()
    if moment.date() == datetime.now(UTC).astimezone().date():
        return moment.strftime("%H:%M:%S.%f")[:-3]
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def is_terminal() -> bool:
    """Whether stdout is drawn on, as rich decides it (``TTY_COMPATIBLE``, ``FORCE_COLOR``,
    then the file itself), without importing rich."""
    compatible = os.environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "1"
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None:
        return force_color != ""
    try:
        return sys.stdout.isatty()
    except ValueError:  # closed
        return False


Cell: TypeAlias = "str | Styled | Text"
#: Columns of free text: on a narrow terminal they fold first.
FREE_TEXT = frozenset({"error", "detail", "reason", "what", "tasks", "states", "name"})
#: On a terminal, a value of another column up to this wide is kept on one line.
KEPT_WIDTH = 40
#: The room left for each free-text column before short values are kept whole.
FREE_MIN_WIDTH = 16


class Listing(msgspec.Struct):
    """Rows under named columns: a rich table on a terminal, tab-separated lines piped.

    ``right`` names the columns aligned right on a terminal (numbers). A cell is text, or
    a rich ``Text`` for its style; either way its value is shown whole and printable.
    """

    columns: Sequence[str]
    title: str | None = None
    right: frozenset[str] = frozenset()
    rows: list[list[Cell]] = msgspec.field(default_factory=list)

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def print(self, console: Console) -> None:
        """Show the listing on ``console`` (a terminal or not, as it is)."""
        show(console, [self])

    def plain_lines(self) -> list[str]:
        """The title (if any), the header, then one line per row; cells tab-separated."""
        lines = [printable(self.title, one_line=True)] if self.title else []
        lines.append("\t".join(self.columns))
        lines += ["\t".join(_plain(cell) for cell in row) for row in self.rows]
        return lines


def _plain(cell: Cell) -> str:
    return printable(cell if isinstance(cell, str) else cell.plain, one_line=True)


#: One part of a command's output: a line (or lines) of text, a listing, a progress bar
#: (its count and timing, piped), or something only a terminal shows (left out piped).
Part: TypeAlias = "Styled | Text | Listing | Bar | RenderableType"


def show(console: Console, parts: Sequence[Part]) -> None:
    """Print the parts: drawn by rich on a terminal; piped, as plain lines written as
    they are (never wrapped, tabs kept), every value printable."""
    if console.is_terminal:
        from dagq.cli.terminal import draw  # rich draws; a pipe never needs it

        draw(console, parts)
        return
    write_lines(plain_lines(parts), console.file)


def emit(parts: Sequence[Part]) -> None:
    """:func:`show` on stdout, without making a rich console unless it draws."""
    if is_terminal():
        from dagq.cli.terminal import draw, out_console  # rich draws; a pipe never needs it

        draw(out_console(), parts)
        return
    write_lines(plain_lines(parts), sys.stdout)


def plain_lines(parts: Sequence[Part]) -> list[str]:
    """What the parts say piped: every value printable, terminal-only parts left out."""
    lines: list[str] = []
    for part in parts:
        if isinstance(part, Listing):
            lines += part.plain_lines()
        elif isinstance(part, str):
            lines.append(printable(part))
        elif isinstance(plain := getattr(part, "plain", None), str):  # Styled, Bar, Text
            lines.append(printable(plain))
    return lines


def plain_out(console: Console | PlainOut, *lines: str) -> None:
    """Write lines to the console's file as they are (no wrapping, no tab expansion)."""
    write_lines(lines, console.file)


class PlainOut:
    """A console that draws nothing (``dagq run --quiet``): what it is given to print is
    written as its plain text, a line each time, to ``file``; rich is not imported."""

    is_terminal = False

    def __init__(self, file: IO[str]) -> None:
        self.file = file

    def print(self, *parts: str | Styled) -> None:
        text = " ".join(part if isinstance(part, str) else part.plain for part in parts)
        write_lines([printable(text)], self.file)


def write_lines(lines: Sequence[str], file: IO[str]) -> None:
    """Write lines to ``file`` as they are, and flush."""
    file.write("".join(line + "\n" for line in lines))
    file.flush()
