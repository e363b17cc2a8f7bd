"""The bounds that keep parsing and evaluation small, whatever the text or the values."""

from __future__ import annotations

from typing import Final

MAX_LENGTH: Final = 4096
MAX_DEPTH: Final = 64
MAX_NODES: Final = 1000
MAX_INT: Final = 2**63
MAX_SIZE: Final = 1_000_000
