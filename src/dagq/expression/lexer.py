"""Text to tokens: numbers, strings, names and operators, each with its position."""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from dagq.expression.failures import ParseFailure
from dagq.expression.limits import MAX_INT


class Token(msgspec.Struct, frozen=True):
    """One token of the text, where it starts, and the text it was read from."""

    kind: str  # "num", "str", "name", "op" or "end"
    value: Any
    pos: int
    text: str


_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_TWO_CHAR = frozenset({"==", "!=", "<=", ">=", "//"})
_ONE_CHAR = frozenset("<>+-*/%()[],.")
_REFUSED = {
    "**": "the '**' operator is not supported",
    "&&": "use 'and'",
    "||": "use 'or'",
    "=": "use '==' to compare",
    "!": "use 'not'",
    "&": "use 'and'",
    "|": "use 'or'",
}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "a": "\a", "b": "\b", "f": "\f"}
_ESCAPES |= {"v": "\v", "\\": "\\", "'": "'", '"': '"', "\n": ""}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``, ending with an "end" token; raises ParseFailure."""
    tokens: list[Token] = []
    pos, end = 0, len(text)
    while pos < end:
        char = text[pos]
        if char in " \t\r\n":
            pos += 1
        elif char in "0123456789":
            pos = _read_number(text, pos, tokens)
        elif char in "'\"":
            pos = _read_string(text, pos, tokens)
        elif char == "_" or char.isalpha():
            stop = pos + 1
            while stop < end and (text[stop] == "_" or text[stop].isalnum()):
                stop += 1
            tokens.append(Token("name", text[pos:stop], pos, text[pos:stop]))
            pos = stop
        else:
            pos = _read_operator(text, pos, tokens)
    tokens.append(Token("end", None, end, ""))
    return tokens


def _read_operator(text: str, pos: int, tokens: list[Token]) -> int:
    two = text[pos : pos + 2]
    if two in _TWO_CHAR:
        tokens.append(Token("op", two, pos, two))
        return pos + 2
    for bad in (two, text[pos]):
        if bad in _REFUSED:
            raise ParseFailure(f"unexpected '{bad}' ({_REFUSED[bad]})", pos)
    if text[pos] in _ONE_CHAR:
        tokens.append(Token("op", text[pos], pos, text[pos]))
        return pos + 1
    raise ParseFailure(f"unexpected character {text[pos]!r}", pos)


def _read_number(text: str, pos: int, tokens: list[Token]) -> int:
    match = _NUMBER.match(text, pos)
    assert match is not None
    literal = match.group()
    value: int | float
    if match.group(1) or match.group(2):
        value = float(literal)
        if not math.isfinite(value):
            raise ParseFailure(f"number {literal} is too large", pos)
    else:
        digits = literal.lstrip("0") or "0"
        value = int(digits) if len(digits) <= 20 else MAX_INT + 1
        if value > MAX_INT:
            raise ParseFailure("integer is too large (the limit is 2**63)", pos)
    tokens.append(Token("num", value, pos, literal))
    return match.end()


def _read_string(text: str, pos: int, tokens: list[Token]) -> int:
    quote, parts, i = text[pos], [], pos + 1
    while True:
        stop = min(_find(text, quote, i), _find(text, "\\", i))
        if stop >= len(text):
            raise ParseFailure("unterminated string", pos)
        parts.append(text[i:stop])
        if text[stop] == quote:
            tokens.append(Token("str", "".join(parts), pos, text[pos : stop + 1]))
            return stop + 1
        i = _read_escape(text, stop, parts)


def _find(text: str, char: str, start: int) -> int:
    found = text.find(char, start)
    return len(text) if found < 0 else found


def _read_escape(text: str, pos: int, parts: list[str]) -> int:
    code = text[pos + 1 : pos + 2]
    if code in _ESCAPES:
        parts.append(_ESCAPES[code])
        return pos + 2
    if code in _HEX_DIGITS:
        width = _HEX_DIGITS[code]
        digits = text[pos + 2 : pos + 2 + width]
        if len(digits) != width or any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise ParseFailure(f"invalid \\{code} escape (needs {width} hex digits)", pos)
        point = int(digits, 16)
        if point > 0x10FFFF or 0xD800 <= point <= 0xDFFF:
            raise ParseFailure(f"invalid \\{code} escape: not a character", pos)
        parts.append(chr(point))
        return pos + 2 + width
    parts.append(text[pos : pos + 2])  # like Python, an unknown escape is kept as written
    return pos + 2
