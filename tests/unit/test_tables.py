"""Text for people and pipes: escaped control characters, whole values, dated times."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console
from rich.text import Text

from dagq.cli.inspect import when
from dagq.cli.tables import Listing, printable, printable_bytes
from dagq.transitions import upstream_error


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2Jcleared", "\\x1b[2Jcleared"),
        ("nul\x00byte", "nul\\x00byte"),
        ("bell\x07 del\x7f c1\x9b", "bell\\x07 del\\x7f c1\\x9b"),
        ("right-to-left \u202eevil", "right-to-left \\u202eevil"),
        ("line\u2028separator", "line\\u2028separator"),
        ("carriage\rreturn", "carriage\\rreturn"),
        ("tab\tand\nnewline stay", "tab\tand\nnewline stay"),
        ("plain text, accents: é ü 漢字", "plain text, accents: é ü 漢字"),
    ],
)
def test_printable_escapes_control_characters_and_keeps_text(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_a_table_cell_keeps_to_one_line() -> None:
    assert printable("a\tb\nc", one_line=True) == "a\\tb\\nc"


def test_bytes_that_are_not_utf8_are_shown_as_hex_escapes() -> None:
    assert printable_bytes(b"\xff\xfe ok \xc3\xa9 \x1b") == "\\xff\\xfe ok é \\x1b"


def test_a_listing_piped_is_a_header_and_tab_separated_rows_with_whole_values() -> None:
    long = "x" * 500
    table = Listing(["id", "state", "error"])
    table.add_row(long, Text("failed", style="red"), "bad\x1b[31m\tthing\nmore")
    out = io.StringIO()

    table.print(Console(file=out, width=40, force_terminal=False))

    assert out.getvalue().splitlines() == [
        "id\tstate\terror",
        f"{long}\tfailed\tbad\\x1b[31m\\tthing\\nmore",
    ]


def test_a_listing_on_a_terminal_folds_values_instead_of_cutting_them() -> None:
    table = Listing(["id", "state"])
    table.add_row("a-very-long-identifier-of-a-run", Text("upstream_failed", style="red"))
    out = io.StringIO()

    table.print(Console(file=out, width=24, force_terminal=True, color_system=None))

    shown = out.getvalue()
    assert "…" not in shown
    cells = [line.split("│")[1:3] for line in shown.splitlines() if line.startswith("│")]
    assert "".join(c[0].strip() for c in cells) == "a-very-long-identifier-of-a-run"
    assert "".join(c[1].strip() for c in cells) == "upstream_failed"


def test_a_listing_refuses_a_row_of_the_wrong_width() -> None:
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        Listing(["a", "b", "c"]).add_row("1", "2")


def test_times_of_today_are_times_of_day_and_older_ones_carry_the_date() -> None:
    now = time.time()
    two_days_ago = now - 2 * 86_400

    assert len(when(now)) == len("12:34:56.789")
    assert when(two_days_ago) == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(two_days_ago))
    assert when(None) == "-"


@pytest.mark.parametrize(
    ("failed", "error"),
    [
        (["a"], "parent task did not succeed: a"),
        (["a", "b", "c"], "3 parent tasks did not succeed: a, b, c"),
        (
            [f"t{k}" for k in range(8)],
            "8 parent tasks did not succeed: t0, t1, t2, t3, t4 and 3 more",
        ),
    ],
)
def test_an_upstream_failed_error_names_the_failed_parents_then_counts(
    failed: list[str], error: str
) -> None:
    assert upstream_error(failed) == error
