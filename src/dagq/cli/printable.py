"""Text from outside made safe to print: every control character shown as its escape.

Kept apart from :mod:`dagq.cli.tables` (rich) so commands that print plain lines —
``dagq validate``, ``dagq run --quiet`` — do not import rich.
"""

from __future__ import annotations

import functools
import re

#: C0 and C1 control characters (but tab and newline), DEL, lone surrogates (bytes that
#: were not UTF-8), and the invisible marks that reorder or break a line (bidirectional
#: overrides and isolates, line and paragraph separators).
_UNPRINTABLE = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
)
#: Also a tab and a newline: a table cell stays one cell on one line.
_IN_CELL = "\t\n"


@functools.cache
def _pattern(one_line: bool) -> re.Pattern[str]:
    """The characters to escape, compiled at first use: a class this wide takes some
    5 M instructions to compile, and most commands print through one of the two."""
    return re.compile("[" + _UNPRINTABLE + (_IN_CELL if one_line else "") + "]")


_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (decoded with surrogateescape)
        code -= 0xDC00
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` with every control character escaped (``\\x1b``, ``\\x00``, ``\\u202e``).

    Newlines and tabs stay as they are, unless ``one_line`` (a table cell): then they are
    shown as ``\\n`` and ``\\t`` too.
    """
    return _pattern(one_line).sub(_escape, text)


def printable_json(text: str) -> str:
    """JSON text with every invisible mark that :func:`printable` escapes written as a
    JSON escape (``\\u202e``): the same JSON, safe on a terminal. (Such marks can only
    be inside strings, where a JSON escape means the same character.)"""
    return _pattern(False).sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def printable_bytes(data: bytes) -> str:
    """Bytes as text: UTF-8 where they are, every other byte and control as ``\\xNN``."""
    return printable(data.decode("utf-8", "surrogateescape"))
