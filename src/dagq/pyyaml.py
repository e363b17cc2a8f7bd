"""PyYAML, imported without its costliest line: ``from dagq.pyyaml import yaml``.

Importing ``yaml`` compiles, as its pure-Python reader's class is defined, the pattern
of the characters YAML does not allow (``yaml.reader.Reader.NON_PRINTABLE``): a negated
class whose ranges reach U+10FFFF, which ``re`` builds by walking some 63,000 code
points in Python — about 57 M instructions, a seventh of ``dagq validate``. dagq parses
with libyaml (``CSafeLoader``), which never uses that pattern.

So, before the first import, ``re``'s cache is given the pattern for that exact text:
the same set of characters written as what it leaves out (the controls, the surrogates,
U+FFFE and U+FFFF — ``tests/unit/test_pyyaml.py`` checks every code point), which
compiles in ~4.5 M. ``yaml.reader`` then gets a real compiled pattern matching exactly
what its own would; only its ``.pattern`` text differs. If ``yaml`` was imported
already, or ``re`` keeps its cache another way, nothing is done.
"""

from __future__ import annotations

import re
import sys

#: ``yaml.reader.Reader.NON_PRINTABLE``'s text, as PyYAML writes it.
YAML_NON_PRINTABLE = "[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
#: The same characters: every code point the class above does not leave out.
NON_PRINTABLE = "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]"


def _seed() -> None:
    cache = getattr(re, "_cache", None)
    if "yaml" in sys.modules or not isinstance(cache, dict):
        return
    cache.setdefault((str, YAML_NON_PRINTABLE, 0), re.compile(NON_PRINTABLE))


_seed()

import yaml  # noqa: E402  (after the seed, which is the point)

__all__ = ["yaml"]
