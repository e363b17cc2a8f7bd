"""How values are judged and described: truth, kinds in the words of JSON, short reprs."""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any

NUMBERS = (int, float)
SEQUENCES = (list, tuple)
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 40
_repr.maxlist = _repr.maxtuple = _repr.maxdict = 5


def truthy(value: Any) -> bool:
    """Whether a value counts as true: null, false, 0, "", [] and {} do not."""
    return bool(value)


def kind_of(value: Any) -> str:
    """A value's type in the words of JSON, for messages."""
    if value is None:
        return "null"
    for types, name in _KINDS:
        if isinstance(value, types):
            return name
    return type(value).__name__


_KINDS: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "bool"),
    (int, "int"),
    (float, "float"),
    (str, "string"),
    (SEQUENCES, "list"),
    (Mapping, "mapping"),
)


def show(value: Any) -> str:
    """A value's repr, shortened for messages."""
    return _repr.repr(value)
