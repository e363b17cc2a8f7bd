"""``dagq.pyyaml``: PyYAML imported with its non-printable pattern written the cheap way,
matching exactly the same characters."""

from __future__ import annotations

import re
import subprocess
import sys

from dagq.pyyaml import NON_PRINTABLE, YAML_NON_PRINTABLE


def test_the_two_patterns_match_the_same_code_points() -> None:
    every = "".join(map(chr, range(sys.maxunicode + 1)))

    theirs = [m.start() for m in re.compile(YAML_NON_PRINTABLE).finditer(every)]
    ours = [m.start() for m in re.compile(NON_PRINTABLE).finditer(every)]

    assert ours == theirs
    assert len(ours) == 2111  # the controls, the surrogates, U+FFFE, U+FFFF


CHECK = """
{importing}
import yaml.reader
print(repr(yaml.reader.Reader.NON_PRINTABLE.pattern))
try:
    yaml.safe_load("a: b\\x07c")
except yaml.reader.ReaderError as exc:
    print(exc)
"""


def check(importing: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", CHECK.format(importing=importing)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


def test_a_fresh_import_gets_the_cheap_pattern_and_reads_alike() -> None:
    """The pure-Python reader (``yaml.safe_load``) refuses a control character with
    PyYAML's own message either way; PyYAML's text is the one the cache was given."""
    plain = check("import yaml")
    ours = check("from dagq.pyyaml import yaml")

    assert plain[0] == repr(YAML_NON_PRINTABLE)
    assert ours[0] == repr(NON_PRINTABLE)
    assert (
        ours[1:]
        == plain[1:]
        == [
            "unacceptable character #x0007: special characters are not allowed",
            '  in "<unicode string>", position 4',
        ]
    )
