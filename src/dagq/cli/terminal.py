"""Drawing on a terminal, with rich: tables that fold long values, styled lines, bars.

The only CLI module of the output path that imports rich (with the live displays of
``dagq run`` and ``dagq status --watch``): :mod:`dagq.cli.tables` hands its parts here
only when stdout is a terminal, so piped output never loads rich.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from dagq.cli.printable import printable
from dagq.cli.styled import Bar, Styled
from dagq.cli.tables import FREE_MIN_WIDTH, FREE_TEXT, KEPT_WIDTH, Cell, Listing, Part


def out_console() -> Console:
    """stdout for people: colours on a terminal; piped, plain lines never wrapped."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console.soft_wrap = True
    return console


def draw(console: Console, parts: Sequence[Part]) -> None:
    """Print the parts on a terminal."""
    console.print(rendered(parts, console.width))


def rendered(parts: Sequence[Part], width: int | None = None) -> Group:
    """The parts as one rich renderable for a terminal ``width`` columns wide (or a
    live display)."""
    return Group(*(_rich(part, width) for part in parts))


def rich_table(listing: Listing, width: int | None = None) -> Table:
    """The terminal form of a listing (``width`` columns wide): every column folds a
    long value rather than cutting it. Short values (ids, states, times, counts) keep
    their width while the terminal has room, the first column and the state first; free
    text (errors, details) is what folds when it is narrow."""
    table = Table(title=listing.title and printable(listing.title), title_justify="left")
    cells = [[_styled(cell) for cell in row] for row in listing.rows]
    kept = _kept_widths(listing.columns, cells, width)
    for k, name in enumerate(listing.columns):
        table.add_column(
            name,
            overflow="fold",
            justify="right" if name in listing.right else "left",
            min_width=kept.get(k),
            # Kept whole: never squeezed by rich (which would fold it after all).
            no_wrap=k in kept,
        )
    for row in cells:
        table.add_row(*row)
    return table


def _kept_widths(
    columns: Sequence[str], cells: list[list[Text]], width: int | None
) -> dict[int, int]:
    free = [k for k, name in enumerate(columns) if name in FREE_TEXT]
    budget = (width or 1_000_000) - 3 * len(columns) - 1 - FREE_MIN_WIDTH * len(free)
    first = [0] + [k for k, name in enumerate(columns) if name in ("state", "status")]
    order = list(dict.fromkeys([*first, *range(len(columns))]))
    kept: dict[int, int] = {}
    for k in order:
        if k in free:
            continue
        longest = max(
            (cell_len(line) for row in cells for line in row[k].plain.split("\n")), default=0
        )
        wanted = max(cell_len(columns[k]), longest)
        if wanted <= min(budget, KEPT_WIDTH):
            kept[k] = wanted
            budget -= wanted
    return kept


def _styled(cell: Cell) -> Text:
    if isinstance(cell, Styled):
        cell = cell.__rich__()
    if isinstance(cell, Text):
        safe = printable(cell.plain)
        return cell if safe == cell.plain else Text(safe, style=cell.style)
    return Text(printable(cell))


def _rich(part: Part, width: int | None) -> RenderableType:
    if isinstance(part, Listing):
        return rich_table(part, width)
    if isinstance(part, Bar):
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")  # what it waits for is never cut short
        grid.add_row(
            ProgressBar(total=max(part.total, 1), completed=part.done, width=40),
            Text(part.count),
            Text(part.timing, style="dim"),
        )
        return grid
    if isinstance(part, Styled | Text | str):
        return _styled(part)
    return part
