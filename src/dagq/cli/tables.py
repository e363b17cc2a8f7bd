"""Tables and text for people and for pipes, with nothing dropped and nothing raw.

On a terminal a listing is a rich table: coloured, and a long value folds onto the next
line rather than being cut to an ellipsis. Piped (``dagq list | grep failed``) the same
listing is plain text: a header line, then one line per row, the cells separated by tabs,
every value whole, no colour and no box characters.

Text that came from outside (task names, errors, outputs, a damaged message's body) is
passed through :func:`printable` first: a control character is shown as its escape
(``\\x1b``, ``\\x00``), so what is printed can never move the cursor, recolour the
terminal or hide the rest of a line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeAlias

import msgspec
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from dagq.cli.printable import printable, printable_bytes, printable_json

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


def out_console() -> Console:
    """stdout for people: colours on a terminal; piped, plain lines never wrapped."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console.soft_wrap = True
    return console


Cell: TypeAlias = str | Text
#: Columns of free text: on a narrow terminal they fold first.
FREE_TEXT = frozenset({"error", "detail", "reason", "what", "tasks", "states", "name"})
#: On a terminal, a value of another column up to this wide is kept on one line.
KEPT_WIDTH = 40
#: The room left for each free-text column before short values are kept whole.
FREE_MIN_WIDTH = 16


@dataclass(slots=True)
class Listing:
    """Rows under named columns: a rich table on a terminal, tab-separated lines piped.

    ``right`` names the columns aligned right on a terminal (numbers). A cell is text, or
    a rich ``Text`` for its style; either way its value is shown whole and printable.
    """

    columns: Sequence[str]
    title: str | None = None
    right: frozenset[str] = frozenset()
    rows: list[list[Cell]] = field(default_factory=list)

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

    def rich_table(self, width: int | None = None) -> Table:
        """The terminal form (``width`` columns wide): every column folds a long value
        rather than cutting it. Short values (ids, states, times, counts) keep their
        width while the terminal has room, the first column and the state first; free
        text (errors, details) is what folds when it is narrow."""
        table = Table(title=self.title and printable(self.title), title_justify="left")
        cells = [[_styled(cell) for cell in row] for row in self.rows]
        kept = self._kept_widths(cells, width)
        for k, name in enumerate(self.columns):
            table.add_column(
                name,
                overflow="fold",
                justify="right" if name in self.right else "left",
                min_width=kept.get(k),
                # Kept whole: never squeezed by rich (which would fold it after all).
                no_wrap=k in kept,
            )
        for row in cells:
            table.add_row(*row)
        return table

    def _kept_widths(self, cells: list[list[Text]], width: int | None) -> dict[int, int]:
        free = [k for k, name in enumerate(self.columns) if name in FREE_TEXT]
        budget = (width or 1_000_000) - 3 * len(self.columns) - 1 - FREE_MIN_WIDTH * len(free)
        first = [0] + [k for k, name in enumerate(self.columns) if name in ("state", "status")]
        order = list(dict.fromkeys([*first, *range(len(self.columns))]))
        kept: dict[int, int] = {}
        for k in order:
            if k in free:
                continue
            longest = max(
                (cell_len(line) for row in cells for line in row[k].plain.split("\n")), default=0
            )
            wanted = max(cell_len(self.columns[k]), longest)
            if wanted <= min(budget, KEPT_WIDTH):
                kept[k] = wanted
                budget -= wanted
        return kept


def _plain(cell: Cell) -> str:
    return printable(cell.plain if isinstance(cell, Text) else cell, one_line=True)


def _styled(cell: Cell) -> Text:
    if isinstance(cell, Text):
        safe = printable(cell.plain)
        return cell if safe == cell.plain else Text(safe, style=cell.style)
    return Text(printable(cell))


#: One part of a command's output: a line (or lines) of text, a listing, or something
#: only a terminal shows (a progress bar, left out when piped).
Part: TypeAlias = "Text | Listing | RenderableType"


def show(console: Console, parts: Sequence[Part]) -> None:
    """Print the parts: as rich renderables on a terminal; piped, as plain lines written
    as they are (never wrapped, tabs kept), every value printable."""
    if console.is_terminal:
        console.print(rendered(parts, console.width))
        return
    for part in parts:
        if isinstance(part, Listing):
            plain_out(console, *part.plain_lines())
        elif isinstance(part, Text):
            plain_out(console, printable(part.plain))
        elif isinstance(part, str):
            plain_out(console, printable(part))


def plain_out(console: Console, *lines: str) -> None:
    """Write lines to the console's file as they are (no wrapping, no tab expansion)."""
    console.file.write("".join(line + "\n" for line in lines))
    console.file.flush()


def rendered(parts: Sequence[Part], width: int | None = None) -> Group:
    """The parts as one rich renderable for a terminal ``width`` columns wide (or a
    live display)."""
    return Group(*(_rich(part, width) for part in parts))


def _rich(part: Part, width: int | None) -> RenderableType:
    if isinstance(part, Listing):
        return part.rich_table(width)
    if isinstance(part, Text):
        return _styled(part)
    if isinstance(part, str):
        return Text(printable(part))
    return part
